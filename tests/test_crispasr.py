"""CrispASR's `funasr` GGUF opens through the same load_model.

The files are written from the committed tiny checkpoint by tools/reference/crispasr.py, which follows
CrispStrobe/CrispASR models/convert-funasr-to-gguf.py (commit 72d3c38). That converter stores matrices as
F16, so the expected weights are the original's rounded to F16 where the file holds F16.
"""
from pathlib import Path

import gguf
import numpy as np
import pytest

from nanoasr.checkpoints.checkpoint import Checkpoint
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.errors import ModelError
from nanoasr.tensor import StoredTensor, widen
import nanoasr

from tools.lib.parity import cases
from tools.reference import crispasr

REFS = np.load(Path(__file__).parent / "fixtures" / "tiny" / "reference.npz")
TOKENS = 16  # a prefix of the greedy ids: enough to tell models apart, quick to decode


@pytest.fixture(scope="module")
def original(tiny_dir):
    return load_checkpoint(tiny_dir)


@pytest.fixture(scope="module")
def converted(tiny_dir, tmp_path_factory):
    return crispasr.write(tiny_dir, tmp_path_factory.mktemp("crisp") / "funasr-nano-f16.gguf")


def as_stored(t: StoredTensor, dtype: str) -> StoredTensor:
    """The original tensor as the converter stores it: float32, or float16 when the file holds F16."""
    data = widen(t).astype(np.float16 if dtype == "f16" else np.float32)
    return StoredTensor(data, dtype, t.shape)


def test_tensors_are_the_originals_in_the_files_types(converted, original):
    loaded = load_checkpoint(converted)
    assert loaded.config == original.config and loaded.source["format"] == "CrispASR gguf"
    expected = dict(original.tensors, **{"lm_head.weight": original.tensors[
        "model.language_model.embed_tokens.weight"]})  # the converter writes the tied head out
    assert sorted(loaded.tensors) == sorted(expected)
    for name, t in expected.items():
        mine = loaded.tensors[name]
        assert mine.shape == t.shape, name
        np.testing.assert_array_equal(widen(mine), widen(as_stored(t, mine.dtype)), err_msg=name)


@pytest.mark.parametrize("reference", ["funasr", "transformers"])
def test_greedy_ids_equal_the_original_in_the_same_types(converted, original, reference):
    loaded = load_checkpoint(converted)
    same_types = {name: as_stored(original.tensors[name], t.dtype) for name, t in loaded.tensors.items()
                  if name != "lm_head.weight"}
    wave = cases(REFS, reference)["short"]["wave"]

    def ids(model):
        result = model.transcribe(wave, sample_rate=16000, reference=reference, max_new_tokens=TOKENS,
                                  ignore_stop=True)
        return list(result.segments[0].token_ids)

    expected = ids(nanoasr.Model(Checkpoint(original.config, same_types, original.files)))
    assert ids(nanoasr.load_model(str(converted))) == expected and len(set(expected)) > 5


def test_the_mistaken_adaptor_head_count_of_early_files_is_read_as_8(tiny_dir, tmp_path):
    path = crispasr.write(tiny_dir, tmp_path / "early.gguf", ada_n_heads=16)
    with pytest.warns(UserWarning, match=r"funasr.ada_n_heads is 16, a mistake of early CrispASR"):
        loaded = load_checkpoint(path)
    assert loaded.config.adaptor.num_attention_heads == 8


def write_with(tiny_dir, path, monkeypatch, method: str, key: str, value):
    original = getattr(gguf.GGUFWriter, method)

    def patched(self, k, v, *args, **kwargs):
        return original(self, k, value if k == key else v, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, method, patched)
    return crispasr.write(tiny_dir, path)


@pytest.mark.parametrize("method, key, value, message", [
    ("add_uint32", "funasr.lfr_n", 5, r"metadata funasr.lfr_n is 5, only 6 is supported"),
    ("add_uint32", "funasr.n_blocks_base", 0, r"metadata funasr.n_blocks_base is 0, expected the count"),
    ("add_uint32", "funasr.llm.head_dim", 16, r"metadata funasr.llm.head_dim is 16, but the tensors say 8"),
])
def test_metadata_that_disagrees_is_named(tiny_dir, tmp_path, monkeypatch, method, key, value, message):
    path = write_with(tiny_dir, tmp_path / "bad.gguf", monkeypatch, method, key, value)
    with pytest.raises(ModelError, match=r"bad.gguf: " + message):
        load_checkpoint(path)


def test_a_tensor_outside_the_layout_is_named(tiny_dir, tmp_path, monkeypatch):
    original = gguf.GGUFWriter.add_tensor

    def renamed(self, name, *args, **kwargs):
        return original(self, name.replace(".ffn.l2.", ".ffn.l3."), *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", renamed)
    path = crispasr.write(tiny_dir, tmp_path / "renamed.gguf")
    with pytest.raises(ModelError, match=r"unexpected tensor funasr.enc.blk.0.ffn.l3.w \(not in CrispASR"):
        load_checkpoint(path)


def test_every_audio_frame_goes_to_the_decoder_when_the_file_says_so(tiny_dir, tmp_path, monkeypatch):
    path = write_with(tiny_dir, tmp_path / "all-rows.gguf", monkeypatch, "add_bool",
                      "funasr.use_low_frame_rate", False)
    assert load_checkpoint(path).config.adaptor.use_low_frame_rate is False
