"""OpenAI-compatible transcription server: POST /v1/audio/transcriptions, GET /v1/models, GET /health.

One model in memory; requests run one at a time, in arrival order, on a single worker thread; when the
queue is full new requests get 503 with Retry-After. Errors use OpenAI's envelope, and bad input is
always a 4xx (the official client retries 5xx). FastAPI and uvicorn come with the `server` extra.
"""

import argparse
import asyncio
import gzip
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from nanoasr.errors import AudioError, NanoasrError, OptionError

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
        {"id": i, "seek": 0, "start": s.start, "end": s.end, "text": s.text, "tokens": list(s.token_ids),
         "temperature": 0.0, "avg_logprob": s.avg_logprob, "compression_ratio": compression_ratio(s.text),
         "no_speech_prob": 0.0}
        for i, s in enumerate(x for x in transcript.segments if x.text)
    ]
    return {"task": "transcribe", "language": LANGUAGE_NAMES.get(language_code, "auto"),
            "duration": transcript.duration_s, "text": transcript.text, "segments": segments,
            "usage": {"type": "duration", "seconds": transcript.duration_s}}


MULTIPART_OVERHEAD = 64 * 1024  # form fields and boundaries around the file


class UploadLimit:
    """ASGI middleware: stop reading a transcription upload once it passes the limit, answer 413."""

    def __init__(self, app, limit: int, error):
        self.app, self.limit, self.error = app, limit, error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != TRANSCRIPTIONS:
            return await self.app(scope, receive, send)
        from fastapi.responses import JSONResponse

        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            err = self.error(int(length))
            return await JSONResponse(err.body(), status_code=err.status)(scope, receive, send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise UploadTooLarge(seen)
            return message

        try:
            await self.app(scope, limited_receive, send)
        except UploadTooLarge as exc:
            err = self.error(exc.args[0])
            await JSONResponse(err.body(), status_code=err.status)(scope, receive, send)


class UploadTooLarge(Exception):
    pass


class Queue:
    """Admission control in front of the single worker thread."""

    def __init__(self, limit: int):
        self.limit = limit
        self.pending = 0
        self._lock = threading.Lock()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nanoasr-worker")

    def admit(self) -> None:
        with self._lock:
            if self.pending >= self.limit:
                raise ApiError(503, f"the server is busy ({self.pending} requests queued); retry shortly",
                               "server_error", code="queue_full", headers={"Retry-After": "5"})
            self.pending += 1

    def release(self) -> None:
        with self._lock:
            self.pending -= 1


def create_app(model, *, api_key: str | None = None, max_upload_mb: float = 25, max_queue: int = 16):
    """The ASGI app serving `model` (a nanoasr Model, or anything with its transcribe())."""
    from fastapi import FastAPI, File, Form, Request, UploadFile
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from nanoasr import writers
    from nanoasr.model.prompt import language_code

    max_bytes = int(max_upload_mb * 1024 * 1024)
    queue = Queue(max_queue)
    app = FastAPI(title="nanoasr", version="1", description="OpenAI-compatible speech-to-text with Fun-ASR-Nano")

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

    def too_large(size) -> ApiError:
        return ApiError(413, f"Maximum content size limit ({max_bytes}) exceeded ({size} bytes read)",
                        code="file_too_large")

    app.add_middleware(UploadLimit, limit=max_bytes + MULTIPART_OVERHEAD, error=too_large)

    @app.get("/health")
    async def health():
        return {"status": "ok", "queued": queue.pending}

    @app.get("/v1/models")
    async def models():
        source = getattr(getattr(model, "checkpoint", None), "source", {}) or {}
        return {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": "nanoasr",
                                            "repo": source.get("repo"), "revision": source.get("revision"),
                                            "license": source.get("license")}]}

    @app.post(TRANSCRIPTIONS)
    async def transcriptions(
        file: UploadFile = File(...), model_name: str = Form(..., alias="model"), language: str | None = Form(None),
        prompt: str | None = Form(None), response_format: str = Form("json"), temperature: float = Form(0.0),
        timestamp_granularities: list[str] | None = Form(None, alias="timestamp_granularities[]"),
        stream: bool = Form(False),
    ):
        if response_format not in RESPONSE_FORMATS:
            raise ApiError(400, f"response_format must be one of {', '.join(RESPONSE_FORMATS)}; "
                                f"got {response_format!r}", param="response_format")
        if temperature != 0:
            raise ApiError(400, "only temperature 0 is supported (greedy decoding)", param="temperature")
        if "word" in (timestamp_granularities or []):
            raise ApiError(400, "word timestamps are not available for this model; use 'segment'",
                           param="timestamp_granularities")
        try:
            code = language_code(language)
        except OptionError as exc:
            raise ApiError(400, str(exc), param="language") from None
        if file.size is not None and file.size > max_bytes:
            raise too_large(file.size)
        if file.size == 0:
            raise ApiError(400, "the uploaded file is empty", param="file")
        queue.admit()
        loop = asyncio.get_running_loop()
        kwargs = dict(language=code, context=prompt or None)
        if stream:
            return StreamingResponse(stream_events(loop, file, kwargs), media_type="text/event-stream")
        try:
            transcript = await loop.run_in_executor(queue.worker, run, file, kwargs, None)
        finally:
            queue.release()
            await file.close()
        if response_format == "json":
            return JSONResponse({"text": transcript.text})
        if response_format == "verbose_json":
            return JSONResponse(verbose_json(transcript, code))
        body = transcript.text if response_format == "text" else writers.render(transcript, response_format)
        return PlainTextResponse(body, media_type=MEDIA_TYPES[response_format])

    def run(file, kwargs, on_segment):
        try:
            file.file.seek(0)
            return model.transcribe(file.file, on_segment=on_segment, **kwargs)
        except AudioError as exc:
            raise ApiError(400, f"could not decode the uploaded audio: {exc}", param="file") from None
        except OptionError as exc:
            raise ApiError(400, str(exc)) from None
        except NanoasrError as exc:
            raise ApiError(500, str(exc), "server_error") from None

    async def stream_events(loop, file, kwargs):
        events: asyncio.Queue = asyncio.Queue()

        def on_segment(segment):
            if segment.text:
                loop.call_soon_threadsafe(events.put_nowait, {"type": "transcript.text.delta",
                                                              "delta": segment.text})

        future = loop.run_in_executor(queue.worker, run, file, kwargs, on_segment)
        try:
            while not (future.done() and events.empty()):
                getter = asyncio.ensure_future(events.get())
                done, _ = await asyncio.wait({getter, future}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield f"data: {json.dumps(getter.result(), ensure_ascii=False)}\n\n"
                else:
                    getter.cancel()
            try:
                transcript = future.result()
                final = {"type": "transcript.text.done", "text": transcript.text}
            except ApiError as err:
                final = {"type": "error", **err.body()}
            yield f"data: {json.dumps(final, ensure_ascii=False)}\n\n"
        finally:
            queue.release()
            await file.close()

    return app


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nanoasr serve", description="OpenAI-compatible transcription server",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint directory, .gguf, hub id or package name")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (loopback unless you say otherwise)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/ routes")
    parser.add_argument("--max-upload-mb", type=float, default=25, help="largest accepted upload, MiB")
    parser.add_argument("--max-queue", type=int, default=16, help="requests waiting or running before 503")
    parser.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"), help="where to run")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        print("nanoasr: error: the server needs the 'server' extra: pip install 'nanoasr[server]'", file=sys.stderr)
        return 1
    from nanoasr.api import Model

    try:
        model = Model.load(args.model, device=args.device, threads=args.threads)
    except NanoasrError as exc:
        print(f"nanoasr: error: {exc}", file=sys.stderr)
        return 1
    app = create_app(model, api_key=args.api_key, max_upload_mb=args.max_upload_mb, max_queue=args.max_queue)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
