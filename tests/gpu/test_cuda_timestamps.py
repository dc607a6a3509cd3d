"""Word timestamps through the CUDA backend's Python path, on the strict device double of
test_cuda_backend.py: the CTC branch runs on the device, and only what the alignment reads comes back."""
import numpy as np
import pytest
from test_cuda_backend import double  # noqa: F401  (the fixture)

from nanoasr.api import Model
from nanoasr.audio.fbank import n_lfr_frames
from tools.lib.synth import speech_like
from tools.reference import ctc_branch, funasr_checkpoint


@pytest.fixture(scope="module")
def ctc_dir(tiny_dir, tmp_path_factory):
    pytest.importorskip("torch")
    return ctc_branch.write(funasr_checkpoint.write(tiny_dir, tmp_path_factory.mktemp("ctc")))


def test_word_timestamps_on_the_device_match_the_cpu(double, ctc_dir):  # noqa: F811
    log, _ = double
    wave = speech_like(7.0, 5)
    options = dict(sample_rate=16000, max_new_tokens=2, ignore_stop=True, word_timestamps=True)
    on_cpu = Model.load(str(ctc_dir), activations="exact").transcribe(wave, **options)
    got = Model.load(str(ctc_dir), device="cuda").transcribe(wave, **options)
    assert [s.token_ids for s in got.segments] == [s.token_ids for s in on_cpu.segments]
    assert [s.ctc_text for s in got.segments] == [s.ctc_text for s in on_cpu.segments]
    words, want = [w for s in got.segments for w in s.words], [w for s in on_cpu.segments for w in s.words]
    assert words and [(w.word, w.start, w.end) for w in words] == [(w.word, w.start, w.end) for w in want]
    np.testing.assert_allclose([w.probability for w in words], [w.probability for w in want], rtol=1e-4)
    frames = n_lfr_frames(len(wave))
    branch = Model.load(str(ctc_dir)).ctc
    tokens = len(branch.vocabulary.encode(got.segments[0].text))
    # what the CTC branch sends back: each frame's best id, the transcript's columns and the blank's column;
    # never the [T, vocab] log-probabilities
    assert {((frames,), "int64"), ((frames, tokens), "float32"), ((frames,), "float32")} <= set(log.down)
    assert not any(shape[-1:] == (branch.config.vocab_size,) for shape, _ in log.down)
