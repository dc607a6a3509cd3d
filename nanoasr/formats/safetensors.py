"""Memory-mapped safetensors reader that keeps BF16 (numpy has no bfloat16: its bits are read as uint16).

Format: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then data.
"""
from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import numpy as np

from nanoasr.errors import ModelError
from nanoasr.formats import bounds
from nanoasr.formats.mapping import map_read_only
from nanoasr.storage import DENSE_NUMPY
from nanoasr.tensor import StoredTensor
from nanoasr.untrusted import ReadRefused, open_regular

DTYPES = {name: (DENSE_NUMPY[name.lower()], name.lower()) for name in ("F32", "F16", "BF16")}
MAX_HEADER_BYTES = 100 << 20


def read_header(path: Path) -> tuple[dict, int]:
    """(header dict, offset of the data section)."""
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise ModelError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, MAX_HEADER_BYTES):
                raise ModelError(f"{path}: safetensors header claims {n} bytes but the file has {size}")
            raw = f.read(n)
    except (OSError, ReadRefused) as exc:  # a directory, a FIFO, no permission
        raise ModelError(f"{path}: cannot be read as a safetensors file ({exc})") from None
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, a 5,000-digit number
        raise ModelError(f"{path}: safetensors header is not valid JSON "
                         f"({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict):
        raise ModelError(f"{path}: safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    return header, 8 + n


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(path: Path, name: str, info) -> tuple[str, tuple[int, ...], int, int]:
    """(dtype, shape, begin, end) of one header entry, each checked for its kind before it is used."""
    where = f"{path}: tensor {name}"
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise ModelError(f"{where}: expected an object with dtype, shape and data_offsets, found {info!r}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ModelError(f"{where}: dtype {dtype} is not supported (expected F32, F16 or BF16)")
    if not isinstance(shape, list) or not all(map(_is_count, shape)):
        raise ModelError(f"{where}: shape must be a list of non-negative integers, found {shape!r}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_count, offsets)):
        raise ModelError(f"{where}: data_offsets must be two non-negative integers, found {offsets!r}")
    return dtype, tuple(shape), offsets[0], offsets[1]


def read(path: str | Path) -> dict[str, StoredTensor]:
    """All tensors of one .safetensors file as StoredTensors over one read-only memory map."""
    path = Path(path)
    header, start = read_header(path)
    data_bytes = path.stat().st_size - start
    mapped = map_read_only(path, start, data_bytes) if data_bytes else None
    tensors = {}
    for name, info in header.items():
        dtype_name, shape, begin, end = _entry(path, name, info)
        np_dtype, stored = DTYPES[dtype_name]
        bounds.count(len(shape), bounds.MAX_RANK, f"tensor {name}: the number of dimensions", str(path))
        expected = math.prod(shape) * np.dtype(np_dtype).itemsize  # Python ints: no int64 wrap-around
        if not (begin <= end <= data_bytes) or end - begin != expected:
            raise ModelError(
                f"{path}: tensor {name}: data [{begin}, {end}) does not fit shape {list(shape)} {dtype_name} "
                f"({expected} bytes) inside the {data_bytes}-byte data section (file truncated?)"
            )
        if not expected:  # a zero-size tensor: any other dimension fits, so each is bounded before numpy
            bounds.dims(shape, bounds.MAX_RANK, start + data_bytes, f"tensor {name} shape", str(path))
        data = mapped[begin:end].view(np_dtype).reshape(shape) if expected else np.zeros(shape, np_dtype)
        tensors[name] = StoredTensor(data, stored, shape)
    return tensors


def _weight_map(index: Path) -> dict[str, str]:
    try:
        with open_regular(index) as f:
            parsed = json.loads(f.read(MAX_HEADER_BYTES + 1))  # a longer file is cut short: invalid JSON
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelError(f"{index}: not a valid safetensors index ({type(exc).__name__}: {exc})") from None
    if not isinstance(parsed, dict):
        raise ModelError(f"{index}: expected a JSON object with a weight_map, found {type(parsed).__name__}")
    weight_map = parsed.get("weight_map")
    if not isinstance(weight_map, dict):
        raise ModelError(f"{index}: weight_map must be an object of tensor name -> shard file name, "
                         f"found {type(weight_map).__name__}")
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise ModelError(f"{index}: weight_map[{name!r}] must be a shard file name, found {shard!r}")
    return weight_map


def _allowed_roots(directory: Path) -> list[Path]:
    inside = directory.resolve()
    if inside.parent.name == "snapshots":  # a huggingface_hub cache snapshot links its files to ../../blobs
        return [inside, inside.parent.parent / "blobs"]
    return [inside]


def _shard_path(directory: Path, index: Path, shard: str) -> Path:
    """The shard's path, refused before it is opened when it, or a symlink on the way, leads outside the
    checkpoint directory."""
    try:
        resolved = (directory / shard).resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise ModelError(f"{index}: shard {shard!r} cannot be resolved ({exc})") from None
    lexical = Path(shard)
    if (lexical.is_absolute() or ".." in lexical.parts
            or not any(resolved.is_relative_to(root) for root in _allowed_roots(directory))):
        raise ModelError(f"{index}: shard {shard!r} lies outside the checkpoint directory "
                         f"{directory.resolve()} (resolves to {resolved})")
    if not resolved.is_file():
        raise ModelError(f"{index}: shard {shard!r} is missing")
    return resolved


def read_checkpoint_dir(directory: Path) -> dict[str, StoredTensor]:
    """model.safetensors, or the shards listed in model.safetensors.index.json."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        weight_map = _weight_map(index)
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(read(_shard_path(directory, index, shard)))
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise ModelError(f"{index}: {len(missing)} tensors listed but absent from the shards, "
                             f"e.g. {missing[0]}")
        return tensors
    single = directory / "model.safetensors"
    if not single.exists():
        raise ModelError(f"{directory}: no model.safetensors or model.safetensors.index.json")
    return read(single)
