"""The realtime route's input audio: OpenAI's three formats to float32 samples at 16 kHz, chunk by chunk.

`audio/pcm` is PCM16 little-endian mono at 24 kHz; `audio/pcmu` and `audio/pcma` are G.711 mu-law and A-law at
8 kHz. Each is resampled by one soxr stream per format, so the output does not depend on how the client cut
its chunks (it equals soxr.resample of the whole stream); `flush` ends the stream at a manual commit, so the
committed audio holds every sample the client sent.
"""
from __future__ import annotations

import numpy as np
import soxr

from nanoasr.audio import SAMPLE_RATE
from nanoasr.errors import AudioError

FORMATS = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}  # OpenAI's input formats and rates
BETA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}


def _mu_law_table():  # G.711 mu-law byte -> linear sample (int16 range)
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    magnitude = (((u & 0x0F) << 3) + 0x84 << ((u >> 4) & 7)) - 0x84
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.int16)


def _a_law_table():  # G.711 A-law byte -> linear sample (int16 range)
    a = np.arange(256, dtype=np.int32) ^ 0x55
    mantissa, exponent = a & 0x0F, (a >> 4) & 7
    shifted = ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0)
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, shifted)
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.int16)


G711 = {"audio/pcmu": _mu_law_table(), "audio/pcma": _a_law_table()}


class Converter:
    """Bytes of one input format -> [N] float32 at 16 kHz; an odd PCM16 byte waits for the next chunk."""

    def __init__(self, kind: str):
        if kind not in FORMATS:
            raise AudioError(f"audio format must be one of {', '.join(FORMATS)}; got {kind!r}")
        self.kind, self.rate = kind, FORMATS[kind]
        self.odd = b""
        self.stream = self._new_stream()

    def _new_stream(self):
        return soxr.ResampleStream(self.rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")

    def convert(self, data: bytes):
        return self.stream.resample_chunk(self._samples(data))

    def flush(self):
        """The samples still inside the resampler; the stream starts afresh after them."""
        self.odd = b""
        tail = self.stream.resample_chunk(np.zeros(0, np.float32), last=True)
        self.stream = self._new_stream()
        return tail

    def _samples(self, data: bytes):  # -> [N] float32 at the input rate, full scale 1.0
        if self.kind != "audio/pcm":
            return G711[self.kind][np.frombuffer(data, np.uint8)].astype(np.float32) / 32768.0
        data, self.odd = self.odd + data, b""
        if len(data) % 2:
            data, self.odd = data[:-1], data[-1:]
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
