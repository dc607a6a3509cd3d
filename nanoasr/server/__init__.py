"""OpenAI-compatible transcription server: POST /v1/audio/transcriptions, GET /v1/models, GET /health, and
the realtime WebSockets /v1/realtime?intent=transcription (OpenAI's) and /funasr/realtime (FunASR's).

One model in memory; requests run one at a time, in arrival order, on a single worker thread. A request
holds an upload slot while its body arrives, within a read timeout, a minimum rate and a deadline (408
past them), and takes its queue slot only once the upload is complete, so slow clients hold no decode
capacity; when either is full new requests get 503 with Retry-After. Connections slow to send their headers
are closed. Errors use OpenAI's envelope, and bad input is always a 4xx (the official client retries 5xx).
FastAPI and uvicorn come with the `server` extra, so this package imports them only when the app is made
(`nanoasr serve` is nanoasr.cli.serve).

    app.py         the FastAPI app: routes, error handlers, create_app
    service.py     one server's state: the queue, the upload directory, the worker's job
    multipart.py   the upload, streamed to disk within its time limits
    connections.py uvicorn's config: the header deadline and the bound on connections sending headers
    uploads.py     upload directories, and the sweep of abandoned ones
    fields.py      form fields -> api.Options
    responses.py   the transcript in each format, and as server-sent events
    openapi.py     the transcription route's schema
    errors.py      OpenAI's error envelope
    realtime.py    the realtime WebSocket: OpenAI's transcription events over a nanoasr.realtime.LiveSession
    live_config.py its session settings (GA and beta shapes)
    live_audio.py  its input formats -> 16 kHz
    funasr_realtime.py  FunASR's realtime protocol on the same sessions
"""


def __getattr__(name):
    if name == "create_app":
        from nanoasr.server.app import create_app

        return create_app
    raise AttributeError(f"module 'nanoasr.server' has no attribute {name!r}")
