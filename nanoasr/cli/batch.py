"""nanoasr batch INPUT ... -o DIR: many audio files transcribed on Ray Data, on this machine or a cluster.

Each input's files are those the main command's -o writes (DIR/<name>.<format>), each written whole (to a
temporary name beside it, then renamed), and once they are complete one JSON line is appended to
DIR/manifest.jsonl. Running the same command again skips the inputs whose line says ok and whose files all
exist, and tries the others again (their old lines are dropped first), so an interrupted run loses at most
the inputs in flight. Transcripts are written by this process, the driver: the cluster needs no shared disk
for them, only for the inputs.

Exit status (see nanoasr.cli): 0 every input transcribed, 1 some failed (one stderr line each; the rest are
still done) or Ray could not run the job, 2 usage error, 130 interrupted.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from pathlib import Path

from nanoasr.cli import (EXIT_FAILED, EXIT_OK, EXIT_USAGE, error, library_warnings, one_line, positive,
                         transcribe)
from nanoasr.errors import ModelError, OptionError
from nanoasr.untrusted import load_json
from nanoasr.writers import json_text, write_whole

PROG = "nanoasr batch"
MANIFEST = "manifest.jsonl"
RAY_LOG = "ray.log"  # what Ray writes to stderr under -q
EPILOG = """\
Files are written as the main command's -o writes them, DIR/<name>.<format>, each one complete or not at
all, and DIR/manifest.jsonl gets one line per input once its files are written: {"path", "status" (ok or
error), "outputs" (below DIR), "seconds", "duration_s", "error"}. Running the same command again skips the
inputs done already (status ok, files present) and retries the rest. Under -q, what Ray itself writes to
stderr is appended to DIR/ray.log instead. An input whose name Ray cannot
carry (bytes that are not UTF-8, a tab, newline or carriage return) gets its error line without Ray;
`nanoasr FILE` reads such names. Inputs longer than --max-duration (an hour unless raised) are refused.
Exit status: 0 all inputs transcribed, 1 some failed, 2 usage error, 130 interrupted.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, epilog=EPILOG, formatter_class=transcribe._HelpFormatter,
        description="Transcribe many audio files on Ray Data: a local Ray runtime, or the cluster of "
                    "--ray-address. Needs the ray extra: pip install \".[ray]\" in the checkout.")
    parser.add_argument("audio", nargs="+", metavar="INPUT",
                        help="audio files, and directories (their audio files)")
    parser.add_argument("-o", "--output-dir", required=True, metavar="DIR",
                        help="where the transcripts and manifest.jsonl go, created if missing")
    model = parser.add_argument_group("model")
    model.add_argument("--model", default=None,
                       help="as the main command's --model; a local path must exist on every Ray node "
                            "(default: $NANOASR_MODEL or the config file's model, else the official "
                            "safetensors package at its pinned revision)")
    model.add_argument("--llm", default=None, metavar="QWEN3.gguf",
                       help="the decoder GGUF when --model is the encoder GGUF of FunASR's llama.cpp runtime")
    ray = parser.add_argument_group("ray")
    ray.add_argument("--workers", type=positive(int), default=None, metavar="N",
                     help="Ray actors, each with its own copy of the model (default: Ray Data grows the pool "
                          "from 1 to as many as the cluster's CPUs hold)")
    ray.add_argument("--threads-per-worker", type=positive(int), default=1, metavar="T",
                     help="CPU threads of each actor, and the CPUs it reserves")
    ray.add_argument("--ray-address", default=None, metavar="ADDRESS",
                     help="join this Ray cluster (default: $RAY_ADDRESS, which `ray job submit` sets; "
                          "without it, start a local Ray runtime on this machine's CPUs)")
    transcribe.add_transcription_options(parser)
    output = parser.add_argument_group("input and output")
    transcribe.add_format_options(output)
    transcribe.add_duration_option(output, "each with its error")
    output.add_argument("-v", "--verbose", action="store_true", help="a line for each input done")
    output.add_argument("-q", "--quiet", action="store_true",
                        help="no Ray progress bars, Ray logs or workers' output (what Ray writes to stderr "
                             "goes to DIR/ray.log), and no closing summary line")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    formats = transcribe.parse_formats(args.output_format, parser)
    if transcribe.STDIN in args.audio:
        parser.error("'-' (stdin) is not an input of batch: give files or directories")
    transcribe.check_cue_options(args, parser)
    try:
        transcribe.check_language(args.model, args.language)
        options = transcribe.transcribe_options(args, parser)
    except OptionError as exc:
        error(PROG, exc)
        return EXIT_USAGE
    except ModelError as exc:  # the default model's setting cannot be read
        error(PROG, exc)
        return EXIT_FAILED
    options["max_duration_s"] = args.max_duration
    found, failures = transcribe.expand_inputs(args, parser)
    items = {}
    for item in found:  # an input named twice (a file, and its directory) is done once
        items.setdefault(_key(item), item)
    out_dir = Path(args.output_dir)
    transcribe.check_collisions(list(items.values()), out_dir, parser)
    for line in failures:
        error(PROG, line)
    try:
        return _run(args, items, formats, options, out_dir, failed=len(failures))
    except OSError as exc:  # the output directory or the manifest cannot be written
        error(PROG, exc)
        return EXIT_FAILED


def _key(item) -> str:
    """How an input is known to Ray's rows and to the manifest: its absolute path."""
    return os.path.abspath(item.source)


# --- the run ---------------------------------------------------------------------------------------------

class Tally:
    """Counts, nanoasr's own lines (errors, warnings, those of --verbose) and the closing summary."""

    def __init__(self, args, todo: int, skipped: int, failed: int):
        self.verbose, self.quiet = args.verbose, args.quiet
        self.todo, self.skipped, self.failed, self.ok = todo, skipped, failed, 0
        self.started = time.perf_counter()
        self.stream = sys.stderr  # where its lines go: the original stderr while Ray's is put aside (-q)
        self.ray_log: Path | None = None  # where Ray's stderr went, if put aside

    def error(self, message) -> None:
        error(PROG, message, file=self.stream)

    def warn(self, message) -> None:
        print(one_line(f"{PROG}: warning: {message}"), file=self.stream, flush=True)

    def ray_failed(self, message: str) -> int:
        """The error line of a run Ray could not do, naming where Ray's own lines went under -q."""
        self.error(message if self.ray_log is None else f"{message} (Ray's log: {self.ray_log})")
        return EXIT_FAILED

    def done(self, item, line: dict) -> None:
        if line["status"] == "ok":
            self.ok += 1
        else:
            self.failed += 1
            self.error(line["error"])
        if self.verbose:
            finished = self.ok + self.failed
            audio = f"{line['duration_s']:.1f} s of audio" if line["duration_s"] is not None else "failed"
            done = f"{PROG}: [{finished}/{self.todo}] {item.label}: {audio} in {line['seconds']:.1f} s"
            print(one_line(done), file=self.stream, flush=True)

    def summary(self, manifest_path: Path) -> int:
        if not self.quiet:
            print(f"{PROG}: {self.ok} transcribed, {self.failed} failed, {self.skipped} done before; "
                  f"{time.perf_counter() - self.started:.1f} s; {manifest_path}", file=sys.stderr, flush=True)
        return EXIT_FAILED if self.failed else EXIT_OK


def _run(args, items: dict, formats, options: dict, out_dir: Path, failed: int) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(out_dir / MANIFEST)
    todo = {key: item for key, item in items.items()
            if not manifest.done(key, [out_dir / f"{item.stem}.{fmt}" for fmt in formats])}
    manifest.forget(todo)
    tally = Tally(args, len(todo), len(items) - len(todo), failed)
    with library_warnings(tally.warn):
        for key in list(todo):  # each of these would fail the whole Ray job, not its own row
            problem = _unreadable(key)
            if problem is not None:
                item = todo.pop(key)
                tally.done(item, manifest.add(key, "error", error=f"{one_line(item.label)}: {problem}"))
        if todo:
            try:
                from nanoasr.ray import require_ray

                ray = require_ray()
            except ImportError as exc:
                tally.error(exc)
                return EXIT_FAILED
            with _ray_stderr_aside(out_dir / RAY_LOG if args.quiet else None, tally, ray):
                code = _on_ray(args, todo, options, formats, out_dir, manifest, tally)
            if code is not None:
                return code
    return tally.summary(manifest.path)


def _on_ray(args, todo: dict, options: dict, formats, out_dir: Path, manifest: "Manifest", tally: Tally):
    """The inputs of `todo` transcribed on Ray, each one's files and manifest line written as its row comes
    back; EXIT_FAILED when Ray could not run the job, else None."""
    import ray

    try:
        rows = _transcripts(args, list(todo), options)
    except (ConnectionError, RuntimeError, UnicodeError) as exc:  # ray.init: no cluster, or refused
        return tally.ray_failed(f"cannot start or join Ray: {exc}")
    try:
        for row in rows.iter_rows():
            item = todo[row["path"]]
            lines = (args.max_line_width, args.max_line_count)
            tally.done(item, _finish(row, item, formats, out_dir, manifest, lines))
    except ray.exceptions.RayError as exc:
        return tally.ray_failed(f"the Ray job failed: {_last_line(exc)}")
    return None


@contextlib.contextmanager
def _ray_stderr_aside(log: Path | None, tally: Tally, ray):
    """With a `log` (-q): the process's stderr, file descriptor 2, appended to `log` from before Ray starts
    until it is shut down, and tally's lines sent to the original stderr meanwhile. Ray's C++ core writes
    its error lines to descriptor 2 itself, whatever Ray's Python logging is set to (an actor whose
    constructor arguments are in the object store, as Ray Data's always are, gets one such line), and Ray's
    Python logging writes to whatever sys.stderr is when it logs: both land in `log`."""
    if log is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, 2)
    os.close(target)
    tally.stream = open(saved, "w", encoding=sys.stderr.encoding, errors="backslashreplace", closefd=False)
    tally.ray_log = log
    try:
        yield
    finally:
        try:
            ray.shutdown()  # here rather than at exit, so that what Ray writes on its way out goes to `log`
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            tally.stream.close()
            os.close(saved)
            tally.stream, tally.ray_log = sys.stderr, None


def _unreadable(key: str) -> str | None:
    """Why an input cannot go to Ray: no readable file there, or a name Ray's paths cannot carry."""
    if not (os.path.isfile(key) and os.access(key, os.R_OK)):
        return "no such readable file"
    from nanoasr.ray import path_problem

    problem = path_problem(key)
    return None if problem is None else f"{problem}; rename it, or transcribe it with `nanoasr FILE`"


def _transcripts(args, paths: list[str], options: dict):
    """Ray started or joined, and the lazy Dataset of the transcript rows of `paths`."""
    from nanoasr.ray import init_ray, most_workers, require_ray, transcribe_dataset

    ray = require_ray()
    address = args.ray_address or os.environ.get("RAY_ADDRESS")
    where = dict(address=address) if address else dict(address="local", include_dashboard=False)
    if args.quiet:  # failures still come back, as the rows' errors: every other line Ray has is noise here
        init_ray(logging_level=logging.ERROR, log_to_driver=False, **where)
        for name in ("ray", "ray.data"):
            logging.getLogger(name).setLevel(logging.ERROR)
    else:
        init_ray(logging_level=logging.WARNING, **where)
    ray.data.DataContext.get_current().enable_progress_bars = not args.quiet
    # The reads take no CPU: the actors may hold every CPU, and Ray starts them before any read task. One
    # block per file: a block is what an actor hands back whole, and what a lost actor's retry does again.
    # As many reads at a time as actors: enough to keep them fed, without a Ray worker process for each file.
    readers = args.workers or most_workers(args.threads_per_worker)
    audio = ray.data.read_binary_files(paths, include_paths=True, num_cpus=0, override_num_blocks=len(paths),
                                       concurrency=readers)
    return transcribe_dataset(audio, args.model, workers=args.workers,
                              threads_per_worker=args.threads_per_worker, llm=args.llm, **options)


def _finish(row: dict, item, formats, out_dir: Path, manifest: "Manifest", lines) -> dict:
    """The input's files written from its row, then its manifest line (returned)."""
    from nanoasr.ray import to_transcript

    seconds = (row["timings"] or {}).get("total", 0.0) / 1e3
    if row["error"] is not None:
        return manifest.add(row["path"], "error", seconds=seconds, error=row["error"])
    transcript = to_transcript(row)
    outputs = []
    try:
        for fmt in formats:
            path = out_dir / f"{item.stem}.{fmt}"
            write_whole(path, transcribe.render(transcript, fmt, item.label, False, lines))
            outputs.append(path.relative_to(out_dir).as_posix())
    except (OSError, UnicodeError) as exc:
        return manifest.add(row["path"], "error", seconds=seconds,
                            error=f"{one_line(item.label)}: cannot write its output: {exc}")
    return manifest.add(row["path"], "ok", outputs, seconds, transcript.duration_s)


def _last_line(exc: BaseException) -> str:
    """The last line of a Ray error's message: the exception raised at its root."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


# --- files -----------------------------------------------------------------------------------------------

class Manifest:
    """DIR/manifest.jsonl: one JSON line per input, appended once the input's files are complete."""

    def __init__(self, path: Path):
        self.path = path
        self.lines: dict[str, dict] = {}  # input path -> its line
        data = path.read_bytes() if path.is_file() else b""
        self.damaged = bool(data) and not data.endswith(b"\n")  # a line cut short when a run was killed
        for raw in data.splitlines():
            try:
                line = _checked_line(load_json(raw))  # deep nesting and huge integers are ValueErrors too
            except ValueError:
                self.damaged = True  # dropped, and the file rewritten without it before the run
                continue
            self.lines[line["path"]] = line

    def done(self, key: str, outputs: list[Path]) -> bool:
        line = self.lines.get(key)
        return line is not None and line.get("status") == "ok" and all(p.is_file() for p in outputs)

    def forget(self, keys) -> None:
        """Drop the lines of `keys`, inputs about to be tried again, rewriting the file whole when it
        changes (or was damaged)."""
        dropped = [key for key in keys if self.lines.pop(key, None) is not None]
        if dropped or self.damaged:
            write_whole(self.path, "".join(_json_line(line) for line in self.lines.values()))
            self.damaged = False

    def add(self, key: str, status: str, outputs=(), seconds: float = 0.0, duration_s: float | None = None,
            error: str | None = None) -> dict:
        line = dict(path=key, status=status, outputs=list(outputs), seconds=round(seconds, 3),
                    duration_s=duration_s, error=error)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(_json_line(line))
            f.flush()
            os.fsync(f.fileno())
        self.lines[key] = line
        return line


LINE_FIELDS = {"path": (str,), "status": (str,), "outputs": (list,), "seconds": (int, float),
               "duration_s": (int, float, type(None)), "error": (str, type(None))}


def _checked_line(line) -> dict:
    """A manifest line as this module writes it, its known fields only; ValueError for anything else."""
    if not isinstance(line, dict) or not isinstance(line.get("path"), str):
        raise ValueError("not a manifest line")
    kept = {key: line[key] for key in LINE_FIELDS if key in line}
    if any(not isinstance(value, LINE_FIELDS[key]) or isinstance(value, bool) for key, value in kept.items()):
        raise ValueError("a field of the wrong type")
    if not all(isinstance(output, str) for output in kept.get("outputs", [])):
        raise ValueError("an output that is not a path")
    return kept


def _json_line(line: dict) -> str:
    return json_text(line) + "\n"  # an input name that is not UTF-8 as \\u escapes, read back the same
