"""Result types shared by the library, the CLI and the server; plain data, JSON-serialisable."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

FINISH_REASONS = ("stop", "length", "repetition", "silence")


@dataclass(frozen=True)
class Segment:
    """One stretch of the input, in seconds from the start of the audio."""

    start: float
    end: float
    text: str
    finish_reason: str  # "stop" | "length" (token budget hit) | "repetition" (loop guard) | "silence" (skipped)
    token_ids: tuple[int, ...] = ()
    avg_logprob: float = 0.0  # mean log-probability of the generated tokens (0 for skipped segments)

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
    timings: dict = field(default_factory=dict)  # ms per stage: frontend, encoder, adaptor, prefill, decode, total

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
        out = dataclasses.asdict(self)
        out["segments"] = [dict(s, truncated=seg.truncated) for s, seg in zip(out["segments"], self.segments)]
        out["finish_reason"] = self.finish_reason
        return out

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, **kwargs)
