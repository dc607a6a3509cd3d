"""The command line: `nanoasr ...` and `python -m nanoasr ...` both run `main`, which picks the command.

    transcribe.py  nanoasr AUDIO ...      (the default: no command word)
    models.py      nanoasr models {list,info,download,remove}
    convert.py     nanoasr convert SOURCE -o OUT.gguf
    doctor.py      nanoasr doctor
    serve.py       nanoasr serve
    batch.py       nanoasr batch INPUT ... -o DIR   (many files on Ray Data; the `ray` extra)
    stream.py      nanoasr stream [INPUT]   (live transcription: partials and finals as audio arrives)

Each command is a thin layer over the library: it parses its arguments, calls nanoasr and prints. Results
go to stdout; progress, warnings and errors to stderr, one line each (`nanoasr[ COMMAND]: error: ...`).
The library's warnings (its loggers and `warnings.warn`) are shown once each while a command runs, as
`nanoasr: warning: ...` lines; the line the kernels log when a process compiles them (a first run) is shown by
the commands that transcribe, unless -q.

Exit status, the same for every command:
    0    done (--help and --version too; `doctor` always)
    1    something asked for failed: an input, the model, a download, a conversion, the server's start,
         Ray's start. Each failure is one stderr line; `transcribe` and `batch` still process the other
         inputs.
    2    usage error: a bad command line, found before any work starts: argparse's usage and message, or
         one line for an option value the library refuses (api.Options, the one validator of options)
    130  interrupted (Ctrl-C)
    141  stdout closed by its reader (`nanoasr a.wav b.wav | head -1`): the command stops at its next
         write, quietly, with the status of a process that SIGPIPE ends
"""
from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 130, 141
COMMANDS = ("models", "doctor", "convert", "serve", "batch", "stream")  # any other first word: an input
LIBRARY = Path(__file__).resolve().parents[1]  # nanoasr/: where the warnings shown as the library's come from
KERNEL_LOGGER = "nanoasr.kernels.jit"  # says, at INFO, that this process compiles the kernels (not imported)


def main(argv: list[str] | None = None) -> int:
    """Run one command (`argv` without the program name; default: sys.argv) and return its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    name, rest = (argv[0], argv[1:]) if argv and argv[0] in COMMANDS else ("transcribe", argv)
    command = importlib.import_module(f"nanoasr.cli.{name}")
    try:
        return command.main(rest)
    except SystemExit as exc:  # argparse: after a usage error, --help or --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except KeyboardInterrupt:
        print("nanoasr: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE


def _stdout_to_devnull() -> None:
    """Python flushes stdout once more at exit: into the closed pipe that would raise again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a stand-in without a descriptor (a test's capture)
        return
    os.dup2(os.open(os.devnull, os.O_WRONLY), fd)


def error(prog: str, message, file=None) -> None:
    """One error line on stderr (or `file`), whatever names the message holds (one_line)."""
    print(one_line(f"{prog}: error: {message}"), file=sys.stderr if file is None else file, flush=True)


def one_line(text) -> str:
    """`text` as one printable line: a file name's bytes that are not UTF-8 (Python's surrogate escapes) as
    \\xNN, and newlines, tabs, terminal escapes and other characters that do not print as repr() shows
    them (\\n, \\t, \\x1b), so a hostile name can neither split an error line nor fail to be printed."""
    text = str(text)
    return text if text.isprintable() else "".join(ch if ch.isprintable() else _escaped(ch) for ch in text)


def _escaped(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for the byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    return repr(ch)[1:-1]


def positive(kind):
    """An argparse type: a finite number of `kind` greater than 0."""
    def parse(text: str):
        value = kind(text)
        if not (0 < value < math.inf):  # also refuses nan and inf, which float() accepts
            what = "a whole number" if kind is int else "a finite number"
            raise argparse.ArgumentTypeError(f"must be {what} greater than 0; got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its "invalid int value" message
    return parse


def live_limits(args, **more):
    """nanoasr.realtime.Limits of a live command's --vad and --partial-interval (OptionError naming the option
    where Limits refuses the interval)."""
    from nanoasr.errors import OptionError
    from nanoasr.realtime import PARTIAL_WINDOW_S, Limits

    cadence = {} if args.partial_interval is None else {"partial_interval_s": args.partial_interval}
    try:
        return Limits(vad=args.vad, **cadence, **more)
    except OptionError as exc:
        if exc.field != "partial_interval_s":
            raise
        raise OptionError(f"--partial-interval must be at most {PARTIAL_WINDOW_S:g} s (the window a partial "
                          f"decodes); got {args.partial_interval:g}", "partial_interval") from None


class _LineHandler(logging.Handler):
    def __init__(self, show, level=logging.WARNING):
        super().__init__(level)
        self.show = show

    def emit(self, record: logging.LogRecord) -> None:
        self.show(record.getMessage())


@contextmanager
def compile_notice(show):
    """Inside the block, the kernels' INFO line that this process is compiling them (nanoasr/kernels/jit.py,
    once a process) is passed to `show(message)`; the logger is put back as it was afterwards. Its warnings
    still go where library_warnings sends them."""
    logger = logging.getLogger(KERNEL_LOGGER)
    handler, level = _LineHandler(show, logging.INFO), logger.level
    handler.addFilter(lambda record: record.levelno == logging.INFO)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@contextmanager
def library_warnings(show):
    """Inside the block, each warning the library logs (the `nanoasr` loggers) or raises with warnings.warn
    is passed to `show(message)` once, and nowhere else. Both are put back as they were afterwards, so a
    program that calls main() keeps its own logging setup."""
    logger = logging.getLogger("nanoasr")
    handler, propagate = _LineHandler(show), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # shown by `show`, not a second time by the root logger's handlers
    try:
        with warnings.catch_warnings():  # restores warnings.showwarning on the way out
            others = warnings.showwarning

            def showwarning(message, category, filename, lineno, file=None, line=None):
                if Path(filename).resolve().is_relative_to(LIBRARY):
                    show(str(message))
                else:
                    others(message, category, filename, lineno, file, line)

            warnings.showwarning = showwarning
            yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
