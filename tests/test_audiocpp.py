"""audio.cpp's GGUF of Fun-ASR-Nano opens through the same load_model.

The files are written from the committed tiny checkpoint by tools/reference/audiocpp.py, which follows
audio.cpp's `audiocpp_gguf` converter (0xShug0/audio.cpp src/framework/assets/tensor_source.cpp, f8fb0c1).
"""
from pathlib import Path

import gguf
import numpy as np
import pytest

from nanoasr import convert
from nanoasr.checkpoints.checkpoint import Checkpoint
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.errors import ModelError
from nanoasr.formats import gguf_read
from nanoasr.tensor import widen
import nanoasr

from tools.lib.parity import cases
from tools.reference import audiocpp

REFS = np.load(Path(__file__).parent / "fixtures" / "tiny" / "reference.npz")
TOKENS = 16  # a prefix of the pinned greedy ids: enough to tell models apart, quick to decode


@pytest.fixture(scope="module")
def original(tiny_dir):
    return load_checkpoint(tiny_dir)


def greedy_ids(model, reference="funasr"):
    wave = cases(REFS, reference)["short"]["wave"]
    result = model.transcribe(wave, sample_rate=16000, reference=reference, max_new_tokens=TOKENS,
                              ignore_stop=True)
    return list(result.segments[0].token_ids)


def test_orig_keeps_every_tensor_and_embeds_the_checkpoint_files(tiny_dir, original, tmp_path):
    path = audiocpp.write(tiny_dir, tmp_path / "orig.gguf", "orig")
    physical = gguf_read.read_header(path).tensors
    assert any(info.name.startswith("_audiocpp.") for info in physical)  # names of 64 bytes or more
    loaded = load_checkpoint(path)
    assert loaded.config == original.config and loaded.source["format"] == "audio.cpp gguf"
    assert loaded.files["tokenizer.json"] == (tiny_dir / "tokenizer.json").read_text()
    assert sorted(loaded.tensors) == sorted(original.tensors)
    for name, t in original.tensors.items():
        assert loaded.tensors[name].dtype == t.dtype, name
        np.testing.assert_array_equal(loaded.tensors[name].data, t.data, err_msg=name)
    ref = cases(REFS, "funasr")["short"]
    assert greedy_ids(nanoasr.load_model(str(path))) == ref["greedy_ids"][:TOKENS].tolist()


def test_q8_0_blocks_equal_a_nanoasr_gguf_and_give_the_same_ids(tiny_dir, original, tmp_path):
    loaded = load_checkpoint(audiocpp.write(tiny_dir, tmp_path / "q8.gguf", "q8_0"))
    quantized = sorted(n for n, t in loaded.tensors.items() if t.dtype == "q8_0")
    assert quantized and loaded.tensors["model.language_model.embed_tokens.weight"].dtype == "f16"
    convert.write(tmp_path / "ours.gguf", original, "q8_0", report=False, progress=None)
    ours = load_checkpoint(tmp_path / "ours.gguf")
    mixed = dict(original.tensors)
    for name in quantized:
        assert ours.tensors[name].dtype == "q8_0", name
        blocks = np.asarray(loaded.tensors[name].data)
        np.testing.assert_array_equal(blocks, np.asarray(ours.tensors[name].data), err_msg=name)
        mixed[name] = ours.tensors[name]
    embed = "model.language_model.embed_tokens.weight"
    np.testing.assert_array_equal(widen(loaded.tensors[embed]),
                                  widen(original.tensors[embed]).astype(np.float16).astype(np.float32))
    mixed[embed] = loaded.tensors[embed]
    reference = nanoasr.Model(Checkpoint(original.config, mixed, original.files))
    assert greedy_ids(nanoasr.Model(loaded)) == greedy_ids(reference)


def write_with(tiny_dir, path, monkeypatch, key: str, value):
    original = gguf.GGUFWriter.add_key_value

    def patched(self, k, v, *args, **kwargs):
        return original(self, k, value if k == key else v, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "add_key_value", patched)
    return audiocpp.write(tiny_dir, path, "orig")


@pytest.mark.parametrize("key, value, message", [
    ("audiocpp.model_spec.family", "qwen3_asr", r"an audio.cpp GGUF of family .qwen3_asr.; expected"),
    ("audiocpp.embedded_files.offsets", [0, 5], r"audiocpp.embedded_files: expected names, offsets"),
    ("audiocpp.tensor_names", ["model.audio_tower.layers.0.self_attn.q_proj.weight"],
     r"audiocpp.tensor_names must list one name per tensor"),
])
def test_inconsistent_metadata_is_named(tiny_dir, tmp_path, monkeypatch, key, value, message):
    path = write_with(tiny_dir, tmp_path / "bad.gguf", monkeypatch, key, value)
    with pytest.raises(ModelError, match=r"bad.gguf: " + message):
        load_checkpoint(path)


def test_a_namespaced_package_is_refused_by_name(tiny_dir, tmp_path, monkeypatch):
    original = gguf.GGUFWriter.add_key_value

    def namespaced(self, k, v, *args, **kwargs):
        if k == "audiocpp.tensor_names":
            v = ["model/" + name for name in v]
        return original(self, k, v, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "add_key_value", namespaced)
    path = audiocpp.write(tiny_dir, tmp_path / "packed.gguf", "orig")
    with pytest.raises(ModelError, match=r"namespaced \(packed\) audio.cpp GGUFs are not supported"):
        load_checkpoint(path)
