"""Speech-like test audio: voiced syllables (harmonic tones with a ~4 Hz envelope) separated by pauses.

Random-weight models make any audio equally meaningful; what matters for timing and segmentation is
that the signal has speech's energy structure: bursts of a few seconds and pauses between them.
"""
from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16000


def speech_like(seconds: float, seed: int = 0, silence_every_s: float | None = None) -> np.ndarray:
    """[N] float32 at 16 kHz. With `silence_every_s`, a 3 s silent stretch follows each such span."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE)
    out = np.zeros(n, np.float32)
    pos, since_silence = int(0.2 * SAMPLE_RATE), 0.0
    while pos < n:
        phrase = rng.uniform(1.0, 6.0)  # seconds of speech before the next pause
        length = min(int(phrase * SAMPLE_RATE), n - pos)
        t = np.arange(length) / SAMPLE_RATE
        f0 = rng.uniform(100, 240) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t))
        phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
        voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
        envelope = np.clip(np.sin(2 * np.pi * rng.uniform(3.5, 5.5) * t), 0, None) ** 1.5
        noise = rng.standard_normal(length) * 0.05
        out[pos:pos + length] = (0.25 * voiced * envelope + noise * envelope).astype(np.float32)
        pos += length
        since_silence += phrase
        pause = rng.uniform(0.3, 1.2)
        if silence_every_s is not None and since_silence >= silence_every_s:
            pause, since_silence = 3.0, 0.0
        pos += int(pause * SAMPLE_RATE)
    out += rng.standard_normal(n).astype(np.float32) * 1e-4  # a recording's noise floor
    return out
