"""One server's state and the transcription route's work: admission, the upload, decoding and the model.

Requests run one at a time, in arrival order, on a single worker thread. A request takes its queue slot before
its upload is read, so uploads in progress and jobs together never exceed the queue.
"""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from nanoasr.errors import NanoasrError, OptionError
from nanoasr.server.errors import ApiError, api_error, refused_field
from nanoasr.server.fields import RequestOptions, request_options
from nanoasr.server.multipart import UploadForm, read_upload, upload_boundary
from nanoasr.server.uploads import UploadDir


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


class Service:
    """The model, its limits, the queue, the upload directory and the API key of one server."""

    def __init__(self, model, *, api_key: str | None, max_bytes: int, max_queue: int, max_duration_s: float,
                 read_timeout_s: float, upload_dir: str | None):
        self.model, self.api_key, self.max_bytes = model, api_key, max_bytes
        self.max_duration_s, self.read_timeout_s = max_duration_s, read_timeout_s
        self.queue = Queue(max_queue)
        self.uploads = UploadDir(upload_dir)

    async def receive(self, request) -> tuple[UploadForm, RequestOptions]:
        """Admits the request, then reads and checks its form; on any failure the slot is given back."""
        boundary = upload_boundary(request.headers, self.max_bytes)
        self.queue.admit()
        form = None
        try:
            form = await read_upload(request, boundary, self.uploads.path, self.max_bytes,
                                     self.read_timeout_s)
            options = request_options(form.fields)
            form.require_file()
            self.check_model_options(options)
            return form, options
        except BaseException:
            if form is not None:
                form.discard()
            self.queue.leave()
            raise

    def check_model_options(self, options: RequestOptions) -> None:
        """What the loaded model refuses (a language, word timestamps): a 400 before the upload is queued."""
        try:
            asked = options.transcribe
            self.model.check_options(asked["language"], asked.get("word_timestamps", False))
        except OptionError as exc:
            raise refused_field(exc) from None

    def start(self, form: UploadForm, options: RequestOptions, on_segment) -> asyncio.Future:
        """Queues the job; the future is its transcript."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.queue.worker, self.job, form, options, on_segment)

    def job(self, form: UploadForm, options: RequestOptions, on_segment):
        """Runs on the worker thread; the queue slot is freed whatever happens."""
        try:
            return self.transcribe(self.decode(form), options, on_segment)
        finally:
            self.queue.finish()

    def decode(self, form: UploadForm):
        """The upload decoded (a DecodedAudio, which the model takes as it is); the file is removed as soon as
        it is read."""
        from nanoasr.audio.io import decode_audio

        path = form.path
        try:
            return decode_audio(path, max_duration_s=self.max_duration_s)
        except NanoasrError as exc:
            raise api_error(exc, str(exc).replace(path, form.filename)) from None
        finally:
            form.discard()

    def transcribe(self, audio, options: RequestOptions, on_segment):
        try:
            return self.model.transcribe(audio, on_segment=on_segment, **options.transcribe)
        except NanoasrError as exc:
            raise api_error(exc, str(exc)) from None
