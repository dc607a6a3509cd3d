"""Other published layouts -> the logical names (the Transformers 5.23 state-dict names, DESIGN §4).

Older Hub revisions (`stem`, `layers`, `timestamp_prediction_layers`, `self_attn_layer_norm`, ...) and the
original FunASR names (`audio_encoder.encoders0.0...`, fused `linear_q_k_v`, `audio_adaptor.blocks...`,
`llm.model...`), and llama.cpp's qwen3 names for the decoder (`token_embd`, `blk.N.attn_q`, ...).
"""
from __future__ import annotations

import re

from nanoasr.errors import ModelError
from nanoasr.formats import bounds
from nanoasr.model.config import Config
from nanoasr.storage import DENSE_TYPES
from nanoasr.tensor import StoredTensor

IGNORED = re.compile(r"^(ctc\.|ctc_decoder\.|.*rotary_emb\.inv_freq$)")  # no role in transcription

_SUBLAYER_FUNASR = [
    (".self_attn.linear_out.", ".self_attn.o_proj."), (".self_attn.fsmn_block.", ".self_attn.fsmn.conv."),
    (".self_attn.linear_q.", ".self_attn.q_proj."), (".self_attn.linear_k.", ".self_attn.k_proj."),
    (".self_attn.linear_v.", ".self_attn.v_proj."),
    (".feed_forward.w_1.", ".mlp.fc1."), (".feed_forward.w_2.", ".mlp.fc2."),
    (".norm1.", ".input_layernorm."), (".norm2.", ".post_attention_layernorm."),
]
_SUBLAYER_OLD_HF = [
    (".self_attn_layer_norm.", ".input_layernorm."), (".final_layer_norm.", ".post_attention_layernorm."),
    (".self_attn.out_proj.", ".self_attn.o_proj."), (".fc1.", ".mlp.fc1."), (".fc2.", ".mlp.fc2."),
]
QWEN3_LAYER_NAMES = {  # logical suffix in model.language_model.layers.{i} -> llama.cpp blk.{i} suffix
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def qwen3_names(n_layers: int) -> dict[str, str]:
    """Logical decoder name -> llama.cpp qwen3 name (the LM head is tied: token_embd serves as output)."""
    names = {"model.language_model.embed_tokens.weight": "token_embd.weight",
             "model.language_model.norm.weight": "output_norm.weight"}
    for i in range(n_layers):
        for logical, ours in QWEN3_LAYER_NAMES.items():
            names[f"model.language_model.layers.{i}.{logical}"] = f"blk.{i}.{ours}"
    return names


def _replace_all(name: str, pairs) -> str:
    for old, new in pairs:
        name = name.replace(old, new)
    return name


def _audio_layer(name: str, group: str, digits: str, config: Config) -> int:
    """The logical layer of a FunASR or old-Hub encoder name; its number is bounded before it is converted."""
    index = bounds.index(digits, config.audio.num_hidden_layers, "layer number", f"tensor {name}")
    n_transcription = config.audio.num_hidden_layers - config.audio.num_timestamp_prediction_layers
    return {"first": 0, "main": index + 1, "tp": index + n_transcription}[group]


def _map_funasr(name: str, config: Config) -> str:
    last_main, last = config.audio.final_norm_layers
    if name.startswith("llm.model."):
        return "model.language_model." + name[len("llm.model."):]
    if name.startswith("llm.lm_head."):
        return "lm_head." + name[len("llm.lm_head."):]
    m = re.match(r"audio_encoder\.(encoders0|encoders|tp_encoders)\.(\d+)(\..+)$", name)
    if m:
        group = {"encoders0": "first", "encoders": "main", "tp_encoders": "tp"}[m.group(1)]
        layer = _audio_layer(name, group, m.group(2), config)
        return f"model.audio_tower.layers.{layer}" + _replace_all(m.group(3), _SUBLAYER_FUNASR)
    m = re.match(r"audio_encoder\.(after_norm|tp_norm)\.(weight|bias)$", name)
    if m:
        layer = last_main if m.group(1) == "after_norm" else last
        return f"model.audio_tower.layers.{layer}.final_layernorm.{m.group(2)}"
    return funasr_transformer_name(name, "audio_adaptor.", "model.multi_modal_projector.") or name


def funasr_transformer_name(name: str, source: str, target: str) -> str | None:
    """A FunASR Transformer adaptor's name under `source` (linear1/2, blocks.i.<sublayer>) -> ours under
    `target` (linear_1/2, layers.i.<sublayer>); None for any other name. The audio adaptor and the CTC
    decoder are both such a Transformer."""
    m = re.match(re.escape(source) + r"linear([12])\.(.+)$", name)
    if m:
        return f"{target}linear_{m.group(1)}.{m.group(2)}"
    m = re.match(re.escape(source) + r"blocks\.(\d+)(\..+)$", name)
    if m:
        return f"{target}layers.{m.group(1)}" + _replace_all(m.group(2), _SUBLAYER_FUNASR)
    return None


def _map_old_hf(name: str, config: Config) -> str:
    last_main, last = config.audio.final_norm_layers
    name = name.replace("model.audio_adaptor.", "model.multi_modal_projector.")
    name = name.replace("model.multi_modal_projector.blocks.", "model.multi_modal_projector.layers.")
    m = re.match(r"model\.audio_tower\.(stem|layers|timestamp_prediction_layers)(?:\.(\d+))?(\..+)$", name)
    if m and not (m.group(1) == "layers" and m.group(2) is None):
        group = {"stem": "first", "layers": "main", "timestamp_prediction_layers": "tp"}[m.group(1)]
        layer = _audio_layer(name, group, m.group(2) or "0", config)
        tail = _replace_all(m.group(3), _SUBLAYER_OLD_HF).replace(".fsmn.", ".self_attn.fsmn.")
        return f"model.audio_tower.layers.{layer}" + tail.replace(".self_attn.self_attn.", ".self_attn.")
    m = re.match(r"model\.audio_tower\.(layer_norm|timestamp_prediction_layer_norm)\.(weight|bias)$", name)
    if m:
        layer = last_main if m.group(1) == "layer_norm" else last
        return f"model.audio_tower.layers.{layer}.final_layernorm.{m.group(2)}"
    if name.startswith("model.multi_modal_projector.layers."):
        return _replace_all(name, _SUBLAYER_OLD_HF)
    return name


def _is_old_hf(names) -> bool:
    markers = (".stem.", ".timestamp_prediction_layers.", ".self_attn_layer_norm.", ".audio_adaptor.",
               "model.audio_tower.layer_norm.", ".multi_modal_projector.blocks.")
    return any(marker in n for n in names for marker in markers)


def split_fused_qkv(name: str, t: StoredTensor) -> dict[str, StoredTensor]:
    """FunASR's linear_q_k_v [3D, in] (and bias [3D]) -> q_proj, k_proj, v_proj rows (views, no copy).
    Block-quantized matrices split the same way: their blocks run along a row, and data holds one row each."""
    whole_rows = t.dtype in DENSE_TYPES or (len(t.shape) == 2 and t.data.shape[0] == t.shape[0])
    if not whole_rows or t.shape[0] % 3:
        raise ModelError(f"tensor {name}: a fused q/k/v needs 3*D whole rows, found {t.dtype} "
                         f"{list(t.shape)}")
    d = t.shape[0] // 3
    out = {}
    for i, part in enumerate(("q_proj", "k_proj", "v_proj")):
        data = t.data[i * d:(i + 1) * d]
        out[name.replace("linear_q_k_v", part)] = StoredTensor(data, t.dtype, (d, *t.shape[1:]))
    return out


def to_logical(tensors: dict[str, StoredTensor], config: Config) -> dict[str, StoredTensor]:
    """Rename a checkpoint's tensors onto the logical layout; drops tensors that play no part in
    transcription."""
    names = list(tensors)
    if any(n.startswith(("audio_encoder.", "audio_adaptor.", "llm.")) for n in names):
        mapper = _map_funasr
    elif _is_old_hf(names):
        mapper = _map_old_hf
    else:
        mapper = None
    out = {}
    for name, t in tensors.items():
        if IGNORED.match(name):
            continue
        logical = mapper(name, config) if mapper else name
        if "linear_q_k_v" in logical:
            out.update(split_fused_qkv(logical, t))
        else:
            out[logical] = t
    return out
