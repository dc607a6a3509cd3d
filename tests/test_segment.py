"""Long-audio segmentation on synthetic speech-like audio (and espeak-ng speech when it is installed)."""
import shutil
import subprocess

import numpy as np
import pytest

from nanoasr.audio.segment import Span, split
from nanoasr.errors import AudioError, OptionError

SR = 16000
NOISE_RMS = 1e-3  # -60 dBFS microphone noise floor
RAMP_S = 0.03  # bursts fade in and out like real words


def envelope(t, rate, phase, low=0.35):  # [T] -> [T] syllable-like amplitude, `rate` syllables per second
    return low + (1 - low) * np.abs(np.sin(np.pi * rate * t + phase))


def harmonics(phase, count=8):  # [T] -> [T] sum of sin(k phase) / k
    # by the recurrence sin((k+1)x) = 2cos(x)sin(kx) - sin((k-1)x)
    two_cos = 2 * np.cos(phase)
    previous, current = np.zeros_like(phase), np.sin(phase)
    total = current.copy()
    for k in range(2, count + 1):
        previous, current = current, two_cos * current - previous
        total += current / k
    return total


def burst(rng, n, level_db):  # -> [n] voiced harmonics plus band-limited noise, RMS ~level_db
    t = np.arange(n) / SR
    f0 = rng.uniform(100, 220) * (1 + 0.06 * np.sin(2 * np.pi * rng.uniform(0.3, 1.0) * t))
    phase = 2 * np.pi * np.cumsum(f0) / SR
    voiced = harmonics(phase)
    n_fft = 1 << max(n - 1, 1).bit_length()  # a power of two keeps the FFT fast
    spectrum = np.fft.rfft(rng.normal(size=n_fft))
    freqs = np.fft.rfftfreq(n_fft, 1 / SR)
    spectrum[(freqs < 300) | (freqs > 3400)] = 0
    hiss = np.fft.irfft(spectrum, n_fft)[:n]
    hiss *= np.std(voiced) / max(np.std(hiss), 1e-9)
    x = (voiced + 0.3 * hiss) * envelope(t, rng.uniform(4, 5), rng.uniform(0, np.pi))
    ramp = min(int(RAMP_S * SR), n // 2)
    fade = 0.5 - 0.5 * np.cos(np.pi * np.arange(ramp) / ramp)
    x[:ramp] *= fade
    x[n - ramp:] *= fade[::-1]
    return x * (10 ** (level_db / 20) / np.sqrt(np.mean(x * x)))


def long_recording(seed=0, seconds=600.0):
    """Ten minutes of bursts and pauses; returns the wave, burst and long-silence sample ranges."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SR)
    wave = rng.normal(scale=NOISE_RMS, size=n)
    bursts, silences, pos = [], [], int(1.5 * SR)
    while pos < n - 10 * SR:
        fast_talker = 200 * SR < pos < 260 * SR  # a minute of speech whose pauses are all short
        kind = "short" if fast_talker else rng.choice(["short", "medium", "long"], p=[0.35, 0.45, 0.2])
        length = int(rng.uniform(0.3, 6.0) * SR)
        x = burst(rng, length, rng.uniform(-32, -20))
        wave[pos:pos + length] += x
        bursts.append((pos, pos + length))
        pos += length
        gap = {"short": (0.08, 0.25), "medium": (0.35, 1.5), "long": (2.0, 8.0)}[kind]
        pause = int(rng.uniform(*gap) * SR)
        if kind == "long":
            silences.append((pos, pos + pause))
        pos += pause
    start, end = silences[len(silences) // 2]
    wave[start:end] = 0.0  # one pause is digital silence, as when a recorder mutes
    return wave.astype(np.float32), bursts, silences


def check_layout(spans, n, max_s):
    assert all(isinstance(s, Span) for s in spans)
    for span in spans:
        assert 0 <= span.start < span.end <= n
        assert span.end - span.start <= max_s * SR
        assert span.end_s - span.start_s <= max_s
    for a, b in zip(spans, spans[1:]):
        assert a.end <= b.start


def coverage(spans, n):
    mask = np.zeros(n, dtype=bool)
    for span in spans:
        mask[span.start:span.end] = True
    return mask


def rms_db(wave, at, half=200):  # RMS of the 25 ms around sample `at`, dBFS
    x = wave[max(at - half, 0):at + half].astype(np.float64)
    return 10 * np.log10(np.mean(x * x) + 1e-12)


@pytest.fixture(scope="module")
def recording():
    wave, bursts, silences = long_recording()
    return wave, bursts, silences, split(wave)


def test_ten_minutes_layout(recording):
    wave, _, _, spans = recording
    check_layout(spans, len(wave), 30.0)
    assert len(spans) > 10


def test_no_speech_lost(recording):
    wave, bursts, _, spans = recording
    mask = coverage(spans, len(wave))
    lost = [(s / SR, e / SR) for s, e in bursts if not mask[s:e].all()]
    assert lost == []


def test_silence_is_skipped(recording):
    wave, _, silences, spans = recording
    mask = coverage(spans, len(wave))
    assert len(silences) > 5
    for start, end in silences:
        assert not mask[start + SR // 2:end - SR // 2].any(), (start / SR, end / SR)


def test_cuts_fall_in_pauses(recording):
    wave, bursts, _, spans = recording
    cuts = [a.end for a, b in zip(spans, spans[1:]) if a.end == b.start]
    assert cuts, "the fast-talker minute needs cuts inside speech regions"
    starts, ends = np.array(bursts).T
    for cut in cuts:
        assert not np.any((starts < cut) & (cut < ends)), f"cut at {cut / SR:.3f} s lies inside a burst"
        assert rms_db(wave, cut) < -45.0  # bursts are -32 dBFS or louder, pauses sit at the -60 dBFS floor


def test_segments_are_merged_up_to_the_target(recording):
    wave, bursts, _, spans = recording
    assert len(spans) < len(bursts) / 2
    assert max(s.end_s - s.start_s for s in spans) > 15.0


@pytest.mark.parametrize("max_s", [10.0, 5.0])
def test_shorter_max(recording, max_s):
    wave, bursts, _, _ = recording
    spans = split(wave, max_s=max_s)
    check_layout(spans, len(wave), max_s)
    mask = coverage(spans, len(wave))
    assert all(mask[s:e].all() for s, e in bursts)


def test_digital_silence_gives_no_spans():
    assert split(np.zeros(60 * SR, dtype=np.float32)) == []
    assert split(np.full(60 * SR, 0.25, dtype=np.float32)) == []
    assert split(np.full(60 * SR, -1.0, dtype=np.float32)) == []


def test_noise_floor_alone_gives_no_spans():
    noise = np.random.default_rng(1).normal(scale=NOISE_RMS, size=60 * SR).astype(np.float32)
    assert split(noise) == []


def test_short_input():
    assert split(np.zeros(100, dtype=np.float32)) == []
    assert split(np.zeros(0, dtype=np.float32)) == []


def test_one_short_utterance_is_padded():
    rng = np.random.default_rng(2)
    wave = rng.normal(scale=NOISE_RMS, size=5 * SR)
    wave[2 * SR:3 * SR] += burst(rng, SR, -25)
    spans = split(wave.astype(np.float32))
    assert len(spans) == 1
    assert 1.7 <= spans[0].start_s <= 2.0 and 3.0 <= spans[0].end_s <= 3.3


def test_soft_onsets_are_kept():
    rng = np.random.default_rng(8)
    wave = rng.normal(scale=NOISE_RMS, size=6 * SR)
    word = burst(rng, 2 * SR, -25)
    fade = 0.5 - 0.5 * np.cos(np.pi * np.arange(int(0.4 * SR)) / int(0.4 * SR))  # a breathy 400 ms onset
    word[:len(fade)] *= fade
    word[-len(fade):] *= fade[::-1]
    wave[2 * SR:4 * SR] += word
    spans = split(wave.astype(np.float32))
    assert len(spans) == 1 and spans[0].start <= 2 * SR and spans[0].end >= 4 * SR


def test_noise_wobbling_near_the_floor_is_silence():
    rng = np.random.default_rng(9)
    t = np.arange(30 * SR) / SR
    level_db = -51 + 3 * np.sin(2 * np.pi * 0.5 * t)  # a fan whose noise swells from -54 to -48 dBFS
    wave = rng.normal(size=len(t)) * 10 ** (level_db / 20)
    assert split(wave.astype(np.float32)) == []


def test_click_is_dropped():
    rng = np.random.default_rng(3)
    wave = rng.normal(scale=NOISE_RMS, size=5 * SR)
    wave[2 * SR:2 * SR + 800] += burst(rng, 800, -20)  # 50 ms
    assert split(wave.astype(np.float32)) == []


def continuous_speech(seconds, dips, seed=4):  # [T], envelope [T]: one burst, optional 80 ms quiet dips
    rng = np.random.default_rng(seed)
    x = burst(rng, int(seconds * SR), -25)
    for at in dips:
        x[int(at * SR):int((at + 0.08) * SR)] = 0.0
    return (x + rng.normal(scale=NOISE_RMS, size=len(x))).astype(np.float32)


def test_continuous_speech_cut_at_dips():
    dips = np.arange(1.7, 95, 3.3)  # quiet gaps between "words", too short to count as pauses
    wave = continuous_speech(95.0, dips)
    spans = split(wave)
    check_layout(spans, len(wave), 30.0)
    assert len(spans) >= 4
    assert spans[0].start == 0 and spans[-1].end == len(wave)
    for a, b in zip(spans, spans[1:]):
        assert a.end == b.start  # no speech dropped
        in_dip = (dips * SR - 80 <= a.end) & (a.end <= (dips + 0.08) * SR + 80)
        assert in_dip.any(), f"cut at {a.end_s:.3f} s is not in a quiet dip"


def test_continuous_speech_cut_at_syllable_troughs():
    rng = np.random.default_rng(5)
    seconds, rate, phase = 95.0, 4.5, 0.3
    t = np.arange(int(seconds * SR)) / SR
    f0 = 140 * (1 + 0.05 * np.sin(2 * np.pi * 0.5 * t))
    voiced = harmonics(2 * np.pi * np.cumsum(f0) / SR)
    env = envelope(t, rate, phase)
    wave = (0.05 * voiced * env + rng.normal(scale=NOISE_RMS, size=len(t))).astype(np.float32)
    spans = split(wave)
    check_layout(spans, len(wave), 30.0)
    assert len(spans) >= 4 and spans[0].start == 0 and spans[-1].end == len(wave)
    for a, b in zip(spans, spans[1:]):
        assert a.end == b.start
        assert env[a.end] < 0.45, f"cut at {a.end_s:.3f} s is mid-syllable (envelope {env[a.end]:.2f})"
        assert a.end_s - a.start_s >= 20.0  # cuts are sought in the last third, so pieces stay long


def test_loud_speech_in_loud_noise():
    rng = np.random.default_rng(6)
    wave = rng.normal(scale=10 ** (-40 / 20), size=20 * SR)  # a noisy room, -40 dBFS
    for start in (2, 9, 15):
        wave[start * SR:(start + 3) * SR] += burst(rng, 3 * SR, -18)
    spans = split(wave.astype(np.float32))
    assert [round(s.start_s) for s in spans] == [2, 9, 15]
    assert all(s.end_s - s.start_s < 3.6 for s in spans)


def test_bad_input():
    with pytest.raises(AudioError, match="1-D float"):
        split(np.zeros((2, 16000), dtype=np.float32))
    with pytest.raises(AudioError, match="1-D float"):
        split(np.zeros(16000, dtype=np.int16))
    with pytest.raises(AudioError, match="finite"):
        split(np.full(16000, np.nan, dtype=np.float32))
    with pytest.raises(OptionError, match="max_s"):
        split(np.zeros(16000, dtype=np.float32), max_s=0)


def espeak(text, tmp_path, name):  # -> [T] float32 at 16 kHz
    sf = pytest.importorskip("soundfile")
    soxr = pytest.importorskip("soxr")
    path = tmp_path / f"{name}.wav"
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    x, rate = sf.read(path, dtype="float32")
    return soxr.resample(x, rate, SR).astype(np.float32)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_espeak_speech(tmp_path):
    sentences = [
        "The quick brown fox jumps over the lazy dog.",
        "Segmentation keeps every word and skips the silence between sentences.",
        "Thirty seconds is the longest stretch the model reads at once.",
    ]
    parts = [espeak(s, tmp_path, f"s{i}") for i, s in enumerate(sentences)]
    rng = np.random.default_rng(7)
    silence = np.zeros(4 * SR, dtype=np.float32)
    wave = np.concatenate([silence, parts[0], silence, parts[1], np.zeros(SR // 2, np.float32), parts[2],
                           silence])
    wave += rng.normal(scale=NOISE_RMS, size=len(wave)).astype(np.float32)
    spans = split(wave)
    check_layout(spans, len(wave), 30.0)
    mask = coverage(spans, len(wave))
    offset = 0
    for part, gap in zip(parts, [len(silence), len(silence), SR // 2]):
        offset += gap
        voiced = np.flatnonzero(np.abs(part) > 0.01)
        assert mask[offset + voiced[0]:offset + voiced[-1] + 1].all()
        offset += len(part)
    assert not mask[:2 * SR].any() and not mask[-2 * SR:].any()
    middle = 4 * SR + len(parts[0]) + 2 * SR
    assert not mask[middle - SR // 2:middle + SR // 2].any()


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_espeak_long_speech_cut_between_words(tmp_path):
    text = " ".join(["nanoasr splits long recordings at quiet points between the words"] * 20)
    wave = espeak(text, tmp_path, "long")
    assert len(wave) > 60 * SR
    spans = split(wave)
    check_layout(spans, len(wave), 30.0)
    frames = wave[:len(wave) // 400 * 400].reshape(-1, 400).astype(np.float64)
    speech_db = np.percentile(10 * np.log10(np.mean(frames ** 2, axis=1) + 1e-12), 90)
    cuts = [a.end for a, b in zip(spans, spans[1:]) if a.end == b.start]
    assert cuts
    for cut in cuts:
        assert rms_db(wave, cut) < speech_db - 30.0, f"cut at {cut / SR:.3f} s is not in a quiet gap"
