"""CrispASR's GGUF (`general.architecture` = funasr), one file.

Written by CrispStrobe/CrispASR models/convert-funasr-to-gguf.py (commit 72d3c38) from FunASR's model.pt:
`funasr.enc.blk.{0..}` SAN-M blocks numbered as nanoasr numbers its layers (0 = encoders0, then encoders,
then tp_encoders), each FSMN kernel squeezed to (D, K), `funasr.adaptor.*`, llama.cpp's qwen3 names for the
decoder with `output.weight` written out; matrices F16, vectors F32; `funasr.*` and `funasr.llm.*` keys and
a token list without token types. Early files state `funasr.ada_n_heads` = 16, a converter mistake that
CrispASR's runtime ignores (the adaptor has 8 heads): it is read as 8 here too.
"""
from __future__ import annotations

import re
import warnings

from gguf import TokenType

from nanoasr.checkpoints.layouts import qwen3_names, split_fused_qkv
from nanoasr.checkpoints.shapes import config_from_shapes, layer_count, with_metadata
from nanoasr.errors import ModelError
from nanoasr.model.config import Config
from nanoasr.storage import DENSE_TYPES
from nanoasr.tensor import StoredTensor

ARCHES = ("funasr", "fun_asr", "fun-asr")
_SUBLAYERS = {  # CrispASR suffix -> logical suffix, per encoder or adaptor block
    "norm1.w": "input_layernorm.weight", "norm1.b": "input_layernorm.bias",
    "norm2.w": "post_attention_layernorm.weight", "norm2.b": "post_attention_layernorm.bias",
    "attn.qkv.w": "self_attn.linear_q_k_v.weight", "attn.qkv.b": "self_attn.linear_q_k_v.bias",
    "attn.q.w": "self_attn.q_proj.weight", "attn.q.b": "self_attn.q_proj.bias",
    "attn.k.w": "self_attn.k_proj.weight", "attn.k.b": "self_attn.k_proj.bias",
    "attn.v.w": "self_attn.v_proj.weight", "attn.v.b": "self_attn.v_proj.bias",
    "attn.out.w": "self_attn.o_proj.weight", "attn.out.b": "self_attn.o_proj.bias",
    "attn.fsmn.w": "self_attn.fsmn.conv.weight",
    "ffn.l1.w": "mlp.fc1.weight", "ffn.l1.b": "mlp.fc1.bias",
    "ffn.l2.w": "mlp.fc2.weight", "ffn.l2.b": "mlp.fc2.bias",
}
KEYS = {  # metadata key -> (config section, field)
    "funasr.n_mels": ("audio", "num_mel_bins"), "funasr.lfr_m": ("audio", "num_stacked_frames"),
    "funasr.d_model": ("audio", "hidden_size"), "funasr.n_heads": ("audio", "num_attention_heads"),
    "funasr.ffn_dim": ("audio", "intermediate_size"), "funasr.sanm_kernel": ("audio", "fsmn_kernel_size"),
    "funasr.n_blocks_tp": ("audio", "num_timestamp_prediction_layers"),
    "funasr.ada_ffn": ("adaptor", "projector_hidden_size"), "funasr.ada_d_out": ("adaptor", "hidden_size"),
    "funasr.ada_n_layers": ("adaptor", "num_hidden_layers"),
    "funasr.ada_n_heads": ("adaptor", "num_attention_heads"),
    "funasr.ada_ffn_inner": ("adaptor", "intermediate_size"),
    "funasr.use_low_frame_rate": ("adaptor", "use_low_frame_rate"),
    "funasr.llm.n_layers": ("text", "num_hidden_layers"), "funasr.llm.d_model": ("text", "hidden_size"),
    "funasr.llm.n_heads": ("text", "num_attention_heads"),
    "funasr.llm.n_kv_heads": ("text", "num_key_value_heads"), "funasr.llm.head_dim": ("text", "head_dim"),
    "funasr.llm.ff_dim": ("text", "intermediate_size"), "funasr.llm.vocab_size": ("text", "vocab_size"),
    "funasr.llm.max_pos": ("text", "max_position_embeddings"),
    "funasr.llm.rms_norm_eps": ("text", "rms_norm_eps"), "funasr.llm.rope_theta": ("text", "rope_theta"),
}
FIXED = {"funasr.lfr_n": 6, "funasr.sample_rate": 16000, "funasr.frame_length_ms": 25,
         "funasr.frame_shift_ms": 10}
MISTAKEN_ADAPTOR_HEADS = 16


def _fsmn_as_conv(name: str, t: StoredTensor, where: str) -> StoredTensor:
    """(D, K) as the converter squeezes it -> the convolution's (D, 1, K)."""
    if len(t.shape) != 2 or t.dtype not in DENSE_TYPES:
        raise ModelError(f"{where}: tensor {name}: expected a float (D, K) FSMN kernel, found {t.dtype} "
                         f"{list(t.shape)}")
    d, k = t.shape
    return StoredTensor(t.data.reshape(d, 1, k), t.dtype, (d, 1, k))


def _logical_name(name: str, n_main: int, n_layers: int, decoder: dict[str, str], where: str) -> str:
    m = re.fullmatch(r"funasr\.(enc|adaptor)\.blk\.(\d+)\.(.+)", name)
    if m and m.group(3) in _SUBLAYERS:
        owner = "audio_tower" if m.group(1) == "enc" else "multi_modal_projector"
        return f"model.{owner}.layers.{m.group(2)}.{_SUBLAYERS[m.group(3)]}"
    m = re.fullmatch(r"funasr\.(enc\.after_norm|enc\.tp_norm|adaptor\.linear[12])\.([wb])", name)
    if m:
        kind = "weight" if m.group(2) == "w" else "bias"
        return {"enc.after_norm": f"model.audio_tower.layers.{n_main - 1}.final_layernorm",
                "enc.tp_norm": f"model.audio_tower.layers.{n_layers - 1}.final_layernorm",
                "adaptor.linear1": "model.multi_modal_projector.linear_1",
                "adaptor.linear2": "model.multi_modal_projector.linear_2"}[m.group(1)] + f".{kind}"
    if name in decoder:
        return decoder[name]
    raise ModelError(f"{where}: unexpected tensor {name} (not in CrispASR's funasr layout)")


def _tensors(values: dict, tensors: dict[str, StoredTensor], where: str) -> dict[str, StoredTensor]:
    n_main = values.get("funasr.n_blocks_base")
    n_layers = layer_count(tensors, "funasr.enc.blk.", where)
    if isinstance(n_main, bool) or not isinstance(n_main, int) or not 0 < n_main <= n_layers:
        raise ModelError(f"{where}: metadata funasr.n_blocks_base is {n_main!r}, expected the count of "
                         f"encoder blocks before the timestamp blocks (1 to {n_layers})")
    decoder = {ours: logical for logical, ours in qwen3_names(layer_count(tensors, "blk.", where)).items()}
    decoder["output.weight"] = "lm_head.weight"
    out = {}
    for name, t in tensors.items():
        logical = _logical_name(name, n_main, n_layers, decoder, where)
        if name.endswith(".attn.fsmn.w"):
            out[logical] = _fsmn_as_conv(name, t, where)
        elif "linear_q_k_v" in logical:
            out.update(split_fused_qkv(logical, t))
        else:
            out[logical] = t
    return out


def with_token_types(values: dict) -> dict:
    """The converter writes no token types: unnamed ids are unused, `<|...|>` tokens control tokens."""
    tokens = values.get("tokenizer.ggml.tokens")
    if "tokenizer.ggml.token_type" in values or not isinstance(tokens, list):
        return values
    types = [TokenType.UNUSED if t == "" else TokenType.CONTROL if _looks_special(t) else TokenType.NORMAL
             for t in tokens]
    return dict(values, **{"tokenizer.ggml.token_type": [int(t) for t in types]})


def _looks_special(token) -> bool:
    return isinstance(token, str) and token.startswith("<|") and token.endswith("|>")


def _adaptor_heads(values: dict, where: str) -> dict:
    if values.get("funasr.ada_n_heads") != MISTAKEN_ADAPTOR_HEADS:
        return values
    warnings.warn(f"{where}: funasr.ada_n_heads is 16, a mistake of early CrispASR conversions; the adaptor "
                  f"has 8 heads, as CrispASR's own runtime assumes", stacklevel=4)
    return dict(values, **{"funasr.ada_n_heads": 8})


def variant(values: dict) -> str:
    """The converter names the file after the repository it converts (Fun-ASR-MLT-Nano-2512 or not)."""
    return "fun-asr-mlt-nano-2512" if "MLT" in str(values.get("general.name", "")) else "fun-asr-nano-2512"


def read(values: dict, tensors: dict[str, StoredTensor],
         where: str) -> tuple[Config, dict[str, StoredTensor]]:
    """CrispASR's metadata and tensors -> (config, logical tensors)."""
    for key, expected in FIXED.items():
        if values.get(key, expected) != expected:
            raise ModelError(f"{where}: metadata {key} is {values[key]!r}, only {expected} is supported")
    logical = _tensors(values, tensors, where)
    config, assumed = config_from_shapes(logical, values.get("tokenizer.ggml.tokens"), where)
    config = with_metadata(config, assumed, _adaptor_heads(values, where), KEYS, where)
    return config, logical
