"""FunASR's llama.cpp runtime files, opened as a pair: the encoder GGUF and a stock llama.cpp `qwen3` GGUF.

The encoder file (`general.architecture` = funasr-sensevoice-encoder) holds the `audio_encoder.*` and
`audio_adaptor.*` tensors under their model.pt names, each FSMN kernel stored as (K, D) instead of
(D, 1, K), and `funasr.enc.*` / `funasr.adp.*` / `funasr.frontend.*` keys (modelscope/FunASR
runtime/llama.cpp/fun-asr-nano/export_encoder_gguf.py). The decoder file is llama.cpp's own conversion of
Qwen3 (convert_hf_to_gguf.py, Qwen3Model): `token_embd`, `blk.N.*`, `output_norm`, an `output` matrix only
when the head is not tied, `qwen3.*` hyperparameters and the vocabulary as `tokenizer.ggml.*` arrays.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from nanoasr.checkpoints.checkpoint import Checkpoint, validate
from nanoasr.checkpoints.layouts import qwen3_names, to_logical
from nanoasr.checkpoints.runtimes.funasr import funasr_layout
from nanoasr.checkpoints.shapes import config_from_shapes, layer_count, with_metadata
from nanoasr.errors import ModelError
from nanoasr.formats import gguf_read
from nanoasr.formats.gguf_vocab import tokenizer_files
from nanoasr.model.config import Config
from nanoasr.storage import DENSE_TYPES
from nanoasr.tensor import StoredTensor

ENCODER_ARCH = "funasr-sensevoice-encoder"
DECODER_ARCH = "qwen3"
# encoder-file key -> (config section, field) it must agree with
ENCODER_KEYS = {
    "funasr.enc.output_size": ("audio", "hidden_size"),
    "funasr.enc.attention_heads": ("audio", "num_attention_heads"),
    "funasr.enc.linear_units": ("audio", "intermediate_size"),
    "funasr.enc.kernel_size": ("audio", "fsmn_kernel_size"),
    "funasr.enc.tp_blocks": ("audio", "num_timestamp_prediction_layers"),
    "funasr.frontend.n_mels": ("audio", "num_mel_bins"),
    "funasr.frontend.lfr_m": ("audio", "num_stacked_frames"),
    "funasr.adp.llm_dim": ("adaptor", "hidden_size"),
    "funasr.adp.ffn_dim": ("adaptor", "projector_hidden_size"),
    "funasr.adp.n_layer": ("adaptor", "num_hidden_layers"),
    "funasr.adp.attention_heads": ("adaptor", "num_attention_heads"),
}
FIXED_KEYS = {"funasr.enc.sanm_shfit": 0, "funasr.adp.downsample_rate": 1, "funasr.frontend.lfr_n": 6}
DECODER_KEYS = {
    "qwen3.attention.head_count": ("text", "num_attention_heads"),
    "qwen3.attention.head_count_kv": ("text", "num_key_value_heads"),
    "qwen3.attention.layer_norm_rms_epsilon": ("text", "rms_norm_eps"),
    "qwen3.rope.freq_base": ("text", "rope_theta"),
    "qwen3.context_length": ("text", "max_position_embeddings"),
}


def _read(path: Path, arch: str, role: str, contents: dict) -> tuple[dict, dict[str, StoredTensor]]:
    values, tensors = contents.get(path) or gguf_read.read(path)
    found = values.get("general.architecture")
    if found != arch:
        raise ModelError(f"{path}: expected the {role} of FunASR's llama.cpp runtime "
                         f"(general.architecture {arch!r}), found {found!r}")
    return values, tensors


def _fsmn_as_conv(name: str, t: StoredTensor, where: str) -> StoredTensor:
    """(K, D) as the export script stores it -> the convolution's (D, 1, K)."""
    if len(t.shape) != 2 or t.dtype not in DENSE_TYPES:
        raise ModelError(f"{where}: tensor {name}: expected a float (K, D) FSMN kernel, found {t.dtype} "
                         f"{list(t.shape)}")
    k, d = t.shape
    return StoredTensor(np.ascontiguousarray(t.data.T).reshape(d, 1, k), t.dtype, (d, 1, k))


def _encoder_tensors(tensors: dict[str, StoredTensor], where: str) -> dict[str, StoredTensor]:
    out = {}
    for name, t in tensors.items():
        if not name.startswith(("audio_encoder.", "audio_adaptor.")):
            raise ModelError(f"{where}: unexpected tensor {name} "
                             f"(expected audio_encoder.* and audio_adaptor.* only)")
        out[name] = _fsmn_as_conv(name, t, where) if name.endswith("fsmn_block.weight") else t
    return to_logical(out, funasr_layout(out, where))


def _decoder_tensors(tensors: dict[str, StoredTensor], where: str) -> dict[str, StoredTensor]:
    n_layers = layer_count(tensors, "blk.", where)
    logical_of = {ours: logical for logical, ours in qwen3_names(n_layers).items()}
    logical_of["output.weight"] = "lm_head.weight"  # present when the head is not tied
    unknown = [name for name in tensors if name not in logical_of]
    if unknown:
        raise ModelError(f"{where}: unexpected tensor {unknown[0]} (expected llama.cpp's qwen3 names: "
                         f"token_embd, blk.N.attn_q ..., output_norm, output)")
    return {logical_of[name]: t for name, t in tensors.items()}


def _config(tensors: dict, encoder_values: dict, decoder_values: dict, where: tuple[str, str]) -> Config:
    """Sizes from the shapes; head counts, eps, RoPE base and context from the two files' keys, which must
    agree with the shapes everywhere else."""
    config, assumed = config_from_shapes(tensors, decoder_values.get("tokenizer.ggml.tokens"), where[1])
    for key, expected in FIXED_KEYS.items():
        if key in encoder_values and encoder_values[key] != expected:
            raise ModelError(f"{where[0]}: metadata {key} is {encoder_values[key]!r}, only {expected} is "
                             f"supported")
    config = with_metadata(config, assumed, encoder_values, ENCODER_KEYS, where[0])
    config = with_metadata(config, assumed, decoder_values, DECODER_KEYS, where[1])
    main_blocks = config.audio.num_hidden_layers - config.audio.num_timestamp_prediction_layers
    stated = encoder_values.get("funasr.enc.num_blocks")
    if stated != main_blocks:
        raise ModelError(f"{where[0]}: metadata funasr.enc.num_blocks is {stated!r}, but the tensors hold "
                         f"{main_blocks} (encoders0 + encoders)")
    return config


def load_pair(encoder: Path, decoder: Path, contents: dict | None = None) -> Checkpoint:
    """FunASR's llama.cpp encoder GGUF + the decoder's qwen3 GGUF -> one validated Checkpoint. `contents`:
    path -> what gguf_read.read returned, for the files the caller has read already."""
    where, contents = (str(encoder), str(decoder)), contents or {}
    encoder_values, encoder_raw = _read(encoder, ENCODER_ARCH, "encoder file", contents)
    decoder_values, decoder_raw = _read(decoder, DECODER_ARCH, "decoder file (a llama.cpp qwen3 GGUF)",
                                        contents)
    tensors = {**_encoder_tensors(encoder_raw, where[0]), **_decoder_tensors(decoder_raw, where[1])}
    config = _config(tensors, encoder_values, decoder_values, where)
    template = decoder_values.get("tokenizer.chat_template")
    files = tokenizer_files(decoder_values, {"chat_template.jinja": template} if isinstance(template, str)
                            else {}, where[1])
    validate(tensors, config, f"{encoder} + {decoder.name}")
    return Checkpoint(config, tensors, files, {"path": where[0], "decoder_path": where[1],
                                               "format": "funasr-llama.cpp"})
