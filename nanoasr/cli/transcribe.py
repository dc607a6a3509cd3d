"""nanoasr AUDIO ...: transcripts on stdout; progress, warnings and errors on stderr.

Exit status (see nanoasr.cli): 0 when every input was transcribed, 1 when any failed (one stderr line each,
the rest are still processed) or the model could not be loaded, 2 for a usage error.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from nanoasr.audio.fbank import REFERENCES
from nanoasr.audio.io import DEFAULT_MAX_DURATION_S, path_problem
from nanoasr.audio.segment import DEFAULT_SEGMENT_VAD, SEGMENT_VADS
from nanoasr.backend import ACTIVATIONS, DEVICES
from nanoasr.cli import (COMMANDS, EXIT_FAILED, EXIT_OK, EXIT_USAGE, compile_notice, error, library_warnings,
                         one_line, positive)
from nanoasr.errors import ModelError, NanoasrError, OptionError
from nanoasr.writers import FORMATS, json_text, write_whole

PROG = "nanoasr"
# What a directory argument contributes: the files whose suffix some decoder reads (ffmpeg for the video
# containers), so notes, images and transcripts lying beside the audio are not reported as failures.
AUDIO_SUFFIXES = frozenset(
    ".wav .flac .ogg .oga .opus .mp3 .aiff .aif .m4a .m4b .mp4 .aac .webm .mkv .mka .mov .wma .amr .3gp .ac3"
    .split())
STDIN = "-"
EPILOG = """\
Without -o, each transcript is printed on stdout in the -f format (txt: its text on one line; json:
one JSON object per line). With -o DIR, files DIR/<name>.<format> are written, each whole or not at
all (existing ones are replaced; --skip-existing skips inputs whose outputs all exist) and the text
still goes to stdout. Inputs longer than --max-duration (an hour unless raised) are refused, from the
length their header states where it states one, before they are decoded.
Segment times come from the segmenter (speech stretches of at most 30 s). --word-timestamps times each
word by forced alignment against FunASR's CTC branch, which only the ModelScope copy of Fun-ASR-Nano-2512's
model.pt carries: json gets each segment's words, srt/vtt cues take word times, tsv gets a row per word.
Exit status: 0 all inputs transcribed, 1 some failed, 2 usage error.
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every optional option's help ends with its default; None and False read as 'none' and 'off'."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default:" in text or action.default is argparse.SUPPRESS or not action.option_strings
                or action.required):
            return text
        default = action.default
        if default is None or default == []:
            default = "none"
        elif default is False:
            default = "off"
        elif default is True:
            default = "on"
        return f"{text} (default: {default})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Offline speech-to-text with Fun-ASR-Nano.\nOther commands: "
                    + ", ".join(f"nanoasr {name}" for name in COMMANDS) + " (each has --help).",
        epilog=EPILOG, formatter_class=_HelpFormatter,
    )
    parser.add_argument("audio", nargs="+",
                        help="audio files, directories (their audio files) or '-' for audio on stdin")
    parser.add_argument("--version", action="version", version=f"nanoasr {_version()}")
    model = parser.add_argument_group("model")
    model.add_argument("--model", default=None,
                       help="checkpoint directory, .gguf or FunASR model.pt file, hub id "
                            "org/repo[@revision], or package name (default: $NANOASR_MODEL or the config "
                            "file's model, else the official safetensors package at its pinned revision)")
    model.add_argument("--llm", default=None, metavar="QWEN3.gguf",
                       help="the decoder GGUF (a llama.cpp qwen3 file) when --model is the encoder GGUF of "
                            "FunASR's llama.cpp runtime")
    model.add_argument("--device", default="cpu", choices=DEVICES, help="where to run")
    model.add_argument("--threads", type=positive(int), default=None, metavar="N",
                       help="CPU threads for numba and BLAS (default: all cores)")
    model.add_argument("--activations", default="auto", choices=ACTIVATIONS,
                       help="auto (default): int8 against Q8_0/Q4_K/Q6_K where the CPU has AVX2 or "
                            "AVX512-VNNI, bf16 against BF16 where it has AMX or AVX512-BF16, else exact; "
                            "exact: float32 rows in every product; int8: rows quantized per block "
                            "against Q8_0/Q4_K/Q6_K weights, as llama.cpp does (CPUs with AVX2 or "
                            "AVX512-VNNI); "
                            "bf16: rows rounded to bf16 against BF16 weights and in attention, as "
                            "Transformers' bf16 does (AMX tiles or AVX512-BF16 where the CPU has them)")
    model.add_argument("--huge-pages", action="store_true",
                       help="read the weight matrices into a private copy in 2 MiB pages, from which "
                            "decoding streams them faster where the file's page cache is in 4 KiB pages "
                            "(more memory and load time; see docs/cli.md)")
    add_transcription_options(parser)
    _add_output_options(parser)
    return parser


def add_transcription_options(parser: argparse.ArgumentParser) -> None:
    """The options of Model.transcribe (read back by transcribe_options); `nanoasr batch` has them too."""
    decoding = parser.add_argument_group("transcription")
    decoding.add_argument("--language", default=None,
                          help="zh, en or ja (codes, English or Chinese names); auto or none detects it")
    decoding.add_argument("--itn", action=argparse.BooleanOptionalAction, default=True,
                          help="inverse text normalisation: punctuation, digits; --no-itn gives spoken forms")
    decoding.add_argument("--hotword", action="append", default=[], metavar="WORD",
                          help="a word or name to favour, best-effort (repeatable)")
    decoding.add_argument("--hotwords-file", default=None, metavar="FILE",
                          help="UTF-8 file of hotwords, one per line; blank lines and '#' comments skipped")
    decoding.add_argument("--context", default=None, help="free text describing the recording")
    decoding.add_argument("--reference", default="funasr", choices=REFERENCES,
                          help="numerics profile to follow")
    decoding.add_argument("--vad", default=DEFAULT_SEGMENT_VAD, choices=SEGMENT_VADS,
                          help="speech detector of the segmenter: silero (trained) or energy (loudness)")
    decoding.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                          help="token budget per segment (default: scaled to its duration, at most 512)")
    decoding.add_argument("--word-timestamps", action="store_true",
                          help="word (Chinese/Japanese: character) times from the CTC branch of FunASR's "
                               "ModelScope model.pt, and its greedy text as a second opinion")


def add_format_options(output) -> None:
    """The formats, subtitle lines and directory walk, as this command and `batch` both take them."""
    output.add_argument("-f", "--output-format", default="txt", metavar="FORMAT",
                        help=f"{', '.join(FORMATS)} or all; several separated by commas")
    output.add_argument("--max-line-width", type=positive(int), default=None, metavar="N",
                        help="with --word-timestamps: at most N characters a subtitle line (whole words)")
    output.add_argument("--max-line-count", type=positive(int), default=None, metavar="N",
                        help="with --max-line-width: at most N lines a subtitle cue")
    output.add_argument("-r", "--recursive", action="store_true",
                        help="directories: also the audio files in their subdirectories")


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    output = parser.add_argument_group("input and output")
    add_format_options(output)
    output.add_argument("-o", "--output-dir", default=None, metavar="DIR",
                        help="write one file per input and format here, created if missing "
                             "(default: none, print on stdout)")
    add_duration_option(output, "with one error line each")
    output.add_argument("--skip-existing", action="store_true",
                        help="with -o: skip an input whose output files all exist already")
    output.add_argument("-v", "--verbose", action="store_true",
                        help="progress as log lines even when stderr is not a terminal, with each segment")
    output.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bar, even on a terminal, and no line when a first run compiles the "
                             "kernels")


def add_duration_option(output, each: str) -> None:
    """--max-duration, as this command and `batch` both take it: the limit the server applies too."""
    output.add_argument("--max-duration", type=positive(float), default=DEFAULT_MAX_DURATION_S,
                        metavar="SECONDS",
                        help=f"refuse inputs longer than this, {each}; raise it for longer recordings "
                             "(decoding holds about 0.5 GB of memory an hour of audio)")


def _version() -> str:
    from nanoasr import __version__

    return __version__


# --- inputs and outputs ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Item:
    """One input: what decode_audio reads, the name errors use, and its output path without suffix."""

    source: object
    label: str
    stem: Path


def expand_inputs(args, parser) -> tuple[list[Item], list[str]]:
    """Items for the positional arguments, and a failure line for each directory without audio."""
    if args.audio.count(STDIN) > 1:
        parser.error("'-' (stdin) can be given once only")
    items, failures = [], []
    for arg in args.audio:
        if arg == STDIN:
            items.append(Item(sys.stdin.buffer, "<stdin>", Path("stdin")))
        elif Path(arg).is_dir():
            found = _audio_files(Path(arg), args.recursive)
            if not found:
                where = "in it or below" if args.recursive else "directly in it (see --recursive)"
                failures.append(f"{arg}: a directory with no audio files {where}")
            items.extend(Item(str(f), str(f), f.relative_to(arg).with_suffix("")) for f in found)
        else:
            items.append(Item(arg, arg, Path(Path(arg).stem)))
    return items, failures


def _audio_files(folder: Path, recursive: bool) -> list[Path]:
    candidates = folder.rglob("*") if recursive else folder.iterdir()
    return sorted(p for p in candidates
                  if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def parse_formats(text: str, parser) -> tuple[str, ...]:
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if "all" in names:
        return FORMATS
    bad = [n for n in names if n not in FORMATS]
    if bad or not names:
        parser.error(f"-f/--output-format must be {', '.join(FORMATS)} or all, comma-separated; got {text!r}")
    return tuple(dict.fromkeys(names))


def check_collisions(items: list[Item], out_dir: Path, parser) -> None:
    seen = {}
    for item in items:
        other = seen.setdefault(item.stem, item.label)
        if other != item.label:
            parser.error(one_line(f"{other} and {item.label} would both write {out_dir / item.stem}.*; "
                                  "give them separately with different -o directories"))


def read_hotwords(path: str, parser) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        parser.error(f"--hotwords-file {path}: cannot read it as UTF-8 text: {exc}")
    return [s for s in (line.strip() for line in lines) if s and not s.startswith("#")]


def render(transcript, fmt: str, label: str, compact: bool, lines=(None, None)) -> str:
    """`lines`: (max_line_width, max_line_count) for word-timed subtitles."""
    from nanoasr import writers

    if fmt != "json":
        return writers.render(transcript, fmt, *lines)
    out = dict(source=label, **transcript.to_dict())
    return json_text(out, indent=None if compact else 2) + "\n"  # a name that is not UTF-8 as \\u escapes


# --- progress on stderr ----------------------------------------------------------------------------------

def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class Progress:
    """A bar rewritten in place on a terminal; with `verbose`, log lines instead (any stderr). Error and
    warning lines about the input being transcribed are led by its name."""

    WIDTH = 24
    TOKENS_PER_S = 4.0  # about the rate of speech in tokens: how far into its segment a partial text reaches

    def __init__(self, stream, bar: bool, verbose: bool):
        self.stream, self.bar, self.verbose = stream, bar and not verbose, verbose
        self.drawn = False
        self.index = self.total = 0
        self.label, self.duration = "", 0.0

    def begin(self, index: int, total: int, label: str):
        """Input `index` of `total`, before it is decoded: from here on, its errors and warnings carry its
        name."""
        self.index, self.total, self.label, self.duration = index, total, label, 0.0

    def start(self, duration: float):
        """The input is decoded: `duration` seconds of audio to transcribe."""
        self.duration = duration
        if self.verbose:
            self.line(f"nanoasr: [{self.index}/{self.total}] {self.label}: {duration:.1f} s of audio")
        self.draw(0.0)

    def segment(self, segment):
        if self.verbose:
            self.line(f"[{_clock(segment.start)} --> {_clock(segment.end)}] {segment.text.strip()}")
        self.draw(segment.end)

    def partial(self, segment):
        """The earliest unfinished segment as far as it is decoded: the bar moves through its span."""
        self.draw(min(segment.start + len(segment.token_ids) / self.TOKENS_PER_S, segment.end))

    def draw(self, done_s: float):
        if not self.bar:
            return
        fraction = min(done_s / self.duration, 1.0) if self.duration > 0 else 1.0
        filled = int(round(fraction * self.WIDTH))
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        label = one_line(self.label)
        name = label if len(label) <= 40 else "..." + label[-37:]
        self.stream.write(f"\r\x1b[K[{self.index}/{self.total}] {name} |{bar}| {fraction:4.0%} "
                          f"{_clock(done_s)}/{_clock(self.duration)}")
        self.stream.flush()
        self.drawn = True

    def error(self, message):
        self.line(f"{PROG}: error: {self.named(message)}")

    def notice(self, message):
        self.line(f"{PROG}: {message}")

    def warning(self, message):
        self.line(f"{PROG}: warning: {self.named(message)}")

    def named(self, message) -> str:
        """`message` led by the current input's name, unless it starts with it already."""
        message = str(message)
        return message if not self.label or message.startswith(self.label) else f"{self.label}: {message}"

    def line(self, text: str):
        """A whole line on stderr (an error, a warning, a log line) without breaking the bar."""
        self.clear()
        print(one_line(text), file=self.stream, flush=True)

    def clear(self):
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.drawn = False


# --- main ------------------------------------------------------------------------------------------------

def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    formats = check_usage(args, parser)
    try:
        check_language(args.model, args.language)
        options = transcribe_options(args, parser)
    except OptionError as exc:
        error(PROG, exc)
        return EXIT_USAGE
    except ModelError as exc:  # the default model's setting cannot be read
        error(PROG, exc)
        return EXIT_FAILED
    found, failures = expand_inputs(args, parser)
    items = [item for item in found if not _missing(item, failures)]
    out_dir = Path(args.output_dir) if args.output_dir is not None else None
    if out_dir is not None:
        check_collisions(items, out_dir, parser)
        problem = output_dir_problem(out_dir)
        if problem is not None:
            error(PROG, problem)
            return EXIT_FAILED
    progress = Progress(sys.stderr, bar=sys.stderr.isatty() and not args.quiet, verbose=args.verbose)
    for line in failures:
        progress.error(line)
    notice = nullcontext() if args.quiet else compile_notice(progress.notice)
    with library_warnings(progress.warning), notice:
        try:
            return _run(args, items, formats, options, out_dir, progress, failed=len(failures))
        finally:
            progress.clear()  # also when interrupted: the interruption's line starts on a clean line


def check_language(model, language: str | None) -> None:
    """OptionError for a language unknown, or unknown to the model's variant where its package or name tells
    it: said before any model is loaded or downloaded."""
    if language is None:
        return
    from nanoasr import api, hub

    api.check_language(language, hub.variant_of(model))


def _missing(item: Item, failures: list[str]) -> bool:
    """Whether an input file is absent or unreadable, its line added to `failures`: found before the model
    loads, so a run of such inputs alone neither loads nor downloads one."""
    if not isinstance(item.source, str):
        return False
    problem = path_problem(item.source)
    if problem is not None:
        failures.append(f"{item.label}: {problem}")
    return problem is not None


def output_dir_problem(out_dir: Path) -> str | None:
    """Why -o DIR cannot take the files, found before any work: it cannot be created, or not written in."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"-o {out_dir}: cannot create the folder ({exc.strerror or exc})"
    if not os.access(out_dir, os.W_OK | os.X_OK):
        return f"-o {out_dir}: the folder is not writable"
    return None


def check_usage(args, parser) -> tuple[str, ...]:
    """The output formats; argparse's usage error for what only the command line can get wrong."""
    formats = parse_formats(args.output_format, parser)
    if args.output_dir is None and len(formats) > 1:
        parser.error("several output formats (or all) write files: give -o DIR")
    if args.skip_existing and args.output_dir is None:
        parser.error("--skip-existing needs -o DIR: it skips inputs whose files there exist")
    check_cue_options(args, parser)
    return formats


def check_cue_options(args, parser) -> None:
    """argparse's usage error for subtitle line options without what they shape (this command and `batch`)."""
    if (args.max_line_width or args.max_line_count) and not args.word_timestamps:
        parser.error("--max-line-width and --max-line-count shape word-timed cues: give --word-timestamps")
    if args.max_line_count and not args.max_line_width:
        parser.error("--max-line-count needs --max-line-width (lines break at that width)")


def transcribe_options(args, parser) -> dict:
    """Model.transcribe's options, checked by api.Options before any model is loaded (OptionError)."""
    from nanoasr.api import Options

    hotwords = list(args.hotword)
    if args.hotwords_file is not None:
        hotwords += read_hotwords(args.hotwords_file, parser)
    options = dict(language=args.language, itn=args.itn, hotwords=tuple(hotwords), context=args.context,
                   reference=args.reference, max_new_tokens=args.max_new_tokens,
                   word_timestamps=args.word_timestamps, vad=args.vad)
    Options(**options)
    return options


def _run(args, items, formats, options, out_dir, progress, failed: int) -> int:
    from nanoasr.api import Model

    todo = [it for it in items if not (args.skip_existing and _outputs_exist(it, formats, out_dir))]
    for item in items:
        if item not in todo and args.verbose:
            progress.line(f"nanoasr: {item.label}: skipped, its outputs exist")
    if not todo:
        return EXIT_FAILED if failed else EXIT_OK
    start = time.perf_counter()
    try:
        model = Model.load(args.model, device=args.device, threads=args.threads, llm=args.llm,
                           activations=args.activations, huge_pages=args.huge_pages)
        model.check_options(args.language, args.word_timestamps)  # said once, not for every input
        model.compile_beside()  # a first run: the decoder's kernels compile beside the encoder's
    except OptionError as exc:  # a usage error, as when the variant is known before the load
        progress.error(exc)
        return EXIT_USAGE
    except NanoasrError as exc:
        progress.error(exc)
        return EXIT_FAILED
    if args.verbose:
        progress.line(f"nanoasr: model loaded in {time.perf_counter() - start:.1f} s; plan: {model.plan}")
    for index, item in enumerate(todo, 1):
        progress.begin(index, len(todo), item.label)
        transcript = _transcribe_one(model, item, options, progress, args.max_duration)
        if transcript is None:
            failed += 1
            continue
        try:
            _emit(transcript, item, formats, out_dir, progress, (args.max_line_width, args.max_line_count))
        except BrokenPipeError:  # stdout's reader is gone: nothing more to do (nanoasr.cli)
            raise
        except (OSError, UnicodeError) as exc:  # each file is whole or absent: none is taken for done
            progress.error(f"cannot write its output: {exc}")
            failed += 1
    return EXIT_FAILED if failed else EXIT_OK


def _transcribe_one(model, item: Item, options: dict, progress, max_duration_s: float | None):
    from nanoasr.audio.io import decode_audio

    started = time.perf_counter()
    try:
        audio = decode_audio(item.source, max_duration_s=max_duration_s)  # the model takes it as it is
        progress.start(audio.duration_s)
        transcript = model.transcribe(audio, on_segment=progress.segment,
                                      on_partial=progress.partial if progress.bar else None, **options)
    except NanoasrError as exc:
        progress.error(exc)
        return None
    if progress.verbose:
        progress.line(f"nanoasr: {item.label}: {transcript.duration_s:.1f} s of audio in "
                      f"{time.perf_counter() - started:.1f} s, {len(transcript.segments)} segments")
    return transcript


def _outputs_exist(item: Item, formats, out_dir: Path) -> bool:
    return all((out_dir / f"{item.stem}.{fmt}").is_file() for fmt in formats)


def _emit(transcript, item: Item, formats, out_dir, progress, lines=(None, None)) -> None:
    """Files under `out_dir` when given; on stdout the text on one line, or the chosen format without -o."""
    if out_dir is not None:
        for fmt in formats:
            write_whole(out_dir / f"{item.stem}.{fmt}", render(transcript, fmt, item.label, False, lines))
    if out_dir is not None or formats[0] == "txt":
        text = transcript.text + "\n"
    else:
        text = render(transcript, formats[0], item.label, True, lines)
    progress.clear()
    sys.stdout.write(text)
    sys.stdout.flush()
