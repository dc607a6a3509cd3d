"""nanoasr convert: a checkpoint (directory, .gguf, FunASR model.pt or hub id) -> a nanoasr GGUF of one type.

A one-line summary goes to stdout, the per-tensor error table to --report FILE; progress (on a terminal),
warnings and errors to stderr. Existing files are left alone unless --force is given. Exit status as in
nanoasr.cli.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
from pathlib import Path

from nanoasr.cli import EXIT_FAILED, EXIT_OK, error, library_warnings, transcribe
from nanoasr.errors import NanoasrError

PROG = "nanoasr convert"


def build_parser() -> argparse.ArgumentParser:
    from nanoasr.convert import TARGETS

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0],
                                     formatter_class=transcribe._HelpFormatter)
    parser.add_argument("source",
                        help="checkpoint directory, .gguf or FunASR model.pt file, "
                             "or hub id org/name[@revision]")
    parser.add_argument("--llm", default=None, metavar="QWEN3.gguf",
                        help="the decoder GGUF when the source is FunASR's llama.cpp encoder GGUF")
    parser.add_argument("--type", dest="target", choices=TARGETS, default="q8_0",
                        help="GGUF type (mix) to write")
    parser.add_argument("--output", "-o", required=True, help="the .gguf file to write")
    parser.add_argument("--report", default=None, metavar="FILE",
                        help="write the per-tensor table (type, bytes, error) here: JSON rows when FILE ends "
                             "in .json, else a text table")
    parser.add_argument("--force", action="store_true", help="overwrite the output files if they exist")
    parser.add_argument("--revision", default=None, help="hub revision to download and record as the source")
    parser.add_argument("--repo", default=None,
                        help="hub id to record as the source of a local directory "
                             "(found from an HF cache path)")
    parser.add_argument("--export-qwen3-gguf", metavar="OUT", default=None,
                        help="also write the decoder alone as a stock llama.cpp qwen3 GGUF of the same type")
    return parser


def resolve(source: str, revision: str | None) -> tuple[Path, str | None, str | None]:
    """(local path, repo, revision): what nanoasr.hub makes of `source` (local files with the provenance their
    HF cache path or package manifest tells; hub ids downloaded), with `revision` for a local source that
    tells none."""
    from nanoasr import hub

    resolved = hub.resolve(source, revision=revision)
    return Path(resolved.path), resolved.repo, resolved.revision or revision


def tensor_progress(stream):
    """The writer's progress: one line rewritten in place on a terminal; nothing elsewhere (a log would get
    a line per tensor)."""
    if not stream.isatty():
        return None

    def show(done: int, total: int, name: str, stored_type: str) -> None:
        stream.write(f"\r[{done}/{total}] {stored_type:>4} {name}\033[K" + ("\n" if done == total else ""))
        stream.flush()

    return show


def format_table(rows: list[dict]) -> str:
    width = max(len(r["name"]) for r in rows)
    lines = [f"{'tensor':<{width}}  {'type':<5} {'shape':<14} {'bytes':>12} {'rel_rms':>10} {'max_abs':>10}"]
    for r in rows:
        errors = ("-", "-") if r["rel_rms"] is None else (f"{r['rel_rms']:.3e}", f"{r['max_abs']:.3e}")
        lines.append(f"{r['name']:<{width}}  {r['type']:<5} {'x'.join(map(str, r['shape'])):<14} "
                     f"{r['bytes']:>12,} {errors[0]:>10} {errors[1]:>10}")
    return "\n".join(lines)


def summary(input_bytes: int, output: Path, rows: list[dict]) -> str:
    """One line: the file, its size against the input's, its tensor types and the largest error."""
    output_bytes = output.stat().st_size
    counts = collections.Counter(r["type"] for r in rows)
    worst = max((r for r in rows if r["rel_rms"] is not None), key=lambda r: r["rel_rms"], default=None)
    line = (f"{output}: {output_bytes:,} bytes ({output_bytes / input_bytes:.3f} x input), "
            + ", ".join(f"{n} {t}" for t, n in sorted(counts.items())))
    if worst is not None:
        line += f"; largest relative RMS error {worst['rel_rms']:.3e} ({worst['name']}, {worst['type']})"
    return line


def save_report(path: Path, rows: list[dict]) -> None:
    """The rows as JSON or a table, written beside `path` and renamed onto it."""
    from nanoasr.formats import gguf_write

    text = json.dumps(rows, indent=1) if path.suffix == ".json" else format_table(rows)
    partial = gguf_write.partial_path(path)
    try:
        partial.write_text(text + "\n", encoding="utf-8")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def existing_output(args) -> str | None:
    """The first output file that exists already, unless --force allows overwriting it."""
    outputs = (args.output, args.report, args.export_qwen3_gguf)
    return None if args.force else next((o for o in outputs if o and Path(o).exists()), None)


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    existing = existing_output(args)
    if existing:
        parser.error(f"{existing} exists; --force overwrites it")
    with library_warnings(lambda message: print(f"{PROG}: warning: {message}", file=sys.stderr, flush=True)):
        try:
            run(args)
        except NanoasrError as exc:
            error(PROG, exc)
            return EXIT_FAILED
    return EXIT_OK


def run(args) -> None:
    """Read the source, write the GGUF (and the qwen3 export) and the report, print the summary."""
    from nanoasr import convert
    from nanoasr.checkpoints.load import load_checkpoint

    path, repo, revision = resolve(args.source, args.revision)
    print(f"reading {path}", file=sys.stderr)
    checkpoint = load_checkpoint(path, args.llm)
    repo = args.repo or repo or checkpoint.source.get("repo")
    recorded = dict(checkpoint.source, repo=repo, revision=revision)
    source = {k: v for k, v in recorded.items() if v is not None}
    checkpoint = dataclasses.replace(checkpoint, source=source)
    output, progress = Path(args.output), tensor_progress(sys.stderr)
    rows = convert.write(output, checkpoint, args.target, report=True, progress=progress)
    print(summary(sum(t.nbytes for t in checkpoint.tensors.values()), output, rows))
    if args.report:
        save_report(Path(args.report), rows)
    if args.export_qwen3_gguf:
        qwen3 = Path(args.export_qwen3_gguf)
        convert.write_qwen3(qwen3, checkpoint, args.target, report=False, progress=progress)
        print(f"qwen3 decoder: {qwen3.stat().st_size:,} bytes {qwen3}")
