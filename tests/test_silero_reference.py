"""Silero VAD in numpy against onnxruntime running silero-vad 6.2.3's own silero_vad_16k_op15.onnx, and the
shipped weights against a fresh conversion of that wheel.

The reference tier: needs onnxruntime and onnx (the `reference` extra) and the wheel, which a session fixture
fetches with `pip download` (pip's cache makes it a one-time download); skipped when either is unavailable.
"""
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from nanoasr.audio import silero
from tests.test_silero import speech_and_noise
from tools import convert_silero_vad

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
RELEASE = "silero-vad==6.2.3"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    folder = tmp_path_factory.mktemp("silero_wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", RELEASE, "-d", str(folder)],
                          capture_output=True, text=True, timeout=300)
    found = sorted(folder.glob("silero_vad-*.whl"))
    if done.returncode or not found:
        pytest.skip(f"pip download {RELEASE} failed: {done.stderr.strip().splitlines()[-1:]}")
    return found[0]


@pytest.fixture(scope="session")
def session(wheel, tmp_path_factory):
    path = tmp_path_factory.mktemp("silero_onnx") / "model.onnx"
    with zipfile.ZipFile(wheel) as z:
        path.write_bytes(z.read(convert_silero_vad.MODEL))
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_probabilities(session, wave):  # [N] -> [N // 512], chunk by chunk as silero-vad's OnnxWrapper does
    state = np.zeros((2, 1, silero.HIDDEN), np.float32)
    window = np.zeros((1, silero.CONTEXT + silero.CHUNK), np.float32)
    out = []
    for k in range(len(wave) // silero.CHUNK):
        chunk = wave[None, k * silero.CHUNK:(k + 1) * silero.CHUNK]
        window = np.concatenate((window[:, -silero.CONTEXT:], chunk), axis=1)
        prob, state = session.run(None, {"input": window, "state": state, "sr": np.array(16000, np.int64)})
        out.append(prob[0, 0])
    return np.array(out, np.float32), state[:, 0]


def test_shipped_weights_are_the_wheels(wheel, tmp_path):
    convert_silero_vad.main([str(wheel), "--out", str(tmp_path)])
    fresh = np.load(tmp_path / "silero_vad_16k.npz")
    shipped = np.load(silero.WEIGHTS)
    assert sorted(fresh.files) == sorted(shipped.files)
    for name in fresh.files:
        np.testing.assert_array_equal(fresh[name], shipped[name], err_msg=name)
    assert "MIT License" in (tmp_path / "silero_vad_16k.LICENSE").read_text()


@pytest.mark.parametrize("snr_db, seed", [(20.0, 1), (5.0, 2), (-5.0, 3)])
def test_probabilities_match_onnxruntime(session, snr_db, seed, tmp_path):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    wave = speech_and_noise(tmp_path, snr_db, seed)
    assert len(wave) > 6 * 16000
    want, want_state = onnx_probabilities(session, wave)
    stream = silero.SileroStream()
    got = stream.feed(wave)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    h, c = stream.state
    np.testing.assert_allclose(h, want_state[0], rtol=0, atol=1e-5)
    # the cell state is not squashed (|c| reaches tens): float32 rounding over many steps scales with it
    np.testing.assert_allclose(c, want_state[1], rtol=0, atol=1e-5 * max(1.0, np.abs(want_state[1]).max()))
    assert want.min() < 0.1 and want.max() > 0.9  # the clip holds both speech and silence
