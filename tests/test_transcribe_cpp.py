"""transcribe.cpp's `funasr_nano` GGUF opens through the same load_model.

The files are written from the committed tiny checkpoint by tools/reference/transcribe_cpp.py, which follows
handy-computer/transcribe.cpp scripts/convert-funasr_nano.py (commit ea077b8).
"""
from pathlib import Path

import gguf
import numpy as np
import pytest

from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.errors import ModelError
from nanoasr.tensor import widen
import nanoasr

from tools.lib.parity import cases
from tools.reference import transcribe_cpp

REFS = np.load(Path(__file__).parent / "fixtures" / "tiny" / "reference.npz")
TOKENS = 16  # a prefix of the pinned greedy ids: enough to tell models apart, quick to decode


@pytest.fixture(scope="module")
def original(tiny_dir):
    return load_checkpoint(tiny_dir)


@pytest.fixture(scope="module")
def converted(tiny_dir, tmp_path_factory):
    return transcribe_cpp.write(tiny_dir, tmp_path_factory.mktemp("tc") / "fun-asr-nano-BF16.gguf")


def test_tensors_and_config_equal_the_original(converted, original):
    loaded = load_checkpoint(converted)
    assert loaded.config == original.config
    assert sorted(loaded.tensors) == sorted(original.tensors)
    for name, t in original.tensors.items():
        np.testing.assert_array_equal(widen(loaded.tensors[name]), widen(t), err_msg=name)
    assert loaded.source["format"] == "transcribe.cpp gguf"
    assert loaded.source["variant"] == "fun-asr-nano-2512"


@pytest.mark.parametrize("reference", ["funasr", "transformers"])
def test_greedy_ids_equal_the_original(converted, reference):
    ref = cases(REFS, reference)["short"]
    model = nanoasr.load_model(str(converted))
    result = model.transcribe(ref["wave"], sample_rate=16000, reference=reference, max_new_tokens=TOKENS,
                              ignore_stop=True)
    ids = list(result.segments[0].token_ids)
    assert ids == ref["greedy_ids"][:TOKENS].tolist() and len(set(ids)) > 5


def write_with(tiny_dir, path, monkeypatch, method: str, key: str, value):
    """The converter's file with one metadata value replaced as it is written."""
    original = getattr(gguf.GGUFWriter, method)

    def patched(self, k, v, *args, **kwargs):
        return original(self, k, value if k == key else v, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(gguf.GGUFWriter, method, patched)
        return transcribe_cpp.write(tiny_dir, path)


@pytest.mark.parametrize("method, key, value, message", [
    ("add_string", "stt.variant", "fun-asr-nano-2609", r"stt.variant 'fun-asr-nano-2609' is not a Fun-ASR"),
    ("add_uint32", "stt.funasr_nano.encoder.sanm_shift", 1, r"encoder.sanm_shift is 1, only 0 is supported"),
    ("add_bool", "stt.frontend.apply_cmvn", True, r"apply_cmvn is True, only False is supported"),
    ("add_uint32", "stt.funasr_nano.encoder.d_model", 512,
     r"metadata stt.funasr_nano.encoder.d_model is 512, but the tensors say 32 \(audio hidden_size\)"),
    ("add_uint32", "stt.funasr_nano.decoder.n_kv_heads", 4,
     r"decoder.n_kv_heads is 4, but the tensors say 2"),
])
def test_metadata_that_disagrees_is_named(tiny_dir, tmp_path, monkeypatch, method, key, value, message):
    path = write_with(tiny_dir, tmp_path / "bad.gguf", monkeypatch, method, key, value)
    with pytest.raises(ModelError, match=r"bad.gguf: .*" + message):
        load_checkpoint(path)


def test_a_tensor_outside_the_layout_is_named(tiny_dir, tmp_path, monkeypatch):
    original = gguf.GGUFWriter.add_tensor

    def renamed(self, name, *args, **kwargs):
        return original(self, name.replace("enc.tp_norm.", "enc.tp_final_norm."), *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", renamed)
    path = transcribe_cpp.write(tiny_dir, tmp_path / "renamed.gguf")
    with pytest.raises(ModelError, match=r"unexpected tensor enc.tp_final_norm.weight \(not in transcribe"):
        load_checkpoint(path)


def test_a_missing_tensor_is_named(tiny_dir, tmp_path, monkeypatch):
    original = gguf.GGUFWriter.add_tensor

    def dropping(self, name, *args, **kwargs):
        if name != "dec.layers.1.ffn.up.weight":
            original(self, name, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", dropping)
    path = transcribe_cpp.write(tiny_dir, tmp_path / "short.gguf")
    with pytest.raises(ModelError, match=r"missing, first model.language_model.layers.1.mlp.up_proj"):
        load_checkpoint(path)


def test_every_audio_frame_goes_to_the_decoder_when_the_file_says_so(tiny_dir, tmp_path, monkeypatch):
    path = write_with(tiny_dir, tmp_path / "all-rows.gguf", monkeypatch, "add_bool",
                      "stt.funasr_nano.adaptor.use_low_frame_rate", False)
    assert load_checkpoint(path).config.adaptor.use_low_frame_rate is False
