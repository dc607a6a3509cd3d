"""Long recordings through the library: segments of at most 30 s, in order, inside the audio, none on silence.

The oracle for where the silence is comes from the samples themselves (stretches of at least 2.5 s
where every sample stays at the noise floor), not from the segmenter.
"""
from __future__ import annotations

import numpy as np
import pytest

from tools.lib.synth import speech_like

SR = 16000
FLOOR = 2e-3  # the synthetic noise floor has std 1e-4; speech bursts are far above this
MIN_SILENCE_S = 2.5  # speech_like's pauses between phrases last at most 1.2 s; its silences 3 s


def silent_stretches(wave, min_s: float = MIN_SILENCE_S) -> list[tuple[float, float]]:
    """[(start_s, end_s)] of runs of at least `min_s` where every sample's magnitude stays under FLOOR."""
    quiet = np.concatenate(([False], np.abs(wave) < FLOOR, [False]))
    edges = np.flatnonzero(np.diff(quiet.astype(np.int8)))
    starts, ends = edges[0::2], edges[1::2]
    keep = ends - starts >= min_s * SR
    return [(a / SR, b / SR) for a, b in zip(starts[keep], ends[keep])]


def check_segments(transcript, wave):
    duration = len(wave) / SR
    assert transcript.duration_s == pytest.approx(duration)
    segments = transcript.segments
    previous_end = 0.0
    for s in segments:
        assert previous_end <= s.start < s.end <= duration  # in order, non-overlapping, inside the audio
        assert s.end - s.start <= 30.0
        assert s.finish_reason in ("stop", "length", "repetition")
        previous_end = s.end
    return segments


def overlap(a0, a1, b0, b1) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def test_ten_minute_recording(tiny_model):
    wave = speech_like(600.0, seed=7, silence_every_s=20)
    silences = silent_stretches(wave)
    assert len(silences) >= 15  # the oracle sees the synthesizer's silences
    transcript = tiny_model.transcribe(wave, sample_rate=SR, max_new_tokens=2)
    segments = check_segments(transcript, wave)
    assert len(segments) >= len(silences)  # never one span across a 3 s silence
    for a, b in silences:  # at most the segmenter's padding reaches into a silence, never its middle
        for s in segments:
            assert overlap(s.start, s.end, a + 0.5, b - 0.5) == 0.0, (s.start, s.end, a, b)
    loud = np.flatnonzero(np.abs(wave) > 0.05) / SR
    covered = np.zeros(len(loud), bool)
    for s in segments:
        covered |= (loud >= s.start) & (loud < s.end)
    assert covered.mean() > 0.99  # the speech itself is kept
    position = 0
    for s in segments:  # the text holds each segment's text, in order
        position = transcript.text.index(s.text.strip(), position) + len(s.text.strip())
    stages = {k: v for k, v in transcript.timings.items() if k != "total"}
    # summed over batches
    assert min(stages.values()) >= 0 and sum(stages.values()) <= transcript.timings["total"]


def test_silence_gives_no_segments(tiny_model):
    rng = np.random.default_rng(0)
    floor = (rng.standard_normal(90 * SR) * 1e-4).astype(np.float32)
    for wave in (np.zeros(90 * SR, np.float32), floor, np.full(40 * SR, 0.3, np.float32)):
        t = tiny_model.transcribe(wave, sample_rate=SR)
        assert t.segments == () and t.text == "" and t.finish_reason == "stop"


def test_long_silence_inside_speech_is_skipped(tiny_model):
    speech = speech_like(25.0, seed=8)
    gap = (np.random.default_rng(1).standard_normal(60 * SR) * 1e-4).astype(np.float32)
    wave = np.concatenate((speech, gap, speech_like(25.0, seed=9)))
    segments = check_segments(tiny_model.transcribe(wave, sample_rate=SR, max_new_tokens=2), wave)
    assert any(s.end <= 25.5 for s in segments) and any(s.start >= 84.5 for s in segments)
    assert all(overlap(s.start, s.end, 26.0, 84.0) == 0.0 for s in segments)
