"""Transcript writers: txt, json, srt, vtt, tsv. Segment times come from nanoasr's segmenter; where segments
carry words (word_timestamps), SRT/VTT cues and TSV rows take their times from the words instead."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from nanoasr.errors import OptionError

FORMATS = ("txt", "json", "srt", "vtt", "tsv")
SURROGATE = re.compile("[\ud800-\udfff]")


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


def _spaceless(ch: str) -> bool:  # Chinese and Japanese characters and punctuation: joined without a space
    o = ord(ch)
    return o >= 0x2E80 and not (0xAC00 <= o <= 0xD7AF or 0x3130 <= o <= 0x318F)  # Hangul takes spaces


def _join(words) -> str:
    out = ""
    for w in words:
        text = _line(w.word)
        out += text if not out or _spaceless(out[-1]) or _spaceless(text[0]) else " " + text
    return out


def _word_cues(words, width: int | None, count: int | None):  # one segment's words -> [(start, end, text)]
    """Lines of at most `width` characters (a longer word alone on its line), at most `count` lines a cue;
    words are never split. Without `width`, one line for the segment."""
    cues, lines = [], [[]]
    for w in words:
        if lines[-1] and width is not None and len(_join(lines[-1] + [w])) > width:
            if count is not None and len(lines) >= count:
                cues.append(lines)
                lines = [[]]
            else:
                lines.append([])
        lines[-1].append(w)
    cues.append(lines)
    return [(cue[0][0].start, cue[-1][-1].end, "\n".join(_join(line) for line in cue)) for cue in cues]


def _subtitle_cues(transcript, width=None, count=None):  # word-timed cues where segments have words
    cues = []
    for s in transcript.segments:
        if s.words:
            cues.extend(_word_cues(s.words, width, count))
        elif _line(s.text):
            cues.append((s.start, s.end, _line(s.text)))
    return cues


def _tsv_rows(transcript):  # a row per word where segments have words, else per segment
    rows = []
    for s in transcript.segments:
        if s.words:
            rows.extend((w.start, w.end, _line(w.word)) for w in s.words)
        elif _line(s.text):
            rows.append((s.start, s.end, _line(s.text)))
    return rows


def render(transcript, fmt: str, max_line_width: int | None = None, max_line_count: int | None = None) -> str:
    """`transcript` as txt (one segment per line), json, srt, vtt or tsv (integer milliseconds) text.
    `max_line_width` (characters) and `max_line_count` (lines a cue) shape SRT/VTT cues of word-timed
    segments, as whisper's options do; each cue stays inside its segment."""
    if fmt == "txt":
        return "".join(f"{text}\n" for _, _, text in _cues(transcript))
    if fmt == "json":
        return transcript.to_json(indent=2) + "\n"
    cues = _subtitle_cues(transcript, max_line_width, max_line_count)
    if fmt == "srt":
        return "".join(f"{i}\n{_clock(a, ',')} --> {_clock(b, ',')}\n{text}\n\n"
                       for i, (a, b, text) in enumerate(cues, 1))
    if fmt == "vtt":
        return "WEBVTT\n\n" + "".join(f"{_clock(a, '.')} --> {_clock(b, '.')}\n{text}\n\n"
                                      for a, b, text in cues)
    if fmt == "tsv":
        rows = [f"{round(a * 1000)}\t{round(b * 1000)}\t{text}\n" for a, b, text in _tsv_rows(transcript)]
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
    """Write `transcript` rendered as `fmt` to `path` (UTF-8), replacing any file there, whole or not at
    all (write_whole)."""
    write_whole(Path(path), render(transcript, fmt))


def write_whole(path: Path, text: str) -> None:
    """`text` in `path` (UTF-8), complete or not at all: written beside it under a temporary name
    (.NAME.partial), flushed to disk, then renamed over it. A failure (a full disk, text that is not
    UTF-8, an interruption) leaves no temporary file and whatever was at `path` before, so a partial
    output is never taken for a finished one (`--skip-existing`, batch's resume)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.partial")
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:  # an interruption too: no temporary file is left behind
        temporary.unlink(missing_ok=True)
        raise


def json_text(value, indent: int | None = None) -> str:
    """json.dumps with characters as they are (ensure_ascii=False), except lone surrogates, which UTF-8
    cannot hold: a file name's bytes that are not UTF-8 (os.fsdecode's surrogate escapes) are written as
    \\udcXX escapes, valid JSON that reads back to the same name, where writing them would fail."""
    text = json.dumps(value, ensure_ascii=False, indent=indent)
    return SURROGATE.sub(lambda match: f"\\u{ord(match[0]):04x}", text)  # only inside strings: JSON escapes
