"""One server's state and the transcription route's work: admission, the upload, decoding and the model.

Requests run one at a time, in arrival order, on a single worker thread. A request holds an upload slot while
its body arrives and takes its queue slot only once the upload is complete, so a slow client holds no decode
capacity; uploads in progress have their own limit, and their own time limits (multipart.UploadTimes).
Live sessions run on threads of their own and decode together through the server's one DecodeScheduler
(nanoasr.batching), whose batches run on the worker, in turn with the requests.
"""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from nanoasr.batching import DecodeScheduler
from nanoasr.errors import NanoasrError, OptionError
from nanoasr.server.errors import ApiError, api_error, refused_field
from nanoasr.server.fields import RequestOptions, request_options
from nanoasr.server.multipart import UploadForm, UploadTimes, read_upload, upload_boundary
from nanoasr.server.uploads import UploadDir


class Queue:
    """Admission control. A request holds an upload slot while its body arrives and a job slot from its
    complete upload until its job is done, so slow uploads never hold decode capacity."""

    def __init__(self, limit: int, upload_limit: int):
        self.limit, self.upload_limit = limit, upload_limit
        self.pending = 0  # jobs waiting for the worker or running
        self.uploading = 0
        self.served = 0  # jobs the worker has finished: a transcript, or an error found in the audio or model
        self._lock = threading.Lock()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nanoasr-worker")

    def admit_upload(self) -> None:
        """Refuses the upload unread when either limit is reached: a full queue would refuse it once read."""
        with self._lock:
            self._check_jobs()
            if self.uploading >= self.upload_limit:
                raise busy(f"{self.uploading} uploads in progress", "uploads_full")
            self.uploading += 1

    def upload_ended(self) -> None:
        with self._lock:
            self.uploading -= 1

    def admit_job(self) -> None:
        with self._lock:
            self._check_jobs()
            self.pending += 1

    def _check_jobs(self) -> None:
        if self.pending >= self.limit:
            raise busy(f"{self.pending} requests queued", "queue_full")

    def finish(self) -> None:
        with self._lock:
            self.pending -= 1
            self.served += 1

    def leave(self) -> None:
        """Gives back a job slot that a live session held while it was open (it is not a served job)."""
        with self._lock:
            self.pending -= 1


def busy(what: str, code: str) -> ApiError:
    return ApiError(503, f"the server is busy ({what}); retry shortly", "server_error", code=code,
                    headers={"Retry-After": "5"})


class Service:
    """The model, its limits, the queue, the upload directory and the API key of one server."""

    def __init__(self, model, *, api_key: str | None, max_bytes: int, max_queue: int, max_uploads: int,
                 max_duration_s: float, upload_times: UploadTimes, upload_dir: str | None):
        self.model, self.api_key, self.max_bytes = model, api_key, max_bytes
        self.max_duration_s, self.upload_times = max_duration_s, upload_times
        self.queue = Queue(max_queue, max_uploads)
        self.uploads = UploadDir(upload_dir)
        # a live session holds a queue slot: a thread each, and none waits for another to be free
        self.live = ThreadPoolExecutor(max_workers=max_queue, thread_name_prefix="nanoasr-live")
        self._scheduler: DecodeScheduler | None = None
        self._scheduler_made = threading.Lock()

    @property
    def scheduler(self) -> DecodeScheduler:
        """The live sessions' DecodeScheduler, made for the first one; its batches run on the worker."""
        with self._scheduler_made:
            if self._scheduler is None:
                self._scheduler = DecodeScheduler(self.model, execute=self._on_worker)
            return self._scheduler

    def _on_worker(self, fn, *args):
        return self.queue.worker.submit(fn, *args).result()

    def close(self) -> None:
        """At shutdown: the scheduler decodes what is queued and stops (a server started again makes a new
        one)."""
        with self._scheduler_made:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.close()

    async def receive(self, request) -> tuple[UploadForm, RequestOptions]:
        """Reads the upload in an upload slot, checks its form, then queues it; on any failure the upload file
        is removed and every slot given back."""
        boundary = upload_boundary(request.headers, self.max_bytes)
        self.queue.admit_upload()
        try:
            form = await read_upload(request, boundary, self.uploads.path, self.max_bytes, self.upload_times)
        finally:
            self.queue.upload_ended()
        try:
            options = request_options(form.fields)
            form.require_file()
            self.check_model_options(options)
            self.queue.admit_job()
            return form, options
        except BaseException:
            form.discard()
            raise

    def check_model_options(self, options: RequestOptions) -> None:
        """What the loaded model refuses (a language, word timestamps): a 400 before the upload is queued."""
        try:
            asked = options.transcribe
            self.model.check_options(asked["language"], asked.get("word_timestamps", False))
        except OptionError as exc:
            raise refused_field(exc) from None

    async def warm_up(self) -> float:
        """The model's warm-up (Model.warm_up: its kernels compiled or loaded), on the worker thread that runs
        the requests, so that what it keeps per thread is that thread's; its seconds."""
        return await asyncio.get_running_loop().run_in_executor(self.queue.worker, self.model.warm_up)

    def start(self, form: UploadForm, options: RequestOptions, events=None) -> asyncio.Future:
        """Queues the job; the future is its transcript. `events` (responses.TextEvents) hears of the text
        as it is decoded."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.queue.worker, self.job, form, options, events)

    def job(self, form: UploadForm, options: RequestOptions, events):
        """Runs on the worker thread; the queue slot is freed whatever happens."""
        try:
            return self.transcribe(self.decode(form), options, events)
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

    def transcribe(self, audio, options: RequestOptions, events):
        callbacks = {} if events is None else dict(on_segment=events.on_segment, on_partial=events.on_partial)
        try:
            return self.model.transcribe(audio, **callbacks, **options.transcribe)
        except NanoasrError as exc:
            raise api_error(exc, str(exc)) from None
