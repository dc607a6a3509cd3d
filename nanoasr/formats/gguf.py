"""nanoasr's GGUF schema over the `gguf` package: a bounded, memory-mapped reader, a streaming
writer (F32/F16/BF16/Q8_0/Q4_K_M) and a stock llama.cpp `qwen3` export of the decoder.

A nanoasr GGUF keeps the logical tensor names and carries everything a checkpoint directory holds: every
typed-config field as `fun_asr_nano.<section>.<field>`, the checkpoint's text files verbatim as strings,
and `tokenizer.ggml.*` arrays so generic GGUF tools see the vocabulary. docs/gguf.md lists every key.
"""
from __future__ import annotations

import dataclasses
import json
import mmap
import os
import re
import struct
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import (GGML_QUANT_SIZES, GGML_QUANT_VERSION, GGUF_DEFAULT_ALIGNMENT, GGUFValueType, GGUFWriter,
                  GGMLQuantizationType, Keys, LlamaFileType, TokenType)
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from nanoasr.errors import ModelError
from nanoasr.model import config as config_mod
from nanoasr.model.config import AdaptorConfig, AudioConfig, Config, TextConfig
from nanoasr.model.weights import Checkpoint, expected_tensors, spec, validate
from nanoasr.tensor import StoredTensor, bf16_to_f32

ARCH = "fun_asr_nano"
SCHEMA_KEY = f"{ARCH}.schema_version"
SCHEMA_VERSION = 1
SECTIONS = (("audio", AudioConfig), ("adaptor", AdaptorConfig), ("text", TextConfig))
FILE_KEYS = {  # checkpoint file -> the key that holds its text verbatim
    "config.json": f"{ARCH}.files.config_json",
    "tokenizer.json": f"{ARCH}.files.tokenizer_json",
    "chat_template.jinja": f"{ARCH}.files.chat_template",
    "processor_config.json": f"{ARCH}.files.processor_config_json",
    "generation_config.json": f"{ARCH}.files.generation_config_json",
    "tokenizer_config.json": f"{ARCH}.files.tokenizer_config_json",
}
GGML_TYPES = {"f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16,
              "bf16": GGMLQuantizationType.BF16, "q8_0": GGMLQuantizationType.Q8_0,
              "q4_k": GGMLQuantizationType.Q4_K, "q6_k": GGMLQuantizationType.Q6_K}
STORED_TYPES = {ggml: stored for stored, ggml in GGML_TYPES.items()}
FILE_TYPES = {"f32": LlamaFileType.ALL_F32, "f16": LlamaFileType.MOSTLY_F16,
              "bf16": LlamaFileType.MOSTLY_BF16,
              "q8_0": LlamaFileType.MOSTLY_Q8_0, "q4_k_m": LlamaFileType.MOSTLY_Q4_K_M}
TARGETS = tuple(FILE_TYPES)
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")  # the Qwen2 pre-tokenizer pattern (tokenizer.ggml.pre = "qwen2")


# --- bounded header reader ------------------------------------------------------------------------------
# GGUFReader trusts the counts a file states (it loops `array length` times even past the end of the file)
# and parses every array element through numpy (about 14 s for Qwen's 151,936 tokens and 151,387 merges on
# a 2-core machine), so the header is read here: every count and length checked against the file size
# before it is used, numeric arrays as one frombuffer, string arrays in one tight loop. The tests hold it
# to GGUFReader's reading of the same files.

SCALARS = {GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.BOOL: "?",
           GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2", GGUFValueType.UINT32: "<u4",
           GGUFValueType.INT32: "<i4", GGUFValueType.FLOAT32: "<f4", GGUFValueType.UINT64: "<u8",
           GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8"}
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, the smallest value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # logical (numpy) order: GGUF stores the dimensions reversed
    ggml_type: GGMLQuantizationType
    start: int  # absolute byte offset of the data
    nbytes: int


@dataclass(frozen=True)
class Header:
    version: int
    values: dict  # key -> str | int | float | bool | list
    tensors: list[TensorInfo]


class _Cursor:
    """Reads little-endian fields of a memory-mapped header, refusing to step past the end of the file."""

    def __init__(self, buf, size: int, where: str):
        self.buf, self.size, self.where, self.offset = buf, size, where, 0

    @property
    def remaining(self) -> int:
        return self.size - self.offset

    def take(self, fmt: str, what: str) -> tuple:
        n = struct.calcsize(fmt)
        if n > self.remaining:
            raise ModelError(f"{self.where}: truncated: {what} at byte {self.offset} needs {n} bytes, "
                             f"the file ends at {self.size}")
        values = struct.unpack_from(fmt, self.buf, self.offset)
        self.offset += n
        return values

    def string(self, what: str) -> str:
        (n,) = self.take("<Q", f"length of {what}")
        if n > self.remaining:
            raise ModelError(f"{self.where}: {what} at byte {self.offset} claims {n} bytes but only "
                             f"{self.remaining} remain (truncated or corrupt)")
        self.offset += n
        return self._text(self.buf[self.offset - n:self.offset], what)

    def strings(self, count: int, what: str) -> list[str]:
        buf, offset, size, out = self.buf, self.offset, self.size, []
        for _ in range(count):
            if offset + 8 > size:
                break
            (n,) = _U64.unpack_from(buf, offset)
            offset += 8 + n
            out.append(buf[offset - n:offset])
        if len(out) < count or offset > size:
            raise ModelError(f"{self.where}: {what}: {count} strings run past the end of the "
                             f"{size}-byte file (truncated or corrupt)")
        self.offset = offset
        return [self._text(b, what) for b in out]

    def _text(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ModelError(f"{self.where}: {what} is not UTF-8 ({exc})") from None


def _value_type(raw: int, what: str, where: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise ModelError(f"{where}: {what} has unknown value type {raw}") from None


def _array(cur: _Cursor, key: str) -> list:
    raw_item, n = cur.take("<IQ", f"array header of {key}")
    item = _value_type(raw_item, f"array {key}", cur.where)
    if item == GGUFValueType.ARRAY:
        raise ModelError(f"{cur.where}: key {key}: nested arrays are not supported")
    least = 8 if item == GGUFValueType.STRING else np.dtype(SCALARS[item]).itemsize
    if n * least > cur.remaining:
        raise ModelError(f"{cur.where}: key {key}: array of {n} {item.name} needs at least {n * least} "
                         f"bytes but only {cur.remaining} remain (truncated or corrupt)")
    if item == GGUFValueType.STRING:
        return cur.strings(n, f"array {key}")
    values = np.frombuffer(cur.buf, SCALARS[item], count=n, offset=cur.offset).tolist()
    cur.offset += n * least
    return values


def _kv(cur: _Cursor) -> tuple[str, object]:
    key = cur.string("a key")
    (raw,) = cur.take("<I", f"value type of {key}")
    vtype = _value_type(raw, f"key {key}", cur.where)
    if vtype == GGUFValueType.STRING:
        return key, cur.string(f"value of {key}")
    if vtype == GGUFValueType.ARRAY:
        return key, _array(cur, key)
    dtype = np.dtype(SCALARS[vtype])
    (raw_value,) = cur.take(f"<{dtype.itemsize}s", f"value of {key}")
    return key, np.frombuffer(raw_value, dtype)[0].item()


def _tensor_info(cur: _Cursor) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int, int]:
    """(name, GGUF-order dims, type, offset inside the data section, bytes)."""
    name = cur.string("a tensor name")
    (n_dims,) = cur.take("<I", f"dimension count of tensor {name}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise ModelError(f"{cur.where}: tensor {name}: {n_dims} dimensions (expected 1 to {MAX_DIMS})")
    dims = cur.take(f"<{n_dims}Q", f"dimensions of tensor {name}")
    raw_type, offset = cur.take("<IQ", f"type and offset of tensor {name}")
    if raw_type not in GGMLQuantizationType._value2member_map_:
        raise ModelError(f"{cur.where}: tensor {name}: unknown GGML type {raw_type}")
    ggml_type = GGMLQuantizationType(raw_type)
    block, type_bytes = GGML_QUANT_SIZES[ggml_type]
    if min(dims) < 1 or dims[0] % block:
        raise ModelError(f"{cur.where}: tensor {name}: dimensions {list(dims)} are not valid for "
                         f"{ggml_type.name} (rows of whole {block}-element blocks)")
    nbytes = int(np.prod(dims, dtype=object)) // block * type_bytes
    if nbytes > cur.size:
        raise ModelError(f"{cur.where}: tensor {name}: dimensions {list(dims)} need {nbytes} bytes, "
                         f"more than the whole file ({cur.size})")
    return name, dims, ggml_type, offset, nbytes


def _alignment(values: dict, where: str) -> int:
    alignment = values.get(Keys.General.ALIGNMENT, GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ModelError(f"{where}: {Keys.General.ALIGNMENT} must be a power of two, found {alignment!r}")
    return alignment


def _walk(buf, size: int, where: str) -> Header:
    if buf[:4] != b"GGUF":
        raise ModelError(f"{where}: not a GGUF file (magic {bytes(buf[:4])!r}, expected b'GGUF')")
    cur = _Cursor(buf, size, where)
    cur.offset = 4
    version, n_tensors, n_kv = cur.take("<IQQ", "the header")
    if version not in SUPPORTED_VERSIONS:
        raise ModelError(f"{where}: GGUF version {version} is not supported (expected 2 or 3, little-endian)")
    if n_kv * MIN_KV_BYTES > cur.remaining or n_tensors * MIN_TENSOR_INFO_BYTES > cur.remaining:
        raise ModelError(f"{where}: header claims {n_kv} keys and {n_tensors} tensors, more than a "
                         f"{size}-byte file can hold (truncated or corrupt)")
    values = {}
    for _ in range(n_kv):
        key, value = _kv(cur)
        if key in values:
            raise ModelError(f"{where}: key {key} appears twice")
        values[key] = value
    infos = [_tensor_info(cur) for _ in range(n_tensors)]
    alignment = _alignment(values, where)
    data_start = -(-cur.offset // alignment) * alignment
    tensors = []
    for name, dims, ggml_type, offset, nbytes in infos:
        if offset % alignment or data_start + offset + nbytes > size:
            start = data_start + offset
            raise ModelError(f"{where}: tensor {name}: data [{start}, {start + nbytes}) "
                             f"is misaligned or past the end of the {size}-byte file (truncated?)")
        tensors.append(TensorInfo(name, tuple(reversed(dims)), ggml_type, data_start + offset, nbytes))
    if len({t.name for t in tensors}) != len(tensors):
        raise ModelError(f"{where}: a tensor name appears twice")
    return Header(version, values, tensors)


def read_header(path: Path) -> Header:
    """Keys and tensor infos of a GGUF file, every count and extent checked against the file size."""
    size = path.stat().st_size
    if size < 4:
        raise ModelError(f"{path}: truncated: {size} bytes, not a GGUF file")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _walk(buf, size, str(path))


# --- vocabulary: tokenizer.json <-> tokenizer.ggml.* ----------------------------------------------------

def _special_token(tokenizer_config: dict, role: str, default: str) -> str:
    value = tokenizer_config.get(role) or default
    return value.get("content", default) if isinstance(value, dict) else value


def _added_type(added: dict) -> int:
    return int(TokenType.CONTROL if added.get("special") else TokenType.USER_DEFINED)


def vocab_arrays(files: dict[str, str], vocab_size: int, where: str) -> dict:
    """tokens, token types, merges and special ids (the llama.cpp `gpt2` model) from tokenizer.json."""
    try:
        tokenizer = json.loads(files["tokenizer.json"])
        model = tokenizer["model"]
        vocab, merges = dict(model["vocab"]), list(model["merges"])
        entries = [(i, t, int(TokenType.NORMAL)) for t, i in vocab.items()]
        entries += [(a["id"], a["content"], _added_type(a)) for a in tokenizer.get("added_tokens", [])]
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:  # JSONDecodeError too
        raise ModelError(f"{where}: tokenizer.json is not a BPE tokenizer ({exc!r})") from None
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]  # ids no token uses, as llama.cpp names them
    types = [int(TokenType.UNUSED)] * vocab_size
    for i, token, kind in entries:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size:
            raise ModelError(f"{where}: tokenizer.json token {token!r} has id {i}, outside the vocabulary "
                             f"(size {vocab_size})")
        tokens[i], types[i] = token, kind
    ids = {t: i for i, t in enumerate(tokens)}
    roles = json.loads(files.get("tokenizer_config.json", "{}"))
    defaults = (("bos", "<|endoftext|>"), ("eos", "<|im_end|>"), ("pad", "<|endoftext|>"))
    special = {role: ids.get(_special_token(roles, f"{role}_token", default)) for role, default in defaults}
    return {"tokens": tokens, "types": types, "special": special,
            "merges": [m if isinstance(m, str) else " ".join(m) for m in merges]}


def _add_vocab(w: GGUFWriter, files: dict[str, str], vocab_size: int, where: str) -> None:
    arrays = vocab_arrays(files, vocab_size, where)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(arrays["tokens"])
    w.add_token_types(arrays["types"])
    w.add_token_merges(arrays["merges"])
    for role, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("pad", w.add_pad_token_id)):
        if arrays["special"][role] is not None:
            add(arrays["special"][role])
    w.add_add_bos_token(False)
    template = files.get("chat_template.jinja") or json.loads(files.get("tokenizer_config.json", "{}")).get(
        "chat_template")
    if template:
        w.add_chat_template(template)


def tokenizer_from_vocab(tokens: list[str], types: list[int], merges: list[str]) -> str:
    """A tokenizer.json (byte-level BPE, Qwen2 pre-tokenizer) rebuilt from tokenizer.ggml.* arrays."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {t: i for i, (t, kind) in enumerate(zip(tokens, types)) if kind != TokenType.UNUSED}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tokenizer = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind == TokenType.CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types) if kind == TokenType.USER_DEFINED])
    return tokenizer.to_str()


# --- writer ---------------------------------------------------------------------------------------------

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
            out[name] = _quantizer().storage_type(name, tuple(t.shape), target, n_layers)
    return out


def _quantizer():
    try:
        from nanoasr.quant import quantize
    except ImportError as exc:
        raise ModelError(f"quantized GGUF types need nanoasr.quant.quantize, which cannot be imported "
                         f"({exc})") from None
    return quantize


def encode(t: StoredTensor, dtype: str, name: str) -> np.ndarray:
    """A stored tensor in GGUF data layout for `dtype` (BF16 widens first; blocks are [rows, row_bytes])."""
    if t.dtype == dtype:
        return np.ascontiguousarray(t.data)
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
    return _quantizer().quantize(x.reshape(t.shape[0], -1), dtype)


def decode(data: np.ndarray, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """GGUF data of `dtype` back to float32 of the logical shape (the gguf package's dequantizers)."""
    if dtype in ("f32", "f16"):
        return data.astype(np.float32).reshape(shape)
    if dtype == "bf16":
        return bf16_to_f32(data).reshape(shape)
    return gguf_dequantize(data, GGML_TYPES[dtype]).reshape(shape)


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    block, type_bytes = GGML_QUANT_SIZES[GGML_TYPES[dtype]]
    if shape[-1] % block:
        raise ModelError(f"{dtype} needs rows of whole {block}-element blocks, found shape {list(shape)}")
    return int(np.prod(shape, dtype=np.int64)) // block * type_bytes


def _error(original: np.ndarray, restored: np.ndarray) -> dict:
    diff = (restored - original).astype(np.float64)
    norm = float(np.sqrt(np.mean(np.square(original, dtype=np.float64))))
    rms = float(np.sqrt(np.mean(np.square(diff))))
    return {"rel_rms": rms / norm if norm else rms, "max_abs": float(np.abs(diff).max(initial=0.0))}


def _report_row(name: str, t: StoredTensor, dtype: str, data: np.ndarray, report: bool) -> dict:
    row = {"name": name, "type": GGML_TYPES[dtype].name, "shape": list(t.shape), "bytes": int(data.nbytes),
           "rel_rms": None, "max_abs": None}
    if report:
        row.update(_error(t.numpy(), decode(data, dtype, tuple(t.shape))))
    return row


def _stream(path: Path, w: GGUFWriter, items, types, report: bool, progress) -> list[dict]:
    """Header, metadata and tensor infos, then each tensor converted and written in turn (one in memory)."""
    for out_name, name, t in items:
        shape = tuple(t.shape)
        w.add_tensor_info(out_name, shape, np.dtype(np.float32), _nbytes(shape, types[name]),
                          raw_dtype=GGML_TYPES[types[name]])
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rows = []
    for k, (out_name, name, t) in enumerate(items, 1):
        data = encode(t, types[name], name)
        w.write_tensor_data(data)
        rows.append(dict(_report_row(name, t, types[name], data, report), name=out_name))
        if progress is not None:  # one line rewritten in place on a terminal, a line per tensor in a log
            line = f"[{k}/{len(items)}] {types[name]:>4} {out_name}"
            live = progress.isatty()
            print(f"\r{line}\033[K" if live else line, end="" if live else "\n", file=progress, flush=True)
    if progress is not None and progress.isatty():
        print(file=progress)
    return rows


def _write_atomically(path: Path, arch: str, add_metadata, items, types, report: bool,
                      progress) -> list[dict]:
    """Write beside `path` and rename at the end, so a failed conversion leaves no partial file behind."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    w = GGUFWriter(partial, arch)
    try:
        add_metadata(w)
        rows = _stream(partial, w, items, types, report, progress)
        w.close()
        os.replace(partial, path)
    finally:
        w.close()
        partial.unlink(missing_ok=True)
    return rows


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
          progress=sys.stderr) -> list[dict]:
    """A nanoasr GGUF of `checkpoint` in `target`; returns one report row per tensor (type, bytes, error)."""
    validate(checkpoint.tensors, checkpoint.config, "checkpoint to convert")
    if "tokenizer.json" not in checkpoint.files:
        raise ModelError("checkpoint to convert has no tokenizer.json; a GGUF must carry its tokenizer")
    types = storage_types(checkpoint, target)
    items = [(name, name, t) for name, t in checkpoint.tensors.items()]

    def add_metadata(w: GGUFWriter) -> None:
        _add_general(w, checkpoint, target)
        _add_nanoasr_keys(w, checkpoint)
        _add_vocab(w, checkpoint.files, checkpoint.config.text.vocab_size, "checkpoint to convert")

    return _write_atomically(Path(path), ARCH, add_metadata, items, types, report, progress)


# --- reader ---------------------------------------------------------------------------------------------

DENSE_NUMPY = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


def _stored(mapped: np.memmap, info: TensorInfo, where: str) -> StoredTensor:
    """One tensor as a view of the file's read-only memory map, in its stored type and logical shape."""
    dtype = STORED_TYPES.get(info.ggml_type)
    if dtype is None:
        raise ModelError(f"{where}: tensor {info.name}: type {info.ggml_type.name} is not supported "
                         f"(expected one of {', '.join(t.name for t in STORED_TYPES)})")
    raw = mapped[info.start:info.start + info.nbytes]
    if dtype in DENSE_NUMPY:
        return StoredTensor(raw.view(DENSE_NUMPY[dtype]).reshape(info.shape), dtype, info.shape)
    if len(info.shape) != 2:
        raise ModelError(f"{where}: tensor {info.name}: {dtype} is only read for matrices, "
                         f"found shape {list(info.shape)}")
    return StoredTensor(raw.reshape(info.shape[0], -1), dtype, info.shape)


def _config_from_keys(values: dict, where: str) -> Config:
    raw, missing = {}, []
    for section, cls in SECTIONS:
        keys = {f.name: f"{ARCH}.{section}.{f.name}" for f in dataclasses.fields(cls)}
        missing += [key for key in keys.values() if key not in values]
        raw[f"{section}_config"] = {field: values[key] for field, key in keys.items() if key in values}
    if f"{ARCH}.audio_token_id" not in values:
        missing.append(f"{ARCH}.audio_token_id")
    if missing:
        raise ModelError(f"{where}: {len(missing)} metadata key(s) missing: {', '.join(missing)}")
    raw["audio_token_id"] = values[f"{ARCH}.audio_token_id"]
    return config_mod.from_dict(raw, where)


def _embedded_files(values: dict) -> dict[str, str]:
    """nanoasr's file keys, else any string value that is a config.json or tokenizer.json (other layouts)."""
    files = {name: values[key] for name, key in FILE_KEYS.items() if isinstance(values.get(key), str)}
    for value in values.values():
        if not isinstance(value, str) or not value.startswith("{"):
            continue
        try:
            parsed = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(parsed, dict) and "text_config" in parsed:
            files.setdefault("config.json", value)
        elif isinstance(parsed, dict) and "model" in parsed and "added_tokens" in parsed:
            files.setdefault("tokenizer.json", value)
    if isinstance(values.get(Keys.Tokenizer.CHAT_TEMPLATE), str):
        files.setdefault("chat_template.jinja", values[Keys.Tokenizer.CHAT_TEMPLATE])
    return files


def _tokenizer(values: dict, files: dict[str, str], where: str) -> dict[str, str]:
    if "tokenizer.json" in files:
        return files
    keys = (Keys.Tokenizer.LIST, Keys.Tokenizer.TOKEN_TYPE, Keys.Tokenizer.MERGES)
    if any(values.get(k) is None for k in keys):
        raise ModelError(f"{where}: no tokenizer: neither an embedded tokenizer.json nor the "
                         f"tokenizer.ggml.tokens/token_type/merges arrays")
    tokens, types, merges = (values[k] for k in keys)
    for key, array, kind in zip(keys, (tokens, types, merges), (str, int, str)):
        if not isinstance(array, list) or not all(isinstance(item, kind) for item in array):
            raise ModelError(f"{where}: {key} must be an array of {kind.__name__}, "
                             f"found {type(array).__name__}")
    if len(types) != len(tokens):
        raise ModelError(f"{where}: {Keys.Tokenizer.TOKEN_TYPE} has {len(types)} entries, expected one per "
                         f"token ({len(tokens)})")
    try:
        return dict(files, **{"tokenizer.json": tokenizer_from_vocab(tokens, types, merges)})
    except Exception as exc:  # the tokenizers library raises bare Exceptions for inputs it refuses
        raise ModelError(f"{where}: the tokenizer.ggml.* arrays do not make a BPE tokenizer "
                         f"({exc})") from None


def _layer_count(tensors: dict, prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    indices = [int(m.group(1)) for m in map(pattern.match, tensors) if m]
    return max(indices) + 1 if indices else 0


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
    n_audio = _layer_count(tensors, audio)
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
                    "num_hidden_layers": _layer_count(tensors, "model.multi_modal_projector.layers.")},
        "text": {"vocab_size": dims(f"{text}embed_tokens.weight", 2)[0],
                 "hidden_size": dims(f"{text}embed_tokens.weight", 2)[1],
                 "intermediate_size": dims(f"{text}layers.0.mlp.gate_proj.weight", 2)[0],
                 "num_hidden_layers": _layer_count(tensors, f"{text}layers."), "head_dim": head_dim,
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


def _source(values: dict, path: Path) -> dict:
    return {"path": str(path), "format": "gguf",
            "repo": values.get(f"{ARCH}.source.repo"), "revision": values.get(f"{ARCH}.source.revision"),
            "license": values.get(Keys.General.LICENSE), "license_url": values.get(Keys.General.LICENSE_LINK),
            "file_type": values.get(Keys.General.FILE_TYPE)}


def _third_party_config(values: dict, files: dict, tensors: dict, where: str) -> Config:
    if "config.json" in files:
        embedded = f"{where} (embedded config.json)"
        try:
            raw = json.loads(files["config.json"])
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ModelError(f"{embedded}: not valid JSON ({type(exc).__name__}: {exc})") from None
        return config_mod.from_dict(raw, embedded)
    config, assumed = config_from_shapes(tensors, values.get(Keys.Tokenizer.LIST), where)
    warnings.warn(f"{where}: no nanoasr metadata ({SCHEMA_KEY}); config derived from tensor shapes, "
                  f"assumed {len(assumed)} field(s): {', '.join(assumed)}", stacklevel=3)
    return config


def read(path: str | Path) -> Checkpoint:
    """A GGUF file -> validated Checkpoint; tensor data are views of one read-only memory map."""
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise ModelError(f"{where}: no such GGUF file")
    header = read_header(path)
    values = header.values
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = {info.name: _stored(mapped, info, where) for info in header.tensors}
    files = _tokenizer(values, _embedded_files(values), where)
    if SCHEMA_KEY in values:
        if values[SCHEMA_KEY] != SCHEMA_VERSION:
            raise ModelError(f"{where}: {SCHEMA_KEY} {values[SCHEMA_KEY]} is not supported "
                             f"(this nanoasr reads {SCHEMA_VERSION})")
        config = _config_from_keys(values, where)
    else:
        config = _third_party_config(values, files, tensors, where)
    validate(tensors, config, where)
    return Checkpoint(config, tensors, files, _source(values, path))


# --- stock llama.cpp qwen3 export of the decoder ---------------------------------------------------------

QWEN3_LAYER_NAMES = {  # logical suffix in model.language_model.layers.{i} -> llama.cpp blk.{i} suffix
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def qwen3_names(config: Config) -> dict[str, str]:
    """Logical decoder name -> llama.cpp qwen3 name (the LM head is tied: token_embd serves as output)."""
    names = {"model.language_model.embed_tokens.weight": "token_embd.weight",
             "model.language_model.norm.weight": "output_norm.weight"}
    for i in range(config.text.num_hidden_layers):
        for logical, ours in QWEN3_LAYER_NAMES.items():
            names[f"model.language_model.layers.{i}.{logical}"] = f"blk.{i}.{ours}"
    return names


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
                progress=sys.stderr) -> list[dict]:
    """The decoder alone as a stock llama.cpp `qwen3` GGUF (to benchmark llama.cpp on the same weights)."""
    validate(checkpoint.tensors, checkpoint.config, "checkpoint to export")
    types = storage_types(checkpoint, target)
    names = qwen3_names(checkpoint.config)
    items = [(ours, logical, checkpoint.tensors[logical]) for logical, ours in names.items()]

    def add_metadata(w: GGUFWriter) -> None:
        _add_general(w, checkpoint, target)
        _add_qwen3_hparams(w, checkpoint.config.text)
        _add_vocab(w, checkpoint.files, checkpoint.config.text.vocab_size, "checkpoint to export")

    return _write_atomically(Path(path), "qwen3", add_metadata, items, types, report, progress)
