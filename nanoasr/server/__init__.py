"""OpenAI-compatible transcription server: POST /v1/audio/transcriptions, GET /v1/models, GET /health.

One model in memory; requests run one at a time, in arrival order, on a single worker thread. A request
takes its queue slot before its upload is read, so uploads in progress and jobs together never exceed the
queue; when it is full new requests get 503 with Retry-After. Errors use OpenAI's envelope, and bad input
is always a 4xx (the official client retries 5xx). FastAPI and uvicorn come with the `server` extra, so
this module imports them only when the server starts: `nanoasr serve --help` and the install hint work
without them.

    app.py         the FastAPI app: routes, error handlers, create_app
    service.py     one server's state: the queue, the upload directory, the worker's job
    multipart.py   the upload, streamed to disk
    uploads.py     upload directories, and the sweep of abandoned ones
    fields.py      form fields -> api.Options
    responses.py   the transcript in each format, and as server-sent events
    openapi.py     the transcription route's schema
    errors.py      OpenAI's error envelope
"""

import argparse
import math
import os
import sys

from nanoasr.backend import DEVICES
from nanoasr.errors import NanoasrError


def __getattr__(name):
    if name == "create_app":
        from nanoasr.server.app import create_app

        return create_app
    raise AttributeError(f"module 'nanoasr.server' has no attribute {name!r}")


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
    parser.add_argument("--device", default="cpu", choices=DEVICES, help="where to run")
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
    from nanoasr.server.app import create_app

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
