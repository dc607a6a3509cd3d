"""Conversion to GGUF: nanoasr's own GGUF of one type (F32/F16/BF16/Q8_0/Q4_K_M), with a per-tensor error
report, and a stock llama.cpp `qwen3` export of the decoder.

The keys follow nanoasr.checkpoints.gguf_schema, which reads them back; docs/gguf.md lists every key.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_VERSION, GGUFValueType, GGUFWriter, GGMLQuantizationType, Keys, LlamaFileType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from nanoasr.checkpoints.checkpoint import Checkpoint, validate
from nanoasr.checkpoints.gguf_schema import ARCH, FILE_KEYS, SCHEMA_KEY, SCHEMA_VERSION
from nanoasr.checkpoints.layouts import qwen3_names
from nanoasr.checkpoints.spec import expected_tensors, spec
from nanoasr.errors import ModelError
from nanoasr.formats import gguf_write
from nanoasr.formats.gguf_read import GGML_TYPES
from nanoasr.formats.gguf_vocab import add_vocab
from nanoasr.formats.gguf_write import Progress
from nanoasr.formats.mapping import release_pages
from nanoasr.model.config import SECTIONS, TextConfig
from nanoasr.quant import quantize
from nanoasr.quant.quantize import ErrorSums
from nanoasr.storage import bf16_to_f32
from nanoasr.tensor import StoredTensor

FILE_TYPES = {"f32": LlamaFileType.ALL_F32, "f16": LlamaFileType.MOSTLY_F16,
              "bf16": LlamaFileType.MOSTLY_BF16,
              "q8_0": LlamaFileType.MOSTLY_Q8_0, "q4_k_m": LlamaFileType.MOSTLY_Q4_K_M}
TARGETS = ("f32", "f16", "bf16") + quantize.MIXES  # matrices stored as they are, or a quantized mix
CHUNK_ELEMENTS = 1 << 18  # elements encoded and checked at once: bounds the float32/float64 temporaries


# --- tensors: the storage mix, encoding and the error report --------------------------------------------

def storage_types(checkpoint: Checkpoint, target: str) -> dict[str, str]:
    """Logical name -> stored type: vectors and FSMN kernels stay F32, matrices follow the target's mix."""
    if target not in TARGETS:
        raise ModelError(f"GGUF type {target!r} is not supported (expected one of {', '.join(TARGETS)})")
    kinds = {name: kind for name, (_, kind) in expected_tensors(checkpoint.config).items()}
    n_layers = checkpoint.config.text.num_hidden_layers
    out = {}
    for name, t in checkpoint.tensors.items():
        if kinds.get(name, "matrix") != "matrix" or target == "f32":
            out[name] = "f32"
        elif target in ("f16", "bf16"):
            out[name] = target
        else:
            out[name] = quantize.storage_type(name, tuple(t.shape), target, n_layers)
    return out


def encode(t: StoredTensor, dtype: str, name: str) -> np.ndarray:
    """A stored tensor in GGUF data layout for `dtype` (BF16 widens first; blocks are [rows, row_bytes]),
    made a chunk of rows at a time, so only one chunk is ever widened to float32."""
    if t.dtype == dtype:
        return np.ascontiguousarray(t.data)
    out = None
    for start, chunk in row_chunks(t):
        data = _encode_chunk(chunk, dtype, name)
        if out is None:
            out = np.empty((t.shape[0], *data.shape[1:]), data.dtype)
        out[start:start + len(data)] = data
    return out


def row_chunks(t: StoredTensor):
    """(first row, the tensor's rows from there) in chunks of about CHUNK_ELEMENTS elements; a tensor of
    fewer than two dimensions is one chunk."""
    if len(t.shape) < 2:
        yield 0, t
        return
    step = max(1, CHUNK_ELEMENTS // math.prod(t.shape[1:]))
    for start in range(0, t.shape[0], step):
        rows = t.data[start:start + step]
        yield start, StoredTensor(rows, t.dtype, (len(rows), *t.shape[1:]))


def _encode_chunk(t: StoredTensor, dtype: str, name: str) -> np.ndarray:
    x = t.numpy()
    if dtype == "f32":
        return x
    if dtype == "f16":
        y = x.astype(np.float16)
        if not np.isfinite(y).all() and np.isfinite(x).all():
            raise ModelError(f"tensor {name}: values up to {np.abs(x).max():.4g} exceed the F16 range")
        return y
    if dtype == "bf16":
        return gguf_quantize(x, GGMLQuantizationType.BF16).view(np.uint16)
    return quantize.quantize(x.reshape(t.shape[0], -1), dtype)


def decode(data: np.ndarray, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """GGUF data of `dtype` back to float32 of the logical shape (the gguf package's dequantizers)."""
    if dtype in ("f32", "f16"):
        return data.astype(np.float32).reshape(shape)
    if dtype == "bf16":
        return bf16_to_f32(data).reshape(shape)
    return gguf_dequantize(data, GGML_TYPES[dtype]).reshape(shape)


def _error(t: StoredTensor, dtype: str, data: np.ndarray) -> dict:
    """error_report of `data` against `t`, summed a chunk of rows at a time."""
    sums = ErrorSums()
    for start, chunk in row_chunks(t):
        sums.add(chunk.numpy(), decode(data[start:start + chunk.shape[0]], dtype, chunk.shape))
    return sums.report()


def _report_row(name: str, t: StoredTensor, dtype: str, data: np.ndarray, report: bool) -> dict:
    row = {"name": name, "type": GGML_TYPES[dtype].name, "shape": list(t.shape), "bytes": int(data.nbytes),
           "rel_rms": None, "max_abs": None}
    if report:
        row.update(_error(t, dtype, data))
    return row


def _write(path: str | Path, arch: str, add_metadata, items, types, report: bool, progress) -> list[dict]:
    """items: (name in the file, logical name, tensor); each is encoded as the writer asks for it (one in
    memory at a time), leaves its report row behind and lets go of its source's pages once written."""
    rows = []

    def encoded():
        for out_name, name, t in items:
            data = encode(t, types[name], name)
            rows.append(dict(_report_row(name, t, types[name], data, report), name=out_name))
            yield data
            release_pages(t.data)  # written: its pages of the source file need not stay resident

    infos = [(out_name, tuple(t.shape), types[name]) for out_name, name, t in items]
    gguf_write.write(Path(path), arch, add_metadata, infos, encoded(), progress)
    return rows


# --- nanoasr's GGUF: metadata and write -----------------------------------------------------------------

def _add_general(w: GGUFWriter, checkpoint: Checkpoint, target: str) -> None:
    package = next(p for p in spec()["packages"] if p["name"] == spec()["default_package"])
    source = checkpoint.source
    repo, revision = source.get("repo"), source.get("revision")
    w.add_name((repo or package["repo"]).split("/")[-1])
    w.add_string(Keys.General.LICENSE, source.get("license") or package["license"])
    w.add_string(Keys.General.LICENSE_LINK, source.get("license_url") or package["license_url"])
    if repo:
        w.add_string(Keys.General.SOURCE_REPO_URL, f"https://huggingface.co/{repo}")
        pinned = f"/tree/{revision}" if revision else ""
        w.add_string(Keys.General.SOURCE_URL, f"https://huggingface.co/{repo}{pinned}")
    w.add_file_type(int(FILE_TYPES[target]))
    w.add_quantization_version(GGML_QUANT_VERSION)


def _add_value(w: GGUFWriter, key: str, value) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float64(key, value)  # float64 keeps eps values such as 1e-12 exact
    else:
        w.add_key_value(key, value, GGUFValueType.STRING)


def _add_nanoasr_keys(w: GGUFWriter, checkpoint: Checkpoint) -> None:
    w.add_uint32(SCHEMA_KEY, SCHEMA_VERSION)
    for section, _ in SECTIONS:
        for field, value in dataclasses.asdict(getattr(checkpoint.config, section)).items():
            _add_value(w, f"{ARCH}.{section}.{field}", value)
    w.add_uint32(f"{ARCH}.audio_token_id", checkpoint.config.audio_token_id)
    for key in ("repo", "revision"):
        if checkpoint.source.get(key):
            w.add_string(f"{ARCH}.source.{key}", checkpoint.source[key])
    for name, key in FILE_KEYS.items():
        if name in checkpoint.files:
            _add_value(w, key, checkpoint.files[name])


def write(path: str | Path, checkpoint: Checkpoint, target: str = "f16", report: bool = True,
          progress: Progress | None = None) -> list[dict]:
    """A nanoasr GGUF of `checkpoint` in `target`; returns one report row per tensor (type, bytes, error).
    `progress(done, total, name, stored_type)` is called after each tensor is written (default: silent)."""
    validate(checkpoint.tensors, checkpoint.config, "checkpoint to convert")
    if "tokenizer.json" not in checkpoint.files:
        raise ModelError("checkpoint to convert has no tokenizer.json; a GGUF must carry its tokenizer")
    types = storage_types(checkpoint, target)
    items = [(name, name, t) for name, t in checkpoint.tensors.items()]

    def add_metadata(w: GGUFWriter) -> None:
        _add_general(w, checkpoint, target)
        _add_nanoasr_keys(w, checkpoint)
        add_vocab(w, checkpoint.files, checkpoint.config.text.vocab_size, "checkpoint to convert")

    return _write(path, ARCH, add_metadata, items, types, report, progress)


# --- stock llama.cpp qwen3 export of the decoder ---------------------------------------------------------

def _add_qwen3_hparams(w: GGUFWriter, t: TextConfig) -> None:
    w.add_context_length(t.max_position_embeddings)
    w.add_embedding_length(t.hidden_size)
    w.add_block_count(t.num_hidden_layers)
    w.add_feed_forward_length(t.intermediate_size)
    w.add_head_count(t.num_attention_heads)
    w.add_head_count_kv(t.num_key_value_heads)
    w.add_key_length(t.head_dim)
    w.add_value_length(t.head_dim)
    w.add_layer_norm_rms_eps(t.rms_norm_eps)
    w.add_rope_freq_base(t.rope_theta)


def write_qwen3(path: str | Path, checkpoint: Checkpoint, target: str = "f16", report: bool = True,
                progress: Progress | None = None) -> list[dict]:
    """The decoder alone as a stock llama.cpp `qwen3` GGUF (to benchmark llama.cpp on the same weights)."""
    validate(checkpoint.tensors, checkpoint.config, "checkpoint to export")
    types = storage_types(checkpoint, target)
    names = qwen3_names(checkpoint.config.text.num_hidden_layers)
    items = [(ours, logical, checkpoint.tensors[logical]) for logical, ours in names.items()]

    def add_metadata(w: GGUFWriter) -> None:
        _add_general(w, checkpoint, target)
        _add_qwen3_hparams(w, checkpoint.config.text)
        add_vocab(w, checkpoint.files, checkpoint.config.text.vocab_size, "checkpoint to export")

    return _write(path, "qwen3", add_metadata, items, types, report, progress)
