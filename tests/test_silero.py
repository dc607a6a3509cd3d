"""Silero VAD in numpy, without a reference runtime: shapes, state, streaming against the whole recording, and
speech scoring high and silence low on synthesized speech (tests/test_silero_reference.py holds the parity
test against onnxruntime)."""
import shutil
import subprocess

import numpy as np
import pytest

from nanoasr.audio import silero

SR = 16000
SENTENCES = ("The quick brown fox jumps over the lazy dog.", "Voice activity detection finds the speech.")
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")


def espeak(text, folder, name, voice="en"):  # -> [T] float32 at 16 kHz
    sf = pytest.importorskip("soundfile")
    soxr = pytest.importorskip("soxr")
    path = folder / f"{name}.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True, capture_output=True)
    x, rate = sf.read(path, dtype="float32")
    return soxr.resample(x, rate, SR).astype(np.float32)


def speech_and_noise(folder, snr_db: float, seed: int):  # -> [N] float32: 1 s silence, speech, 1.5 s, speech
    rng = np.random.default_rng(seed)
    a, b = (espeak(text, folder, f"s{i}") for i, text in enumerate(SENTENCES))
    speech = np.concatenate((np.zeros(SR, np.float32), a, np.zeros(3 * SR // 2, np.float32), b,
                             np.zeros(SR, np.float32)))
    noise = rng.standard_normal(len(speech)).astype(np.float32)
    power = np.mean(np.concatenate((a, b)) ** 2)
    return speech + noise * np.float32(np.sqrt(power / 10 ** (snr_db / 10)))


def test_weights_shapes():
    w = silero.load_weights()
    assert w["stft"].shape == (silero.N_FFT, 2 * 129)
    assert w["lstm.hidden"].shape == (silero.HIDDEN, 4 * silero.HIDDEN)
    assert all(v.dtype == np.float32 for v in w.values())


def test_stream_pieces_equal_the_whole_recording():
    rng = np.random.default_rng(0)
    wave = (rng.standard_normal(3 * SR + 123) * 0.1).astype(np.float32)
    whole = silero.speech_probabilities(wave)
    assert whole.shape == (len(wave) // silero.CHUNK,) and whole.dtype == np.float32
    assert ((whole >= 0) & (whole <= 1)).all()
    stream, parts, at = silero.SileroStream(), [], 0
    for size in [1, 511, 512, 513, 64, 5000, 3, 40000]:
        parts.append(stream.feed(wave[at:at + size]))
        at += size
    parts.append(stream.feed(wave[at:]))
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=0, atol=1e-6)
    assert stream.chunks == len(whole)


def test_blocks_carry_state(monkeypatch):
    rng = np.random.default_rng(1)
    wave = (rng.standard_normal(40 * silero.CHUNK) * 0.1).astype(np.float32)
    whole = silero.speech_probabilities(wave)
    monkeypatch.setattr(silero, "BLOCK_CHUNKS", 7)
    np.testing.assert_allclose(silero.speech_probabilities(wave), whole, rtol=0, atol=1e-6)


def test_state_matters():
    """The LSTM state and context carry: a chunk scored after speech-like input differs from the same chunk
    scored fresh."""
    rng = np.random.default_rng(2)
    wave = (rng.standard_normal(20 * silero.CHUNK) * 0.1).astype(np.float32)
    after = silero.speech_probabilities(wave)[-1]
    fresh = silero.speech_probabilities(wave[-silero.CHUNK:])[0]
    assert abs(after - fresh) > 1e-4


def test_silence_scores_low():
    assert silero.speech_probabilities(np.zeros(2 * SR, np.float32)).max() < 0.1


@needs_espeak
def test_speech_scores_high_and_silence_low(tmp_path):
    wave = speech_and_noise(tmp_path, 20.0, 0)
    p = silero.speech_probabilities(wave)
    t = (np.arange(len(p)) + 0.5) * silero.CHUNK / SR  # chunk centres, s
    a = len(espeak(SENTENCES[0], tmp_path, "a")) / SR
    assert np.median(p[(t > 1.2) & (t < 1 + a - 0.2)]) > 0.9  # inside the first sentence
    assert p[t < 0.8].max() < 0.2  # the leading silence
    gap = (t > 1 + a + 0.5) & (t < 1 + a + 1.2)
    assert p[gap].max() < 0.2
