"""transcribe.cpp's GGUF (`general.architecture` = funasr_nano), one file.

Written by handy-computer/transcribe.cpp scripts/convert-funasr_nano.py (commit ea077b8) from FunASR's
model.pt: `enc.*`, `adaptor.*` and `dec.*` names (the fused q/k/v and the (D, 1, K) FSMN kernel kept), the LM
head tied to `dec.token_embd`, `stt.funasr_nano.*` and `stt.frontend.*` hyperparameters, `stt.variant`,
`general.languages` and the vocabulary as `tokenizer.ggml.*` arrays. Its quantizer keeps the names and
rewrites matrix types.
"""
from __future__ import annotations

import re

from nanoasr.checkpoints.layouts import to_logical
from nanoasr.checkpoints.runtimes.funasr import funasr_layout
from nanoasr.checkpoints.shapes import config_from_shapes, with_metadata
from nanoasr.errors import ModelError
from nanoasr.model.config import Config
from nanoasr.tensor import StoredTensor

ARCH = "funasr_nano"
VARIANTS = ("fun-asr-nano-2512", "fun-asr-mlt-nano-2512")
_ENCODER_SUBLAYERS = {  # transcribe.cpp suffix -> FunASR suffix, per SAN-M block
    "attn.qkv": "self_attn.linear_q_k_v", "attn.out": "self_attn.linear_out",
    "attn.fsmn": "self_attn.fsmn_block", "ffn.fc1": "feed_forward.w_1", "ffn.fc2": "feed_forward.w_2",
    "norm_attn": "norm1", "norm_ffn": "norm2",
}
_ADAPTOR_SUBLAYERS = {
    "attn.q": "self_attn.linear_q", "attn.k": "self_attn.linear_k", "attn.v": "self_attn.linear_v",
    "attn.out": "self_attn.linear_out", "ffn.fc1": "feed_forward.w_1", "ffn.fc2": "feed_forward.w_2",
    "norm_attn": "norm1", "norm_ffn": "norm2",
}
_DECODER_SUBLAYERS = {
    "norm_attn": "input_layernorm", "norm_ffn": "post_attention_layernorm",
    "attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj", "attn.v": "self_attn.v_proj",
    "attn.o": "self_attn.o_proj", "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
    "ffn.gate": "mlp.gate_proj", "ffn.up": "mlp.up_proj", "ffn.down": "mlp.down_proj",
}
_BLOCKS = [  # (pattern, FunASR prefix, sublayer table)
    (re.compile(r"enc\.(encoders0|encoders|tp_encoders)\.(\d+)\.(.+)\.(weight|bias)$"), "audio_encoder",
     _ENCODER_SUBLAYERS),
    (re.compile(r"adaptor\.(blocks)\.(\d+)\.(.+)\.(weight|bias)$"), "audio_adaptor", _ADAPTOR_SUBLAYERS),
    (re.compile(r"dec\.(layers)\.(\d+)\.(.+)\.(weight|bias)$"), "llm.model", _DECODER_SUBLAYERS),
]
_TOP = {"enc.after_norm": "audio_encoder.after_norm", "enc.tp_norm": "audio_encoder.tp_norm",
        "adaptor.linear1": "audio_adaptor.linear1", "adaptor.linear2": "audio_adaptor.linear2",
        "dec.token_embd": "llm.model.embed_tokens", "dec.output_norm": "llm.model.norm"}
KEYS = {  # metadata key -> (config section, field)
    "stt.funasr_nano.encoder.d_model": ("audio", "hidden_size"),
    "stt.funasr_nano.encoder.n_heads": ("audio", "num_attention_heads"),
    "stt.funasr_nano.encoder.d_ff": ("audio", "intermediate_size"),
    "stt.funasr_nano.encoder.kernel_size": ("audio", "fsmn_kernel_size"),
    "stt.funasr_nano.encoder.tp_blocks": ("audio", "num_timestamp_prediction_layers"),
    "stt.frontend.num_mels": ("audio", "num_mel_bins"),
    "stt.frontend.lfr_m": ("audio", "num_stacked_frames"),
    "stt.funasr_nano.adaptor.n_blocks": ("adaptor", "num_hidden_layers"),
    "stt.funasr_nano.adaptor.llm_dim": ("adaptor", "hidden_size"),
    "stt.funasr_nano.adaptor.pre_ffn_dim": ("adaptor", "projector_hidden_size"),
    "stt.funasr_nano.adaptor.block_ffn_dim": ("adaptor", "intermediate_size"),
    "stt.funasr_nano.adaptor.n_heads": ("adaptor", "num_attention_heads"),
    "stt.funasr_nano.adaptor.use_low_frame_rate": ("adaptor", "use_low_frame_rate"),
    "stt.funasr_nano.decoder.n_layers": ("text", "num_hidden_layers"),
    "stt.funasr_nano.decoder.hidden_size": ("text", "hidden_size"),
    "stt.funasr_nano.decoder.intermediate_size": ("text", "intermediate_size"),
    "stt.funasr_nano.decoder.n_heads": ("text", "num_attention_heads"),
    "stt.funasr_nano.decoder.n_kv_heads": ("text", "num_key_value_heads"),
    "stt.funasr_nano.decoder.head_dim": ("text", "head_dim"),
    "stt.funasr_nano.decoder.vocab_size": ("text", "vocab_size"),
    "stt.funasr_nano.decoder.max_position_embeddings": ("text", "max_position_embeddings"),
    "stt.funasr_nano.decoder.rms_norm_eps": ("text", "rms_norm_eps"),
    "stt.funasr_nano.decoder.rope_theta": ("text", "rope_theta"),
}
FIXED = {"stt.funasr_nano.encoder.sanm_shift": 0, "stt.funasr_nano.adaptor.downsample_rate": 1,
         "stt.frontend.lfr_n": 6, "stt.frontend.sample_rate": 16000, "stt.frontend.apply_cmvn": False,
         "stt.funasr_nano.decoder.tie_word_embeddings": True}


def _funasr_name(name: str, where: str) -> str:
    base, dot, kind = name.rpartition(".")
    if base in _TOP and kind in ("weight", "bias"):
        return f"{_TOP[base]}.{kind}"
    for pattern, prefix, sublayers in _BLOCKS:
        m = pattern.fullmatch(name)
        if m and m.group(3) in sublayers:
            return f"{prefix}.{m.group(1)}.{m.group(2)}.{sublayers[m.group(3)]}.{m.group(4)}"
    raise ModelError(f"{where}: unexpected tensor {name} (not in transcribe.cpp's funasr_nano layout)")


def _check_fixed(values: dict, where: str) -> None:
    for key, expected in FIXED.items():
        if key not in values:
            raise ModelError(f"{where}: metadata {key} is missing (transcribe.cpp's converter writes it)")
        if values[key] != expected or type(values[key]) is not type(expected):
            raise ModelError(f"{where}: metadata {key} is {values[key]!r}, only {expected!r} is supported")
    variant = values.get("stt.variant")
    if variant not in VARIANTS:
        raise ModelError(f"{where}: stt.variant {variant!r} is not a Fun-ASR-Nano variant nanoasr knows "
                         f"(expected one of {', '.join(VARIANTS)})")


def read(values: dict, tensors: dict[str, StoredTensor],
         where: str) -> tuple[Config, dict[str, StoredTensor]]:
    """transcribe.cpp's metadata and tensors -> (config, logical tensors)."""
    _check_fixed(values, where)
    funasr = {_funasr_name(name, where): t for name, t in tensors.items()}
    logical = to_logical(funasr, funasr_layout(funasr, where))
    config, assumed = config_from_shapes(logical, values.get("tokenizer.ggml.tokens"), where)
    return with_metadata(config, assumed, values, KEYS, where), logical
