"""The upload, read as it streams in: multipart/form-data with text fields kept in memory and the `file` part
written to a temporary file in the server's upload directory. Nothing is held whole in memory, and a body
that cannot be accepted is refused before it is read or drained (bounded) before it is answered."""

import asyncio
import os
import tempfile
import time
from dataclasses import dataclass

from nanoasr.server.errors import ApiError
from nanoasr.server.uploads import UPLOAD_PREFIX, remove

FIELD_LIMIT = 64 * 1024  # bytes in one text field
MAX_FIELDS = 64
DRAIN_FACTOR = 4  # read up to this many times the limit before answering 413, so the client sees the answer
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
                return self.reject(ApiError(400, "only one 'file' part is accepted", param="file"))
            self.filename = options.get(b"filename", b"upload").decode("utf-8", "replace") or "upload"
            self._file = tempfile.NamedTemporaryFile(dir=self.upload_dir, prefix=UPLOAD_PREFIX,
                                                     suffix=upload_suffix(self.filename), delete=False)
            self.path = self._file.name
        elif b"filename" in options:
            pass  # a file under another name: not ours to read
        elif sum(len(v) for v in self.fields.values()) >= MAX_FIELDS:
            self.reject(ApiError(400, f"at most {MAX_FIELDS} form fields are accepted"))
        else:
            self._text = bytearray()

    def _part_data(self, data, start, end):
        if self.problem is not None:
            return
        if self._name == "file" and self._file is not None:
            self.file_bytes += end - start
            if self.file_bytes > self.max_bytes:
                return self.reject(too_large(self.max_bytes, self.file_bytes))
            self._file.write(data[start:end])
        elif self._text is not None:
            self._text += data[start:end]
            if len(self._text) > FIELD_LIMIT:
                self.reject(ApiError(400, f"form field {self._name!r} is longer than {FIELD_LIMIT} bytes",
                                     param=self._name))

    def _part_end(self):
        if self._name == "file" and self._file is not None:
            self._file.close()
            self._file = None
        elif self._text is not None and self.problem is None:
            try:
                self.fields.setdefault(self._name, []).append(self._text.decode("utf-8"))
            except UnicodeDecodeError:
                self.reject(ApiError(400, f"form field {self._name!r} is not UTF-8 text", param=self._name))
        self._text = None

    def _end(self):
        self.complete = True

    def reject(self, problem: ApiError):
        if self.problem is None:
            self.problem = problem

    def require_file(self) -> None:
        if self.path is None:
            raise ApiError(400, "the 'file' part is required", param="file")
        if self.file_bytes == 0:
            raise ApiError(400, "the uploaded file is empty", param="file")

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


@dataclass(frozen=True)
class UploadTimes:
    """How long an upload may take: at most `idle_s` without data; in all, `idle_s` plus one second per
    `min_rate` bytes received so far (Apache's MinRate), so a client trickling bytes is cut off however
    often it sends them; and never more than `total_s`."""

    idle_s: float = 30
    total_s: float = 600
    min_rate: float = 16 * 1024  # bytes per second

    def allowed_s(self, received: int) -> float:
        """Seconds from its start that an upload which has sent `received` bytes may have taken."""
        return min(self.total_s, self.idle_s + received / self.min_rate)

    def timed_out(self, received: int, idle: bool) -> ApiError:
        """The 408 for an upload that sent no data for `idle_s` (`idle`) or ran out of time in all."""
        if idle:
            return upload_408(f"no upload data arrived for {self.idle_s:g} s (the server's read timeout)",
                              "read_timeout")
        if self.allowed_s(received) >= self.total_s:
            return upload_408(f"the upload took longer than {self.total_s:g} s (the server's upload timeout)",
                              "upload_timeout")
        return upload_408(f"the upload arrived slower than {self.min_rate / 1024:g} KiB/s, the server's "
                          f"minimum upload rate ({received} bytes in {self.allowed_s(received):.1f} s)",
                          "upload_too_slow")


def upload_408(why: str, code: str) -> ApiError:
    # the client is too slow for the rest of its body to matter, so the connection is closed unread
    return ApiError(408, f"{why}; the upload was discarded", code=code, headers={"Connection": "close"})


async def body_chunks(request, times: UploadTimes):
    """The request body as it arrives; ApiError(408) once it is slower than `times` allow."""
    from starlette.requests import ClientDisconnect

    start, received = time.monotonic(), 0
    while True:
        left = times.allowed_s(received) - (time.monotonic() - start)
        try:
            if left <= 0:
                raise asyncio.TimeoutError
            message = await asyncio.wait_for(request.receive(), min(times.idle_s, left))
        except asyncio.TimeoutError:
            raise times.timed_out(received, idle=left > times.idle_s) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        body = message.get("body", b"")
        received += len(body)
        yield body
        if not message.get("more_body", False):
            return


async def read_upload(request, boundary: bytes, upload_dir: str, max_bytes: int,
                      times: UploadTimes) -> UploadForm:
    """The request's form with its file part on disk; on bad input, ApiError (the temporary file removed)."""
    from python_multipart.exceptions import FormParserError
    from python_multipart.multipart import MultipartParser
    from starlette.requests import ClientDisconnect

    form = UploadForm(upload_dir, max_bytes)
    parser = MultipartParser(boundary, form.callbacks())
    seen = 0
    try:
        async for chunk in body_chunks(request, times):
            seen += len(chunk)
            if form.problem is None:
                parser.write(chunk)
            elif seen > drain_limit(max_bytes):
                break
        if form.problem is None:
            parser.finalize()
    except FormParserError as exc:
        form.reject(ApiError(400, f"malformed multipart body: {exc}"))
    except ClientDisconnect:
        form.reject(ApiError(400, "the client disconnected before the upload was complete"))
    except BaseException:
        form.discard()
        raise
    if form.problem is None and not form.complete:
        form.reject(ApiError(400, "the multipart body ended before its closing boundary"))
    if form.problem is not None:
        form.discard()
        if form.problem.status == 413:
            raise too_large(max_bytes, seen)
        raise form.problem
    return form
