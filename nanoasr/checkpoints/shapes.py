"""Config from tensor shapes, for checkpoints that state no config (third-party GGUFs, FunASR's model.pt)."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from nanoasr.errors import ModelError
from nanoasr.formats import bounds
from nanoasr.model import config as config_mod
from nanoasr.model.config import SECTIONS, AudioConfig, Config
from nanoasr.tensor import StoredTensor


def layer_count(names, prefix: str, where: str) -> int:
    """One more than the largest layer number under `prefix`. Every layer holds a tensor, so a number at or
    above the count of names is refused before any table is sized from it."""
    digits = [m.group(1) for m in map(re.compile(re.escape(prefix) + r"(\d+)\.").match, names) if m]
    what = f"layer number in {prefix}N"
    return max((bounds.index(d, len(names), what, where) for d in digits), default=-1) + 1


def _derived_fields(tensors: dict[str, StoredTensor], where: str) -> dict[str, dict]:
    """The config fields that tensor shapes determine, by section."""
    def dims(name: str, ndim: int) -> tuple[int, ...]:
        if name not in tensors:
            raise ModelError(f"{where}: no nanoasr metadata and no tensor {name} to derive the config from")
        shape = tuple(tensors[name].shape)
        if len(shape) != ndim:
            raise ModelError(f"{where}: tensor {name}: expected {ndim} dimension(s), found {list(shape)}")
        return shape

    audio, text = "model.audio_tower.layers.", "model.language_model."
    n_audio = layer_count(tensors, audio, where)
    final_norm = re.compile(re.escape(audio) + r"(\d+)\.final_layernorm\.weight")
    finals = sorted(int(m.group(1)) for m in map(final_norm.fullmatch, tensors) if m)
    input_size = dims(f"{audio}0.self_attn.q_proj.weight", 2)[1]
    head_dim = dims(f"{text}layers.0.self_attn.q_norm.weight", 1)[0]
    if input_size % AudioConfig.num_mel_bins or not finals:
        raise ModelError(f"{where}: audio input size {input_size} is not a multiple of "
                         f"{AudioConfig.num_mel_bins} mel bins, or no final_layernorm tensors")
    return {
        "audio": {"num_stacked_frames": input_size // AudioConfig.num_mel_bins,
                  "hidden_size": dims(f"{audio}0.self_attn.q_proj.weight", 2)[0],
                  "intermediate_size": dims(f"{audio}0.mlp.fc1.weight", 2)[0],
                  "num_hidden_layers": n_audio, "num_timestamp_prediction_layers": n_audio - 1 - finals[0],
                  "fsmn_kernel_size": dims(f"{audio}0.self_attn.fsmn.conv.weight", 3)[-1]},
        "adaptor": {"hidden_size": dims("model.multi_modal_projector.linear_2.weight", 2)[0],
                    "projector_hidden_size": dims("model.multi_modal_projector.linear_1.weight", 2)[0],
                    "intermediate_size": dims("model.multi_modal_projector.layers.0.mlp.fc1.weight", 2)[0],
                    "num_hidden_layers": layer_count(tensors, "model.multi_modal_projector.layers.", where)},
        "text": {"vocab_size": dims(f"{text}embed_tokens.weight", 2)[0],
                 "hidden_size": dims(f"{text}embed_tokens.weight", 2)[1],
                 "intermediate_size": dims(f"{text}layers.0.mlp.gate_proj.weight", 2)[0],
                 "num_hidden_layers": layer_count(tensors, f"{text}layers.", where), "head_dim": head_dim,
                 "num_attention_heads": dims(f"{text}layers.0.self_attn.q_proj.weight", 2)[0] // head_dim,
                 "num_key_value_heads": dims(f"{text}layers.0.self_attn.k_proj.weight", 2)[0] // head_dim},
    }


def config_from_shapes(tensors: dict[str, StoredTensor], tokens: list[str] | None,
                       where: str) -> tuple[Config, list[str]]:
    """Config of a GGUF without nanoasr metadata: shapes where they tell, documented defaults elsewhere.

    Returns the config and the assumed fields as `section.field=value`.
    """
    derived = _derived_fields(tensors, where)
    sections, assumed = {}, []
    for section, cls in SECTIONS:
        sections[section] = cls(**derived[section])
        assumed += [f"{section}.{f.name}={f.default!r}" for f in dataclasses.fields(cls)
                    if f.name not in derived[section]]
    audio_token_id = Config.audio_token_id
    if tokens is not None and "<|object_ref_start|>" in tokens:
        audio_token_id = tokens.index("<|object_ref_start|>")
    else:
        assumed.append(f"audio_token_id={audio_token_id}")
    config = Config(sections["audio"], sections["adaptor"], sections["text"], audio_token_id)
    config_mod.check(config, where)
    return config, assumed


def _metadata_number(values: dict, key: str, where: str):
    """A number or bool from a file's metadata; a float as the shortest decimal of its float32 (GGUF stores
    eps and the RoPE base as float32: 1e-6 reads back as 1e-6, not 9.99999997e-7)."""
    value = values.get(key)
    if not isinstance(value, (bool, int, float)):
        raise ModelError(f"{where}: metadata {key} must be a number, found {value!r}")
    return float(str(np.float32(value))) if isinstance(value, float) else value


def with_metadata(config: Config, assumed: list[str], values: dict, keys: dict[str, tuple[str, str]],
                  where: str) -> Config:
    """`config` (from shapes, `assumed` its undetermined fields) with the fields `keys` names (metadata key
    -> (section, field)) taken from `values`: fields the shapes left open (head counts, eps, RoPE base,
    context) are set, every other one must agree with the shapes."""
    open_fields = {a.split("=")[0] for a in assumed}
    sections = {section: getattr(config, section) for section, _ in SECTIONS}
    for key, (section, field) in keys.items():
        value = _metadata_number(values, key, where)
        if f"{section}.{field}" in open_fields:
            sections[section] = dataclasses.replace(sections[section], **{field: value})
        elif value != getattr(sections[section], field):
            raise ModelError(f"{where}: metadata {key} is {value}, but the tensors say "
                             f"{getattr(sections[section], field)} ({section} {field})")
    out = Config(sections["audio"], sections["adaptor"], sections["text"], config.audio_token_id)
    config_mod.check(out, where)
    return out
