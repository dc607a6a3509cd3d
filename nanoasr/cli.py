"""python -m nanoasr: transcripts on stdout, progress and errors on stderr.

Sub-commands (`models`, `doctor`, `convert`, `serve`) live in their own modules, imported on use.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from nanoasr.errors import NanoasrError

SUBCOMMANDS = {
    "models": "nanoasr.cli_models",
    "doctor": "nanoasr.doctor",
    "convert": "nanoasr.cli_convert",
    "serve": "nanoasr.server",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nanoasr",
        description="Offline speech-to-text with Fun-ASR-Nano. Other commands: "
                    + ", ".join(f"'nanoasr {name} --help'" for name in SUBCOMMANDS),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("audio", nargs="+", help="audio files to transcribe")
    parser.add_argument("--model", default=None,
                        help="checkpoint directory or .gguf file, hub id org/repo[@revision], or package name "
                             "(default: the official safetensors package at its pinned revision)")
    parser.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"), help="where to run")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    parser.add_argument("--language", default=None, help="zh, en, ja (codes, English or Chinese names) or auto")
    parser.add_argument("--no-itn", dest="itn", action="store_false", help="no inverse text normalisation")
    parser.add_argument("--hotword", action="append", default=[], help="a word to favour (repeatable)")
    parser.add_argument("--context", default=None, help="free text describing the recording")
    parser.add_argument("--reference", default="funasr", choices=("funasr", "transformers"),
                        help="numerics profile to follow")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="token budget per segment (default: scaled to its duration, at most 512)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])
    args = build_parser().parse_args(argv)
    from nanoasr.api import Model

    try:
        model = Model.load(args.model, device=args.device, threads=args.threads)
    except NanoasrError as exc:
        print(f"nanoasr: error: {exc}", file=sys.stderr)
        return 1
    failed = 0
    for path in args.audio:
        try:
            result = model.transcribe(path, language=args.language, itn=args.itn, hotwords=args.hotword,
                                      context=args.context, reference=args.reference,
                                      max_new_tokens=args.max_new_tokens)
        except NanoasrError as exc:
            print(f"nanoasr: error: {path}: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(result.text, flush=True)
    return 1 if failed else 0
