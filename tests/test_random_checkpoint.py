"""tools/random_checkpoint.py: the real model's sizes, every tensor the spec expects in BF16 (rounded to
nearest even), drawn at the reference builder's scales."""
import json

import numpy as np

from nanoasr.checkpoints.spec import expected_tensors
from nanoasr.formats.safetensors import read
from nanoasr.model.config import Config, from_dict
from nanoasr.storage import bf16_to_f32
from tools import random_checkpoint as rc


def test_the_config_has_the_real_models_sizes():
    assert from_dict(rc.full_config()) == Config()


def test_bf16_rounds_to_nearest_even():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -2.5], np.float32)
    assert rc.bf16_bits(x).tolist() == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020]


def test_every_expected_tensor_is_written_at_its_scale(tmp_path):
    config = from_dict(json.loads((rc.TINY / "config.json").read_text()))
    rc.write_safetensors(tmp_path / "model.safetensors", config, seed=3)
    tensors = read(tmp_path / "model.safetensors")
    expected = expected_tensors(config)
    assert {n: t.shape for n, t in tensors.items()} == {n: shape for n, (shape, _) in expected.items()}
    assert {t.dtype for t in tensors.values()} == {"bf16"}
    embed = bf16_to_f32(tensors["model.language_model.embed_tokens.weight"].data)
    assert abs(embed.std() - 0.1) < 0.002
    fc1 = bf16_to_f32(tensors["model.audio_tower.layers.1.mlp.fc1.weight"].data)  # [64, 32]
    assert abs(fc1.std() * np.sqrt(32) - 1) < 0.1
    gain = bf16_to_f32(tensors["model.language_model.norm.weight"].data)
    assert abs(gain.mean() - 1) < 0.1 and 0 < gain.std() < 0.2


def test_each_stage_says_what_it_writes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rc, "full_config", lambda: json.loads((rc.TINY / "config.json").read_text()))
    assert rc.main([str(tmp_path / "out"), "--seed", "1"]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert not out and len(lines) == 4 and all(line.startswith("random_checkpoint: ") for line in lines)
    for line, name in zip(lines, ("config.json", "tokenizer.json", "model.safetensors")):
        assert str(tmp_path / "out" / name) in line and (tmp_path / "out" / name).is_file()
    assert "GB of random BF16 weights" in lines[2]
    assert lines[3] == f"random_checkpoint: done: {tmp_path / 'out'}"
