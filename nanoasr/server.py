"""OpenAI-compatible transcription server: POST /v1/audio/transcriptions, GET /v1/models, GET /health.

One model in memory; requests run one at a time, in arrival order, on a single worker thread. A request
takes its queue slot before its upload is read, so uploads in progress and jobs together never exceed the
queue; when it is full new requests get 503 with Retry-After. Errors use OpenAI's envelope, and bad input
is always a 4xx (the official client retries 5xx). FastAPI and uvicorn come with the `server` extra.
"""

import argparse
import asyncio
import gzip
import json
import math
import os
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from nanoasr.errors import AudioError, AudioTooLongError, NanoasrError, OptionError
from nanoasr.model.prompt import MAX_CONTEXT_CHARS

try:
    import fcntl
except ImportError:  # Windows: no flock, so abandoned upload directories are not swept
    fcntl = None

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
MEDIA_TYPES = {"text": "text/plain; charset=utf-8", "srt": "application/x-subrip; charset=utf-8",
               "vtt": "text/vtt; charset=utf-8"}
LANGUAGE_NAMES = {"zh": "chinese", "en": "english", "ja": "japanese"}
MODEL_ID = "fun-asr-nano"
TRANSCRIPTIONS = "/v1/audio/transcriptions"


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param=None, code=None,
                 headers=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(gzip.compress(data)) if data else 0.0


def verbose_json(transcript, language_code) -> dict:
    segments = [
        {"id": i, "seek": int(round(s.start * 100)), "start": s.start, "end": s.end, "text": s.text,
         "tokens": list(s.token_ids), "temperature": 0.0, "avg_logprob": s.avg_logprob,
         "compression_ratio": compression_ratio(s.text), "no_speech_prob": 0.0}
        for i, s in enumerate(x for x in transcript.segments if x.text)
    ]
    return {"task": "transcribe", "language": LANGUAGE_NAMES.get(language_code, "auto"),
            "duration": transcript.duration_s, "text": transcript.text, "segments": segments,
            "usage": {"type": "duration", "seconds": transcript.duration_s}}


FIELD_LIMIT = 64 * 1024  # bytes in one text field
MAX_FIELDS = 64
MAX_PROMPT_CHARS = MAX_CONTEXT_CHARS  # the `prompt` field is the library's context
DRAIN_FACTOR = 4  # read up to this many times the limit before answering 413, so the client sees the answer
UPLOADS_PREFIX = "nanoasr-uploads-"  # one directory per running server
UPLOAD_PREFIX = "nanoasr-upload-"  # one file per upload in progress
SUFFIX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


class UploadForm:
    """Streaming multipart/form-data reader: text fields in memory, the `file` part written to a temporary
    file in `upload_dir` as it arrives. The first problem found is kept in `problem`; the caller drains the
    rest of the body (bounded) and then answers with it, so the client is never cut off mid-upload."""

    def __init__(self, upload_dir, max_bytes: int):
        self.upload_dir, self.max_bytes = upload_dir, max_bytes
        self.fields: dict[str, list[str]] = {}
        self.path = self.filename = None
        self.file_bytes = 0
        self.problem: ApiError | None = None
        self.complete = False
        self._file = None
        self._headers: dict[bytes, bytes] = {}
        self._name = self._field = self._value = None

    def callbacks(self) -> dict:
        return {"on_part_begin": self._part_begin, "on_header_field": self._header_field,
                "on_header_value": self._header_value, "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
                "on_part_end": self._part_end, "on_end": self._end}

    def _part_begin(self):
        self._headers, self._field, self._value = {}, b"", b""

    def _header_field(self, data, start, end):
        self._field += data[start:end]

    def _header_value(self, data, start, end):
        self._value += data[start:end]

    def _header_end(self):
        self._headers[self._field.lower()] = self._value
        self._field, self._value = b"", b""

    def _headers_finished(self):
        from python_multipart.multipart import parse_options_header

        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        self._text = None
        if self._name == "file":
            if self.path is not None:
                return self._reject(ApiError(400, "only one 'file' part is accepted", param="file"))
            self.filename = options.get(b"filename", b"upload").decode("utf-8", "replace") or "upload"
            self._file = tempfile.NamedTemporaryFile(dir=self.upload_dir, prefix=UPLOAD_PREFIX,
                                                     suffix=upload_suffix(self.filename), delete=False)
            self.path = self._file.name
        elif b"filename" in options:
            pass  # a file under another name: not ours to read
        elif sum(len(v) for v in self.fields.values()) >= MAX_FIELDS:
            self._reject(ApiError(400, f"at most {MAX_FIELDS} form fields are accepted"))
        else:
            self._text = bytearray()

    def _part_data(self, data, start, end):
        if self.problem is not None:
            return
        if self._name == "file" and self._file is not None:
            self.file_bytes += end - start
            if self.file_bytes > self.max_bytes:
                return self._reject(too_large(self.max_bytes, self.file_bytes))
            self._file.write(data[start:end])
        elif self._text is not None:
            self._text += data[start:end]
            if len(self._text) > FIELD_LIMIT:
                self._reject(ApiError(400, f"form field {self._name!r} is longer than {FIELD_LIMIT} bytes",
                                      param=self._name))

    def _part_end(self):
        if self._name == "file" and self._file is not None:
            self._file.close()
            self._file = None
        elif self._text is not None and self.problem is None:
            try:
                self.fields.setdefault(self._name, []).append(self._text.decode("utf-8"))
            except UnicodeDecodeError:
                self._reject(ApiError(400, f"form field {self._name!r} is not UTF-8 text", param=self._name))
        self._text = None

    def _end(self):
        self.complete = True

    def _reject(self, problem: ApiError):
        if self.problem is None:
            self.problem = problem

    def discard(self):
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.path is not None:
            remove(self.path)
            self.path = None


def upload_suffix(filename: str) -> str:
    """The upload's extension, when it is a plain one: it tells the decoder the container."""
    suffix = os.path.splitext(filename)[1].lower()
    return suffix if 1 < len(suffix) <= 6 and set(suffix[1:]) <= SUFFIX_CHARS else ""


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def too_large(limit: int, size) -> ApiError:
    return ApiError(413, f"Maximum content size limit ({limit}) exceeded ({size} bytes read)",
                    code="file_too_large", param="file")


def upload_boundary(headers, max_bytes: int) -> bytes:
    """The multipart boundary, from the headers alone: a body that cannot be accepted is refused unread."""
    from python_multipart.multipart import parse_options_header

    ctype, options = parse_options_header(headers.get("content-type"))
    if ctype != b"multipart/form-data" or not options.get(b"boundary"):
        raise ApiError(400, "the request body must be multipart/form-data with a 'file' part; got "
                            f"{ctype.decode('latin-1') or 'no content type'}", param="file")
    length = headers.get("content-length", "")
    if length.isdigit() and int(length) > drain_limit(max_bytes):
        raise too_large(max_bytes, int(length))
    return options[b"boundary"]


def drain_limit(max_bytes: int) -> int:
    return DRAIN_FACTOR * max_bytes + FIELD_LIMIT


async def body_chunks(request, read_timeout_s: float):
    """The request body as it arrives; ApiError(408) when no bytes arrive for `read_timeout_s`."""
    from starlette.requests import ClientDisconnect

    while True:
        try:
            message = await asyncio.wait_for(request.receive(), read_timeout_s)
        except asyncio.TimeoutError:
            # the client is silent, so nothing unread is lost by closing the connection
            raise ApiError(408, f"no upload data arrived for {read_timeout_s:g} s (the server's read "
                                "timeout); the upload was discarded", code="read_timeout",
                           headers={"Connection": "close"}) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def read_upload(request, boundary: bytes, upload_dir: str, max_bytes: int,
                      read_timeout_s: float) -> UploadForm:
    """The request's form with its file part on disk; on bad input, ApiError (the temporary file removed)."""
    from python_multipart.exceptions import FormParserError
    from python_multipart.multipart import MultipartParser
    from starlette.requests import ClientDisconnect

    form = UploadForm(upload_dir, max_bytes)
    parser = MultipartParser(boundary, form.callbacks())
    seen = 0
    try:
        async for chunk in body_chunks(request, read_timeout_s):
            seen += len(chunk)
            if form.problem is None:
                parser.write(chunk)
            elif seen > drain_limit(max_bytes):
                break
        if form.problem is None:
            parser.finalize()
    except FormParserError as exc:
        form._reject(ApiError(400, f"malformed multipart body: {exc}"))
    except ClientDisconnect:
        form._reject(ApiError(400, "the client disconnected before the upload was complete"))
    except BaseException:
        form.discard()
        raise
    if form.problem is None and not form.complete:
        form._reject(ApiError(400, "the multipart body ended before its closing boundary"))
    if form.problem is not None:
        form.discard()
        if form.problem.status == 413:
            raise too_large(max_bytes, seen)
        raise form.problem
    return form


class UploadDir:
    """This server's own directory for uploads in progress, `nanoasr-uploads-<pid>-<random>` in `parent`.

    Several servers may share `parent` (the system's temporary directory, say). Each holds an flock on
    its directory while it runs, and the kernel drops it when the process ends, even by SIGKILL. So at
    start a server sweeps only directories whose lock is free: those of servers killed before they could
    clean up. `parent` must be on a local disk: flock is not reliable over network file systems.
    """

    def __init__(self, parent: str | None):
        self.parent = parent or tempfile.gettempdir()
        self.path = None
        self._lock_fd = None

    def open(self) -> None:
        if fcntl is not None:
            remove_abandoned(self.parent)
        hidden = tempfile.mkdtemp(prefix=f".{UPLOADS_PREFIX}{os.getpid()}-", dir=self.parent)
        if fcntl is not None:
            self._lock_fd = os.open(hidden, os.O_RDONLY)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        # renamed into the swept namespace only once locked, so another server starting now never sees
        # it unlocked
        self.path = os.path.join(self.parent, os.path.basename(hidden)[1:])
        os.rename(hidden, self.path)

    def close(self) -> None:
        remove_uploads_dir(self.path)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def remove_abandoned(parent: str) -> None:
    """Removes the upload directories in `parent` that no running server holds."""
    for entry in os.scandir(parent):
        if not (entry.name.startswith(UPLOADS_PREFIX) and entry.is_dir(follow_symlinks=False)):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue  # another user's, or gone already
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            remove_uploads_dir(entry.path)
        except OSError:
            pass  # locked by a running server, or not ours to remove
        finally:
            os.close(fd)


def remove_uploads_dir(path: str) -> None:
    """Removes our upload files from `path`, then `path` itself if nothing else was put there."""
    for entry in os.scandir(path):
        if entry.name.startswith(UPLOAD_PREFIX) and entry.is_file(follow_symlinks=False):
            remove(entry.path)
    try:
        os.rmdir(path)
    except OSError:
        pass  # not empty: what someone else put there is not ours to delete


class Queue:
    """Admission control: a request holds a slot from before its upload is read until its job is done."""

    def __init__(self, limit: int):
        self.limit = limit
        self.pending = 0
        self.served = 0  # jobs the worker has finished: a transcript, or an error found in the audio or model
        self._lock = threading.Lock()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nanoasr-worker")

    def admit(self) -> None:
        with self._lock:
            if self.pending >= self.limit:
                raise ApiError(503, f"the server is busy ({self.pending} requests uploading or queued); "
                                    "retry shortly", "server_error", code="queue_full",
                               headers={"Retry-After": "5"})
            self.pending += 1

    def leave(self) -> None:
        """The request ended before reaching the worker (bad upload or fields)."""
        with self._lock:
            self.pending -= 1

    def finish(self) -> None:
        with self._lock:
            self.pending -= 1
            self.served += 1


TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "")


def last(fields: dict, name: str, default=None):
    values = fields.get(name)
    return values[-1] if values else default


def flag(fields: dict, name: str, default: bool) -> bool:
    value = last(fields, name)
    if value is None:
        return default
    if value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    raise ApiError(400, f"{name} must be true or false; got {value!r}", param=name)


def request_options(fields: dict) -> dict:
    """Validated options from the form's text fields; raises ApiError(400) naming the field."""
    from nanoasr.model.prompt import language_code

    if last(fields, "model") is None:
        raise ApiError(400, "the 'model' field is required (any name; this server has one model)",
                       param="model")
    response_format = last(fields, "response_format", "json").strip() or "json"
    if response_format not in RESPONSE_FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(RESPONSE_FORMATS)}; "
                            f"got {response_format!r}", param="response_format")
    try:
        temperature = float(last(fields, "temperature", "0") or "0")
    except ValueError:
        raise ApiError(400, f"temperature must be a number; got {last(fields, 'temperature')!r}",
                       param="temperature") from None
    if temperature != 0:
        raise ApiError(400, f"only temperature 0 is supported (greedy decoding); got {temperature}",
                       param="temperature")
    granularities = fields.get("timestamp_granularities[]", []) + fields.get("timestamp_granularities", [])
    for value in granularities:
        if value == "word":
            raise ApiError(400, "word timestamps are not available for this model; use 'segment'",
                           param="timestamp_granularities")
        if value != "segment":
            raise ApiError(400, f"timestamp_granularities must be 'segment'; got {value!r}",
                           param="timestamp_granularities")
    try:
        code = language_code(last(fields, "language"))
    except OptionError as exc:
        raise ApiError(400, str(exc), param="language") from None
    prompt = last(fields, "prompt", "").strip()
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ApiError(400, f"prompt is limited to {MAX_PROMPT_CHARS} characters; got {len(prompt)}",
                       param="prompt")
    library_check("prompt", context=prompt or None)
    hotwords = [w.strip() for v in fields.get("hotwords", []) for w in v.replace("\n", ",").split(",")]
    hotwords = tuple(w for w in hotwords if w)
    library_check("hotwords", hotwords=hotwords)
    return {"response_format": response_format, "stream": flag(fields, "stream", False), "language": code,
            "transcribe": dict(language=code, context=prompt or None, hotwords=hotwords,
                               itn=flag(fields, "itn", True))}


def library_check(param: str, **option) -> None:
    """The library's own limits on one option, checked before the upload is decoded: a 400 naming it."""
    from nanoasr.api import Options

    try:
        Options(**option)
    except OptionError as exc:
        raise ApiError(400, str(exc), param=param) from None


class Service:
    """The transcription route's work: admission, the upload, decoding and the model."""

    def __init__(self, model, *, max_bytes: int, max_queue: int, max_duration_s: float, read_timeout_s: float,
                 upload_dir: str | None):
        self.model, self.max_bytes = model, max_bytes
        self.max_duration_s, self.read_timeout_s = max_duration_s, read_timeout_s
        self.queue = Queue(max_queue)
        self.uploads = UploadDir(upload_dir)

    async def receive(self, request) -> tuple[UploadForm, dict]:
        """Admits the request, then reads and checks its form; on any failure the slot is given back."""
        boundary = upload_boundary(request.headers, self.max_bytes)
        self.queue.admit()
        form = None
        try:
            form = await read_upload(request, boundary, self.uploads.path, self.max_bytes,
                                     self.read_timeout_s)
            return form, form_options(form)
        except BaseException:
            if form is not None:
                form.discard()
            self.queue.leave()
            raise

    def start(self, form: UploadForm, options: dict, on_segment) -> asyncio.Future:
        """Queues the job; the future is its transcript."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.queue.worker, self.job, form, options, on_segment)

    def job(self, form: UploadForm, options: dict, on_segment):
        """Runs on the worker thread; the queue slot is freed whatever happens."""
        try:
            return self.transcribe(self.decode(form), options, on_segment)
        finally:
            self.queue.finish()

    def decode(self, form: UploadForm):
        """The upload as 16 kHz samples; the file is removed as soon as it is read."""
        from nanoasr.audio.io import load_audio

        path = form.path
        try:
            return load_audio(path, max_duration_s=self.max_duration_s)
        except NanoasrError as exc:
            raise api_error(exc, str(exc).replace(path, form.filename)) from None
        finally:
            form.discard()

    def transcribe(self, wave, options: dict, on_segment):
        from nanoasr.audio.io import SAMPLE_RATE

        try:
            return self.model.transcribe(wave, sample_rate=SAMPLE_RATE, on_segment=on_segment,
                                         **options["transcribe"])
        except NanoasrError as exc:
            raise api_error(exc, str(exc)) from None


def form_options(form: UploadForm) -> dict:
    options = request_options(form.fields)
    if form.path is None:
        raise ApiError(400, "the 'file' part is required", param="file")
    if form.file_bytes == 0:
        raise ApiError(400, "the uploaded file is empty", param="file")
    return options


def api_error(exc: NanoasrError, message: str) -> ApiError:
    """Bad audio and options are the client's (4xx); anything else is the server's fault (500)."""
    if isinstance(exc, AudioTooLongError):
        return ApiError(413, f"the uploaded audio is too long: {message}", param="file",
                        code="audio_too_long")
    if isinstance(exc, AudioError):
        return ApiError(400, f"could not decode the uploaded audio: {message}", param="file")
    if isinstance(exc, OptionError):
        return ApiError(400, message)
    return ApiError(500, message, "server_error")


def create_app(model, *, api_key: str | None = None, max_upload_mb: float = 25, max_queue: int = 16,
               max_duration_s: float = 3600, read_timeout_s: float = 30, upload_dir: str | None = None):
    """The ASGI app serving `model` (a nanoasr Model, or anything with its transcribe()).

    Uploads are written to temporary files in this server's own directory inside `upload_dir` (the
    system's temporary directory when None), made at startup and removed at shutdown; each file is
    removed as soon as its audio is decoded or its request fails.
    """
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    service = Service(model, max_bytes=int(max_upload_mb * 1024 * 1024), max_queue=max_queue,
                      max_duration_s=max_duration_s, read_timeout_s=read_timeout_s, upload_dir=upload_dir)
    queue = service.queue

    @asynccontextmanager
    async def lifespan(app):
        service.uploads.open()
        try:
            yield
        finally:
            service.uploads.close()

    app = FastAPI(title="nanoasr", version="1", lifespan=lifespan,
                  description="OpenAI-compatible speech-to-text with Fun-ASR-Nano")

    def error_response(err: ApiError):
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(ApiError)
    async def on_api_error(request, err: ApiError):
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        param = str(first.get("loc", ["", ""])[-1]) or None
        return error_response(ApiError(400, f"invalid request: {param}: {first.get('msg', 'bad value')}",
                                       param=param))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request, err):
        type_ = "invalid_request_error" if err.status_code < 500 else "server_error"
        return error_response(ApiError(err.status_code, str(err.detail), type_))

    @app.exception_handler(Exception)
    async def on_unexpected(request, err):
        return error_response(ApiError(500, f"internal error: {type(err).__name__}", "server_error"))

    @app.middleware("http")
    async def require_key(request: Request, call_next):
        if api_key is not None and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization", "") != f"Bearer {api_key}":
                return error_response(ApiError(401, "Incorrect or missing API key", code="invalid_api_key"))
        return await call_next(request)

    @app.get("/health")
    async def health():
        return {"status": "ok", "queued": queue.pending, "served": queue.served}

    @app.get("/v1/models")
    async def models():
        source = getattr(getattr(model, "checkpoint", None), "source", {}) or {}
        return {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": "nanoasr",
                                            "repo": source.get("repo"), "revision": source.get("revision"),
                                            "license": source.get("license")}]}

    @app.post(TRANSCRIPTIONS, openapi_extra=OPENAPI_REQUEST, responses=OPENAPI_RESPONSES)
    async def transcriptions(request: Request):
        form, options = await service.receive(request)
        if not options["stream"]:
            return transcript_response(await service.start(form, options, None), options)
        loop = asyncio.get_running_loop()
        events, first_segment = asyncio.Queue(), loop.create_future()
        job = service.start(form, options, events_sink(loop, events, first_segment))
        # the 200 goes out with the first segment: a failure before it (bad audio, a prompt over the
        # token limit) gets its own status code, as without streaming
        await asyncio.wait({first_segment, job}, return_when=asyncio.FIRST_COMPLETED)
        if not first_segment.done():
            job.result()  # the job ended with no segment: a failure raises here, before anything was sent
        return StreamingResponse(stream_events(events, job), media_type="text/event-stream")

    return app


def transcript_response(transcript, options: dict):
    from fastapi.responses import JSONResponse, PlainTextResponse

    from nanoasr import writers

    response_format = options["response_format"]
    if response_format == "json":
        return JSONResponse({"text": transcript.text})
    if response_format == "verbose_json":
        return JSONResponse(verbose_json(transcript, options["language"]))
    body = transcript.text if response_format == "text" else writers.render(transcript, response_format)
    return PlainTextResponse(body, media_type=MEDIA_TYPES[response_format])


def events_sink(loop, events: asyncio.Queue, first_segment: asyncio.Future):
    """on_segment for the worker thread: the text each finished segment adds to the joined transcript;
    `first_segment` is set when the first one is done."""
    from nanoasr.api import join_texts

    texts: list[str] = []

    def on_segment(segment):
        before = join_texts(texts)
        texts.append(segment.text)
        delta = join_texts(texts)[len(before):]
        if delta:
            loop.call_soon_threadsafe(events.put_nowait, {"type": "transcript.text.delta", "delta": delta})
        loop.call_soon_threadsafe(settle, first_segment)

    return on_segment


def settle(future: asyncio.Future) -> None:
    if not future.done():  # set once; a request cancelled while waiting leaves it cancelled
        future.set_result(None)


async def stream_events(events: asyncio.Queue, future):
    """SSE: a delta per finished segment, then transcript.text.done (or an error event)."""
    while not (future.done() and events.empty()):
        getter = asyncio.ensure_future(events.get())
        done, _ = await asyncio.wait({getter, future}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            yield sse(getter.result())
        else:
            getter.cancel()
    try:
        final = {"type": "transcript.text.done", "text": future.result().text}
    except ApiError as err:
        final = {"type": "error", **err.body()}
    except Exception as exc:
        err = ApiError(500, f"internal error: {type(exc).__name__}", "server_error")
        final = {"type": "error", **err.body()}
    yield sse(final)


def sse(event: dict) -> str:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"


ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
OPENAPI_REQUEST = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "model"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "the audio file"},
        "model": {"type": "string", "description": "any name; the server has one model"},
        "language": {"type": "string", "description": "zh, en, ja (codes, English or Chinese names) or auto"},
        "prompt": {"type": "string", "maxLength": MAX_PROMPT_CHARS,
                   "description": "context text for the model"},
        "response_format": {"type": "string", "enum": list(RESPONSE_FORMATS), "default": "json"},
        "temperature": {"type": "number", "default": 0, "description": "0 only (greedy decoding)"},
        "timestamp_granularities[]": {"type": "array", "items": {"type": "string", "enum": ["segment"]}},
        "stream": {"type": "boolean", "default": False},
        "hotwords": {"type": "string", "description": "words to favour, comma or newline separated"},
        "itn": {"type": "boolean", "default": True, "description": "inverse text normalisation"},
    }}}}}}
OPENAPI_RESPONSES = {
    200: {"description": "the transcript in the requested format", "content": {
        "application/json": {}, "text/plain": {}, "application/x-subrip": {}, "text/vtt": {},
        "text/event-stream": {}}},
    **{status: {"description": what, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
       for status, what in ((400, "bad audio or fields"), (401, "missing or wrong API key"),
                            (408, "no upload data for the read timeout"),
                            (413, "upload or audio duration over the limit"),
                            (503, "queue full; see Retry-After"))},
}


def positive(kind):
    def parse(text: str):
        value = kind(text)
        if not (0 < value < math.inf):  # also refuses nan and inf, which float() accepts
            raise argparse.ArgumentTypeError(f"must be a finite number greater than 0; got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nanoasr serve",
                                     description="OpenAI-compatible transcription server",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default=None,
                        help="checkpoint directory, .gguf or model.pt file, hub id or package name")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (loopback unless you say otherwise)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/ routes")
    parser.add_argument("--max-upload-mb", type=positive(float), default=25,
                        help="largest accepted upload, MiB")
    parser.add_argument("--max-queue", type=positive(int), default=16,
                        help="requests uploading, waiting or running before new ones get 503")
    parser.add_argument("--max-duration", type=positive(float), default=3600,
                        help="longest accepted audio, seconds (longer gets 413)")
    parser.add_argument("--read-timeout", type=positive(float), default=30,
                        help="seconds an upload may send no data before it gets 408 and is discarded")
    parser.add_argument("--upload-dir", default=None,
                        help="directory in which the server makes its own directory for uploads in progress "
                             "(default: the system's temporary directory)")
    parser.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"), help="where to run")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        import fastapi  # noqa: F401
        import python_multipart  # noqa: F401
        import uvicorn
    except ImportError as exc:
        print(f"nanoasr: error: the server needs the 'server' extra ({exc.name} is missing): "
              'pip install "nanoasr[server]"', file=sys.stderr)
        return 1
    from nanoasr.api import Model

    try:
        model = Model.load(args.model, device=args.device, threads=args.threads)
    except NanoasrError as exc:
        print(f"nanoasr: error: {exc}", file=sys.stderr)
        return 1
    if args.upload_dir is not None and not os.path.isdir(args.upload_dir):
        print(f"nanoasr: error: --upload-dir {args.upload_dir}: not a directory", file=sys.stderr)
        return 1
    app = create_app(model, api_key=args.api_key, max_upload_mb=args.max_upload_mb, max_queue=args.max_queue,
                     max_duration_s=args.max_duration, read_timeout_s=args.read_timeout,
                     upload_dir=args.upload_dir)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
