"""Weights: the memory-mapped safetensors reader, layout mapping and validation errors."""
import json
import re

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from nanoasr.checkpoints.checkpoint import validate
from nanoasr.checkpoints.layouts import to_logical
from nanoasr.checkpoints.spec import expected_tensors
from nanoasr.errors import ModelError
from nanoasr.formats import safetensors as st
from nanoasr.model import config as cm
from nanoasr.storage import bf16_to_f32
from nanoasr.tensor import StoredTensor, dense

SMALL = cm.Config(
    audio=cm.AudioConfig(hidden_size=8, num_attention_heads=2, intermediate_size=16, num_hidden_layers=5,
                         num_timestamp_prediction_layers=2, fsmn_kernel_size=3, num_mel_bins=2,
                         num_stacked_frames=7),
    adaptor=cm.AdaptorConfig(hidden_size=8, num_attention_heads=2, intermediate_size=2,
                             projector_hidden_size=12),
    text=cm.TextConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=4),
    audio_token_id=30,
)


def random_tensors(config, seed=0):
    rng = np.random.default_rng(seed)
    return {name: dense(rng.standard_normal(shape).astype(np.float32))
            for name, (shape, _) in expected_tensors(config).items()}


def test_spec_table_matches_the_full_size_layout():
    expected = expected_tensors(cm.Config())
    assert len(expected) == 1540  # the -hf checkpoint's tensor count (lm_head tied, not stored)
    assert expected["model.audio_tower.layers.0.self_attn.q_proj.weight"][0] == (512, 560)
    assert expected["model.audio_tower.layers.69.final_layernorm.bias"][0] == (512,)
    assert "model.audio_tower.layers.50.final_layernorm.weight" not in expected
    assert expected["model.language_model.layers.27.self_attn.o_proj.weight"][0] == (1024, 2048)


# Independent inverse maps: logical name -> the name an older layout uses (from the published layouts).
def funasr_name(name):
    a = SMALL.audio
    n_main = a.num_hidden_layers - a.num_timestamp_prediction_layers
    m = re.match(r"model\.audio_tower\.layers\.(\d+)\.(.+)$", name)
    if m:
        i, tail = int(m.group(1)), m.group(2)
        if tail.startswith("final_layernorm."):
            return (("audio_encoder.after_norm." if i == n_main - 1 else "audio_encoder.tp_norm.")
                    + tail.split(".")[-1])
        block = ("audio_encoder.encoders0.0" if i == 0 else f"audio_encoder.encoders.{i - 1}" if i < n_main
                 else f"audio_encoder.tp_encoders.{i - n_main}")
        tail = (tail.replace("input_layernorm", "norm1").replace("post_attention_layernorm", "norm2")
                .replace("mlp.fc1", "feed_forward.w_1").replace("mlp.fc2", "feed_forward.w_2")
                .replace("self_attn.o_proj", "self_attn.linear_out")
                .replace("self_attn.fsmn.conv", "self_attn.fsmn_block"))
        return f"{block}.{tail}"
    m = re.match(r"model\.multi_modal_projector\.layers\.(\d+)\.(.+)$", name)
    if m:
        tail = (m.group(2).replace("input_layernorm", "norm1").replace("post_attention_layernorm", "norm2")
                .replace("mlp.fc1", "feed_forward.w_1").replace("mlp.fc2", "feed_forward.w_2")
                .replace("self_attn.o_proj", "self_attn.linear_out").replace("q_proj", "linear_q")
                .replace("k_proj", "linear_k").replace("v_proj", "linear_v"))
        return f"audio_adaptor.blocks.{m.group(1)}.{tail}"
    if name.startswith("model.multi_modal_projector.linear_"):
        return name.replace("model.multi_modal_projector.linear_", "audio_adaptor.linear")
    return name.replace("model.language_model.", "llm.model.")


def test_funasr_layout_with_fused_qkv_maps_onto_logical_names():
    logical = random_tensors(SMALL)
    original = {}
    for name, t in logical.items():
        if ".audio_tower." in name and re.search(r"self_attn\.[qkv]_proj", name):
            continue
        original[funasr_name(name)] = t
    for i in range(SMALL.audio.num_hidden_layers):
        p = f"model.audio_tower.layers.{i}.self_attn."
        for kind in ("weight", "bias"):
            fused = np.concatenate([logical[p + f"{x}_proj.{kind}"].data for x in "qkv"])
            original[funasr_name(p + "q_proj." + kind).replace("q_proj", "linear_q_k_v")] = dense(fused)
    original["llm.lm_head.weight"] = logical["model.language_model.embed_tokens.weight"]
    mapped = to_logical(original, SMALL)
    validate(mapped, SMALL, "funasr")
    for name, t in logical.items():
        np.testing.assert_array_equal(mapped[name].data, t.data, err_msg=name)


def test_older_hub_layout_maps_onto_logical_names():
    logical = random_tensors(SMALL)
    n_main = SMALL.audio.num_hidden_layers - SMALL.audio.num_timestamp_prediction_layers
    old = {}
    for name, t in logical.items():
        m = re.match(r"model\.audio_tower\.layers\.(\d+)\.(.+)$", name)
        if m:
            i, tail = int(m.group(1)), m.group(2)
            if tail.startswith("final_layernorm."):
                which = "layer_norm" if i == n_main - 1 else "timestamp_prediction_layer_norm"
                old[f"model.audio_tower.{which}.{tail.split('.')[-1]}"] = t
                continue
            tail = (tail.replace("input_layernorm", "self_attn_layer_norm")
                    .replace("post_attention_layernorm", "final_layer_norm").replace("mlp.", "")
                    .replace("self_attn.fsmn", "fsmn").replace("o_proj", "out_proj"))
            block = ("stem" if i == 0 else f"layers.{i - 1}" if i < n_main
                     else f"timestamp_prediction_layers.{i - n_main}")
            old[f"model.audio_tower.{block}.{tail}"] = t
        elif name.startswith("model.multi_modal_projector.layers."):
            old[name.replace(".layers.", ".blocks.").replace("input_layernorm", "self_attn_layer_norm")
                .replace("post_attention_layernorm", "final_layer_norm").replace("mlp.", "")
                .replace("o_proj", "out_proj")] = t
        else:
            old[name] = t
    mapped = to_logical(old, SMALL)
    validate(mapped, SMALL, "old")
    for name, t in logical.items():
        np.testing.assert_array_equal(mapped[name].data, t.data, err_msg=name)


def test_validation_names_tensor_expected_and_found():
    tensors = random_tensors(SMALL)
    missing = dict(tensors)
    missing.pop("model.language_model.norm.weight")
    with pytest.raises(ModelError, match=r"missing.*model\.language_model\.norm\.weight"):
        validate(missing, SMALL, "ckpt")
    wrong = dict(tensors)
    wrong["model.language_model.norm.weight"] = dense(np.zeros(7, np.float32))
    with pytest.raises(ModelError, match=r"norm\.weight: expected shape \[8\], found \[7\]"):
        validate(wrong, SMALL, "ckpt")
    quantized_norm = dict(tensors)
    quantized_norm["model.language_model.norm.weight"] = StoredTensor(
        np.zeros((1, 34), np.uint8), "q8_0", (8,))
    with pytest.raises(ModelError, match="expected a float type"):
        validate(quantized_norm, SMALL, "ckpt")
    extra = dict(tensors, **{"model.something.else": dense(np.zeros(3, np.float32))})
    with pytest.raises(ModelError, match="unexpected tensor model.something.else"):
        validate(extra, SMALL, "ckpt")


def test_reader_matches_the_safetensors_package(tmp_path):
    rng = np.random.default_rng(1)
    arrays = {"a": rng.standard_normal((3, 5)).astype(np.float32),
              "b": rng.standard_normal(7).astype(np.float16), "empty": np.zeros((0, 4), np.float32)}
    path = tmp_path / "m.safetensors"
    save_file(arrays, str(path))
    ours = st.read(path)
    for name, ref in load_file(str(path)).items():
        np.testing.assert_array_equal(ours[name].data, ref)
        assert ours[name].shape == ref.shape


def test_bf16_bits_match_torch(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch

    values = torch.randn(4, 6).to(torch.bfloat16)
    path = tmp_path / "m.safetensors"
    save_torch({"w": values}, str(path))
    t = st.read(path)["w"]
    assert t.dtype == "bf16"
    np.testing.assert_array_equal(bf16_to_f32(t.data), values.float().numpy())


def test_truncated_and_corrupt_files(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": np.ones((64, 64), np.float32)}, str(path))
    blob = path.read_bytes()
    path.write_bytes(blob[:-100])
    with pytest.raises(ModelError, match="truncated"):
        st.read(path)
    path.write_bytes(blob[:4])
    with pytest.raises(ModelError, match="truncated"):
        st.read(path)
    path.write_bytes((10 ** 12).to_bytes(8, "little") + blob[8:])
    with pytest.raises(ModelError, match="header claims"):
        st.read(path)
    header = json.dumps({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    with pytest.raises(ModelError, match="I64 is not supported"):
        st.read(path)


def broken_copy(tiny_dir, tmp_path):
    import shutil

    out = tmp_path / "broken"
    shutil.copytree(tiny_dir, out)
    return out


def test_a_broken_checkpoint_directory_gives_one_clear_error_each(tiny_dir, tmp_path):
    from nanoasr.checkpoints.load import load_checkpoint

    d = broken_copy(tiny_dir, tmp_path)
    (d / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match="tokenizer.json is missing"):
        load_checkpoint(d)
    d = broken_copy(tiny_dir, tmp_path / "2")
    (d / "config.json").write_text('{"audio_config": {"hidden_size": 32,')
    with pytest.raises(ModelError, match=r"config\.json.*(JSON|json)"):
        load_checkpoint(d)
    d = broken_copy(tiny_dir, tmp_path / "3")
    blob = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ModelError, match=r"model\.safetensors.*truncated"):
        load_checkpoint(d)
    d = broken_copy(tiny_dir, tmp_path / "4")
    # rename one tensor in the header (same length, so the file stays well formed): it is now missing
    name = b'"model.audio_tower.layers.1.mlp.fc2.weight"'
    assert blob.count(name) == 1
    (d / "model.safetensors").write_bytes(blob.replace(name, name.replace(b"fc2", b"fc9")))
    with pytest.raises(ModelError, match=r"missing.*model\.audio_tower\.layers\.1\.mlp\.fc2\.weight"):
        load_checkpoint(d)
