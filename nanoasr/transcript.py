"""Result types shared by the library, the CLI and the server; plain data, JSON-serialisable.

`Transcript.to_dict()` holds only str, float, int, bool, None, lists and dicts, so `json.dumps` takes it
as is; `Transcript.from_dict` reads it back.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

OPTIONAL_FIELDS = ("words", "ctc_text", "ctc_agreement")  # Segment's, present with word_timestamps


@dataclass(frozen=True)
class Word:
    """A word (a character in Chinese and Japanese) with the times forced alignment gives it."""

    word: str
    start: float
    end: float
    probability: float  # the mean over its CTC tokens of each token's best frame probability


@dataclass(frozen=True)
class Segment:
    """One stretch of the input, in seconds from the start of the audio."""

    start: float
    end: float
    text: str
    finish_reason: str  # "stop" | "length" (token budget hit) | "repetition" (loop guard)
    token_ids: tuple[int, ...] = ()
    avg_logprob: float = 0.0  # mean log-probability of the generated tokens (0 for skipped segments)
    # With word_timestamps (a checkpoint with FunASR's CTC branch): the words, empty when the text's tokens
    # do not fit in the segment's frames; the CTC branch's greedy text and its agreement with `text` (0..1).
    words: tuple[Word, ...] | None = None
    ctc_text: str | None = None
    ctc_agreement: float | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason in ("length", "repetition")


@dataclass(frozen=True)
class Transcript:
    """What one input turned into."""

    text: str
    segments: tuple[Segment, ...]
    language: str | None  # the language asked for ("zh", "en", "ja"), None when automatic
    duration_s: float  # audio duration
    timings: dict = field(default_factory=dict)  # ms per stage (frontend, encoder, ..., decode) and total

    @property
    def finish_reason(self) -> str:
        """"stop" when every spoken segment ended by itself, else the first other reason."""
        for segment in self.segments:
            if segment.truncated:
                return segment.finish_reason
        return "stop"

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(t for segment in self.segments for t in segment.token_ids)

    def to_dict(self) -> dict:
        """Word and CTC fields appear only where they were asked for."""
        out = dataclasses.asdict(self)
        out["segments"] = [{k: v for k, v in dict(s, truncated=seg.truncated).items()
                            if k not in OPTIONAL_FIELDS or v is not None}
                           for s, seg in zip(out["segments"], self.segments)]
        out["finish_reason"] = self.finish_reason
        return out

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, **kwargs)

    @classmethod
    def from_dict(cls, data: dict) -> "Transcript":
        """The inverse of `to_dict` (derived keys such as `finish_reason` and `truncated` are recomputed)."""
        names = {f.name for f in dataclasses.fields(Segment)}
        fields = [{k: v for k, v in s.items() if k in names} for s in data["segments"]]
        segments = tuple(Segment(**dict(f, token_ids=tuple(f.get("token_ids", ())), words=_words(f)))
                         for f in fields)
        timings = dict(data.get("timings", {}))
        return cls(data["text"], segments, data.get("language"), data["duration_s"], timings)

    def render(self, fmt: str) -> str:
        """The transcript as txt, json, srt, vtt or tsv text (see nanoasr.writers)."""
        from nanoasr import writers

        return writers.render(self, fmt)

    def to_srt(self) -> str:
        return self.render("srt")

    def to_vtt(self) -> str:
        return self.render("vtt")

    def to_tsv(self) -> str:
        return self.render("tsv")

    def write(self, path, fmt: str | None = None) -> None:
        """Write to `path` in `fmt`, by default the one its suffix names (.txt, .json, .srt, .vtt, .tsv);
        the folders on the way are created where missing."""
        from nanoasr import writers

        writers.write(self, fmt or writers.format_of(path), path)


def _words(segment: dict) -> tuple[Word, ...] | None:
    words = segment.get("words")
    return None if words is None else tuple(Word(**w) for w in words)
