"""nanoasr serve: the OpenAI-compatible transcription server (nanoasr.server) on one model.

FastAPI and uvicorn come with the `server` extra and are imported only when the server starts, so
`nanoasr serve --help` and the install hint work without them. Exit status as in nanoasr.cli.
"""
from __future__ import annotations

import argparse
import os
import sys

from nanoasr.audio.vad import DEFAULT_VAD, VADS
from nanoasr.backend import ACTIVATIONS, DEVICES
from nanoasr.cli import (EXIT_FAILED, EXIT_OK, EXIT_USAGE, compile_notice, error, library_warnings,
                         live_limits, positive, transcribe)
from nanoasr.errors import NanoasrError, OptionError

PROG = "nanoasr serve"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="OpenAI-compatible transcription server",
                                     formatter_class=transcribe._HelpFormatter)
    parser.add_argument("--model", default=None,
                        help="checkpoint directory, .gguf or model.pt file, hub id or package name "
                             "(default: $NANOASR_MODEL or the config file's model, else the default package)")
    parser.add_argument("--llm", default=None, metavar="QWEN3.gguf",
                        help="the decoder GGUF when --model is FunASR's llama.cpp encoder GGUF")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (loopback unless you say otherwise)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/ routes")
    parser.add_argument("--max-upload-mb", type=positive(float), default=25,
                        help="largest accepted upload, MiB")
    parser.add_argument("--max-queue", type=positive(int), default=16,
                        help="uploaded requests waiting or running before new ones get 503")
    parser.add_argument("--max-uploads", type=positive(int), default=32,
                        help="uploads in progress before new ones get 503")
    parser.add_argument("--max-duration", type=positive(float), default=3600,
                        help="longest accepted audio, seconds (longer gets 413)")
    parser.add_argument("--read-timeout", type=positive(float), default=30,
                        help="seconds an upload may send no data before it gets 408 and is discarded")
    parser.add_argument("--min-upload-rate", type=positive(float), default=16, metavar="KIB_S",
                        help="slowest accepted upload, KiB/s: an upload gets --read-timeout seconds plus one "
                             "for each KIB_S KiB it has sent, then 408")
    parser.add_argument("--upload-timeout", type=positive(float), default=600,
                        help="seconds the whole upload may take, however fast, before it gets 408")
    parser.add_argument("--header-timeout", type=positive(float), default=10,
                        help="seconds a connection may take to send a request's headers (from its opening or "
                             "its previous response) before it is closed")
    parser.add_argument("--max-header-connections", type=positive(int), default=64,
                        help="connections still sending headers; past this the longest waiting is closed")
    parser.add_argument("--upload-dir", default=None,
                        help="directory in which the server makes its own directory for uploads in progress "
                             "(default: the system's temporary directory)")
    parser.add_argument("--vad", default=DEFAULT_VAD, choices=VADS,
                        help="voice activity detector of live sessions' server_vad: silero (trained) or "
                             "energy (frame loudness)")
    parser.add_argument("--partial-interval", type=positive(float), default=None, metavar="SECONDS",
                        help="live sessions' new audio between partials (default 0.48; at most the 8 s "
                             "window): longer, less CPU for partials")
    parser.add_argument("--device", default="cpu", choices=DEVICES, help="where to run")
    parser.add_argument("--threads", type=positive(int), default=None, help="CPU threads")
    parser.add_argument("--activations", default="auto", choices=ACTIVATIONS,
                        help="auto (default): int8 against Q8_0/Q4_K/Q6_K where the CPU has AVX2 or "
                             "AVX512-VNNI, bf16 against BF16 where it has AMX or AVX512-BF16, else exact; "
                             "exact: float32 rows in every product; int8: rows quantized per block "
                             "against Q8_0/Q4_K/Q6_K weights, as llama.cpp does (CPUs with AVX2 or "
                             "AVX512-VNNI); "
                             "bf16: rows rounded to bf16 against BF16 weights and in attention, as "
                             "Transformers' bf16 does (AMX tiles or AVX512-BF16 where the CPU has them)")
    parser.add_argument("--huge-pages", action="store_true",
                        help="read the weight matrices into a private copy in 2 MiB pages, from which "
                             "decoding streams them faster where the file's page cache is in 4 KiB pages "
                             "(more memory and load time)")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.upload_dir is not None and not os.path.isdir(args.upload_dir):
        parser.error(f"--upload-dir {args.upload_dir}: not a directory")
    try:
        import fastapi  # noqa: F401
        import python_multipart  # noqa: F401
        import uvicorn

        from nanoasr.server.connections import uvicorn_config
        from nanoasr.server.realtime import WS_MAX_BYTES
    except ImportError as exc:
        error(PROG, f"the server needs the 'server' extra ({exc.name} is missing): "
                    'pip install ".[server]" in the nanoasr checkout')
        return EXIT_FAILED
    try:
        limits = live_limits(args)
    except OptionError as exc:
        error(PROG, exc)
        return EXIT_USAGE
    with (library_warnings(lambda message: print(f"{PROG}: warning: {message}", file=sys.stderr, flush=True)),
          compile_notice(lambda message: print(f"{PROG}: {message}", file=sys.stderr, flush=True))):
        app = _app(args, limits)
        if app is None:
            return EXIT_FAILED
        server = uvicorn.Server(uvicorn_config(app, host=args.host, port=args.port,
                                               header_timeout_s=args.header_timeout,
                                               max_header_connections=args.max_header_connections,
                                               ws_max_bytes=WS_MAX_BYTES))
        try:
            server.run()
        except KeyboardInterrupt:
            pass
    return EXIT_OK if server.started else EXIT_FAILED


def _app(args, limits):
    """The app on the loaded model, its live sessions held to `limits`, or None after an error line when the
    model does not load."""
    from nanoasr.api import Model
    from nanoasr.server.app import create_app

    try:
        model = Model.load(args.model, device=args.device, threads=args.threads, llm=args.llm,
                           activations=args.activations, huge_pages=args.huge_pages)
        model.compile_beside()  # a first run: the decoder's kernels compile beside the warm-up's encoder
    except NanoasrError as exc:
        error(PROG, exc)
        return None
    app = create_app(model, api_key=args.api_key, max_upload_mb=args.max_upload_mb, max_queue=args.max_queue,
                     max_uploads=args.max_uploads, max_duration_s=args.max_duration,
                     read_timeout_s=args.read_timeout, upload_timeout_s=args.upload_timeout,
                     min_upload_kib_s=args.min_upload_rate, upload_dir=args.upload_dir, warm_up=True)
    app.state.live_limits = limits
    return app
