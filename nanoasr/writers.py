"""Transcript writers: txt, json, srt, vtt, tsv. Segment times come from nanoasr's segmenter."""
from __future__ import annotations

from pathlib import Path

FORMATS = ("txt", "json", "srt", "vtt", "tsv")


def _clock(seconds: float, decimal: str) -> str:
    ms = int(round(max(seconds, 0.0) * 1000))  # round once, in milliseconds, so 59.9996 s is 00:01:00.000
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{ms:03d}"


def _cues(transcript):
    return [s for s in transcript.segments if s.text.strip()]


def render(transcript, fmt: str) -> str:
    if fmt == "txt":
        return "\n".join(s.text.strip() for s in _cues(transcript)) + "\n"
    if fmt == "json":
        return transcript.to_json(indent=2) + "\n"
    if fmt == "srt":
        return "".join(f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"
                       for i, s in enumerate(_cues(transcript), 1))
    if fmt == "vtt":
        return "WEBVTT\n\n" + "".join(f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n\n"
                                      for s in _cues(transcript))
    if fmt == "tsv":
        rows = ["start\tend\ttext"]
        for s in _cues(transcript):
            text = " ".join(s.text.split())  # tabs and newlines would break the columns
            rows.append(f"{int(round(s.start * 1000))}\t{int(round(s.end * 1000))}\t{text}")
        return "\n".join(rows) + "\n"
    raise ValueError(f"output format must be one of {', '.join(FORMATS)}; got {fmt!r}")


def write(transcript, fmt: str, path) -> None:
    Path(path).write_text(render(transcript, fmt), encoding="utf-8")
