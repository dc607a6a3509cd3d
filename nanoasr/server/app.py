"""The FastAPI app. Routes, error handlers and the API-key check are defined here once; each reads the one
Service that create_app keeps in the app's state."""

import collections
import logging
import time
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from nanoasr.server.errors import ApiError, internal_error
from nanoasr.server.funasr_realtime import router as funasr_realtime_router
from nanoasr.server.multipart import UploadTimes
from nanoasr.server.openapi import OPENAPI_REQUEST, OPENAPI_RESPONSES
from nanoasr.server.realtime import router as realtime_router
from nanoasr.server.responses import event_stream_response, transcript_response
from nanoasr.server.service import Service

MODEL_ID = "fun-asr-nano"
TRANSCRIPTIONS = "/v1/audio/transcriptions"
MIB = 1024 * 1024
KIB = 1024
LOGGER = "nanoasr.server"  # the model at startup and a line per request
log = logging.getLogger(LOGGER)

router = APIRouter()


def service_of(request: Request) -> Service:
    return request.app.state.service


@router.get("/health")
async def health(request: Request):
    queue = service_of(request).queue
    return {"status": "ok", "uploading": queue.uploading, "queued": queue.pending, "served": queue.served}


@router.get("/v1/models")
async def models(request: Request):
    source = getattr(getattr(service_of(request).model, "checkpoint", None), "source", {}) or {}
    return {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": "nanoasr",
                                        "repo": source.get("repo"), "revision": source.get("revision"),
                                        "license": source.get("license")}]}


@router.post(TRANSCRIPTIONS, openapi_extra=OPENAPI_REQUEST, responses=OPENAPI_RESPONSES)
async def transcriptions(request: Request):
    service = service_of(request)
    form, options = await service.receive(request)
    if options.stream:
        return await event_stream_response(service, form, options)
    return transcript_response(await service.start(form, options, None), options.response_format,
                               options.granularities)


async def require_key(request: Request, call_next):
    api_key = service_of(request).api_key
    if api_key is not None and request.url.path.startswith("/v1/"):
        if request.headers.get("authorization", "") != f"Bearer {api_key}":
            return error_response(ApiError(401, "Incorrect or missing API key", code="invalid_api_key"))
    return await call_next(request)


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def on_api_error(request, err: ApiError):
    return error_response(err)


async def on_validation_error(request, err: RequestValidationError):
    first = err.errors()[0] if err.errors() else {}
    param = str(first.get("loc", ["", ""])[-1]) or None
    return error_response(ApiError(400, f"invalid request: {param}: {first.get('msg', 'bad value')}",
                                   param=param))


async def on_http_error(request, err: StarletteHTTPException):
    type_ = "invalid_request_error" if err.status_code < 500 else "server_error"
    return error_response(ApiError(err.status_code, str(err.detail), type_))


async def on_unexpected(request, err: Exception):
    return error_response(internal_error(err))


ERROR_HANDLERS = {ApiError: on_api_error, RequestValidationError: on_validation_error,
                  StarletteHTTPException: on_http_error, Exception: on_unexpected}


class RequestLog:
    """One log line per request, once its response is sent: client, method, path, status and duration."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.monotonic(), 500  # 500 unless a response starts: the app raised

        async def send_noting_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            client = "%s:%d" % tuple(scope["client"]) if scope.get("client") else "-"
            log.info('%s - "%s %s" %d in %.3f s', client, scope["method"], scope["path"], status,
                     time.monotonic() - start)


def model_summary(model) -> str:
    """Where the model came from and its stored types, e.g. `/models/nano (gguf) q8_0 x 310, f32 x 200`."""
    checkpoint = getattr(model, "checkpoint", None)
    if checkpoint is None:
        return type(model).__name__
    source = checkpoint.source
    origin = f"{source.get('repo')}@{source.get('revision')}, " if source.get("repo") else ""
    types = collections.Counter(t.dtype for t in checkpoint.tensors.values())
    return (f"{source.get('path')} ({origin}{source.get('format')}) "
            + ", ".join(f"{dtype} x {count}" for dtype, count in types.most_common()))


@asynccontextmanager
async def lifespan(app: FastAPI):
    """The model is warmed up (when create_app was asked to) before the server accepts a connection; the
    upload directory lives as long as the server."""
    service = app.state.service
    log.info("model: %s", model_summary(service.model))
    if app.state.warm_up:
        log.info("warming up: one short transcription, so that the first request runs compiled kernels")
        log.info("warmed up in %.1f s", await service.warm_up())
    uploads = service.uploads
    uploads.open()
    try:
        yield
    finally:
        uploads.close()
        service.close()


def create_app(model, *, api_key: str | None = None, max_upload_mb: float = 25, max_queue: int = 16,
               max_uploads: int = 32, max_duration_s: float = 3600, read_timeout_s: float = 30,
               upload_timeout_s: float = 600, min_upload_kib_s: float = 16, upload_dir: str | None = None,
               warm_up: bool = False):
    """The ASGI app serving `model` (a nanoasr Model, or anything whose transcribe() takes a DecodedAudio).
    With `warm_up`, the app's startup runs model.warm_up() (Model.warm_up) on the worker thread before the
    server accepts connections, so that the first request does not wait for the kernels to compile.

    At most `max_uploads` uploads arrive at once, each within the times of multipart.UploadTimes;
    `max_queue` complete ones wait or run. Uploads are written to temporary files in this server's own
    directory inside `upload_dir` (the system's temporary directory when None), made at startup and removed
    at shutdown; each file is removed as soon as its audio is decoded or its request fails.
    """
    app = FastAPI(title="nanoasr", version="1", lifespan=lifespan,
                  description="OpenAI-compatible speech-to-text with Fun-ASR-Nano")
    times = UploadTimes(read_timeout_s, upload_timeout_s, min_upload_kib_s * KIB)
    app.state.warm_up = warm_up
    app.state.service = Service(model, api_key=api_key, max_bytes=int(max_upload_mb * MIB),
                                max_queue=max_queue, max_uploads=max_uploads, max_duration_s=max_duration_s,
                                upload_times=times, upload_dir=upload_dir)
    app.include_router(router)
    app.include_router(realtime_router)  # /v1/realtime?intent=transcription
    app.include_router(funasr_realtime_router)  # /funasr/realtime, FunASR's own protocol
    for error, handler in ERROR_HANDLERS.items():
        app.add_exception_handler(error, handler)
    app.middleware("http")(require_key)
    app.add_middleware(RequestLog)
    return app
