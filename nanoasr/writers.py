"""Transcript writers: txt, json, srt, vtt, tsv. Segment times come from nanoasr's segmenter."""
from __future__ import annotations

from pathlib import Path

from nanoasr.errors import OptionError

FORMATS = ("txt", "json", "srt", "vtt", "tsv")


def _clock(seconds: float, decimal: str) -> str:
    ms = int(round(max(seconds, 0.0) * 1000))  # round once, in milliseconds, so 59.9996 s is 00:01:00.000
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{ms:03d}"


def _line(text: str) -> str:
    # One line per cue or row: a blank line would end an SRT/VTT cue early, a tab would shift TSV columns,
    # and "-->" is not allowed inside a VTT cue.
    return " ".join(text.split()).replace("-->", "->")


def _cues(transcript):  # the segments with text, as (start, end, one-line text)
    return [(s.start, s.end, _line(s.text)) for s in transcript.segments if _line(s.text)]


def render(transcript, fmt: str) -> str:
    """`transcript` as txt (one segment per line), json, srt, vtt or tsv (integer milliseconds) text."""
    if fmt == "txt":
        return "".join(f"{text}\n" for _, _, text in _cues(transcript))
    if fmt == "json":
        return transcript.to_json(indent=2) + "\n"
    if fmt == "srt":
        return "".join(f"{i}\n{_clock(a, ',')} --> {_clock(b, ',')}\n{text}\n\n"
                       for i, (a, b, text) in enumerate(_cues(transcript), 1))
    if fmt == "vtt":
        return "WEBVTT\n\n" + "".join(f"{_clock(a, '.')} --> {_clock(b, '.')}\n{text}\n\n"
                                      for a, b, text in _cues(transcript))
    if fmt == "tsv":
        rows = [f"{round(a * 1000)}\t{round(b * 1000)}\t{text}\n" for a, b, text in _cues(transcript)]
        return "start\tend\ttext\n" + "".join(rows)
    raise OptionError(f"output format must be one of {', '.join(FORMATS)}; got {fmt!r}")


def format_of(path) -> str:
    """The output format a file name's suffix names."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise OptionError(f"cannot tell the output format from {str(path)!r}: expected a suffix among "
                          f"{', '.join('.' + f for f in FORMATS)}; or pass the format")
    return fmt


def write(transcript, fmt: str, path) -> None:
    """Write `transcript` rendered as `fmt` to `path` (UTF-8), replacing any file there."""
    Path(path).write_text(render(transcript, fmt), encoding="utf-8")
