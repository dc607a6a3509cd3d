"""Frontend parity: fbank against kaldi-native-fbank, LFR against a plain loop."""
import math
from pathlib import Path

import numpy as np
import pytest

from nanoasr.audio.fbank import features, fbank, lfr
from nanoasr.errors import AudioError, OptionError


def knf_fbank(wave):
    knf = pytest.importorskip("kaldi_native_fbank")
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0
    opts.frame_opts.window_type = "hamming"
    opts.frame_opts.snip_edges = True
    opts.frame_opts.samp_freq = 16000
    opts.mel_opts.num_bins = 80
    opts.mel_opts.low_freq = 20
    opts.mel_opts.high_freq = 8000
    extractor = knf.OnlineFbank(opts)
    extractor.accept_waveform(16000, wave.tolist())
    extractor.input_finished()
    return np.array([extractor.get_frame(i) for i in range(extractor.num_frames_ready)], np.float32)


def signals():
    rng = np.random.default_rng(0)
    t = np.arange(16000 * 2) / 16000
    yield "sine", (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    yield "noise", (0.1 * rng.standard_normal(16000 * 3)).astype(np.float32)
    yield "chirp", (0.3 * np.sin(2 * np.pi * (100 + 1900 * t) * t)).astype(np.float32)
    impulse = np.zeros(8000, np.float32)
    impulse[4000] = 1.0
    yield "impulse", impulse + 1e-4 * rng.standard_normal(8000).astype(np.float32)
    for n in (400, 401, 559, 560, 561, 16000, 16000 * 60):
        yield f"noise{n}", (0.05 * rng.standard_normal(n)).astype(np.float32)


@pytest.mark.parametrize("name, wave", list(signals()), ids=lambda x: x if isinstance(x, str) else "")
def test_fbank_matches_kaldi_native_fbank(name, wave):
    scaled = wave * 32768
    ref = knf_fbank(scaled)
    ours = fbank(scaled)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-3


def lfr_loop(feats):
    padded = [feats[0]] * 3 + list(feats)
    out = []
    for i in range(math.ceil(len(feats) / 6)):
        window = padded[6 * i:6 * i + 7]
        window += [feats[-1]] * (7 - len(window))
        out.append(np.concatenate(window))
    return np.array(out)


def test_lfr_equals_a_plain_loop_for_every_length():
    rng = np.random.default_rng(1)
    for t in range(1, 401):
        feats = rng.standard_normal((t, 80)).astype(np.float32)
        np.testing.assert_array_equal(lfr(feats), lfr_loop(feats))


def test_profiles_and_errors():
    wave = (0.1 * np.random.default_rng(2).standard_normal(16000)).astype(np.float32)
    funasr, n = features(wave, "funasr")
    hf, _ = features(wave, "transformers")
    assert funasr.shape == (n, 560) == hf.shape
    np.testing.assert_allclose(funasr - hf, np.log(32768.0 ** 2), atol=2e-3)
    with pytest.raises(OptionError, match="funasr"):
        features(wave, "whisper")
    with pytest.raises(AudioError, match="shorter than one 25 ms"):
        features(wave[:399])


TORCHAUDIO = Path(__file__).parent / "fixtures" / "frontend_torchaudio.npz"


@pytest.mark.parametrize("reference", ["transformers", "funasr"])
def test_fbank_matches_pinned_torchaudio(reference):
    """torchaudio.compliance.kaldi.fbank values (tools/reference/frontend.py), as both references compute
    them.

    Mel bins more than 70 dB below their frame's strongest bin may differ more: their power is below a float32
    FFT's rounding level, so neither implementation's value there means anything beyond being that quiet.
    """
    pinned = np.load(TORCHAUDIO)
    names = sorted({key.split("/")[0] for key in pinned.files if "/" in key})
    assert len(names) >= 8
    for name in names:
        wave = pinned[f"{name}/wave"]
        ours = fbank(wave * (32768.0 if reference == "funasr" else 1.0))
        want = pinned[f"{name}/{reference}"]
        assert ours.shape == want.shape, name
        loudest = want.max(axis=1, keepdims=True)
        quiet = want < loudest - np.log(1e7)
        off = np.abs(ours - want) > 2e-4 + 2e-4 * np.abs(want)
        assert not (off & ~quiet).any(), (name, np.argwhere(off & ~quiet)[:5])
        assert (ours < loudest - np.log(1e6))[quiet].all(), name
