"""Memory-mapped safetensors reader that keeps BF16 (numpy has no bfloat16: its bits are read as uint16).

Format: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then data.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from nanoasr.errors import ModelError
from nanoasr.tensor import StoredTensor

DTYPES = {"F32": (np.float32, "f32"), "F16": (np.float16, "f16"), "BF16": (np.uint16, "bf16")}
MAX_HEADER_BYTES = 100 << 20


def read_header(path: Path) -> tuple[dict, int]:
    """(header dict, offset of the data section)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelError(f"{path}: truncated safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, MAX_HEADER_BYTES):
            raise ModelError(f"{path}: safetensors header claims {n} bytes but the file has {size}")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ModelError(f"{path}: safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    return header, 8 + n


def read(path: str | Path) -> dict[str, StoredTensor]:
    """All tensors of one .safetensors file as StoredTensors over one read-only memory map."""
    path = Path(path)
    header, start = read_header(path)
    size = path.stat().st_size
    data_bytes = size - start
    mapped = (np.memmap(path, dtype=np.uint8, mode="r", offset=start, shape=(data_bytes,))
              if data_bytes else None)
    tensors = {}
    for name, info in header.items():
        try:
            dtype_name, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{path}: tensor {name}: malformed header entry {info!r}") from None
        if dtype_name not in DTYPES:
            raise ModelError(f"{path}: tensor {name}: dtype {dtype_name} is not supported "
                             "(expected F32, F16 or BF16)")
        np_dtype, stored = DTYPES[dtype_name]
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(np_dtype).itemsize
        if not (0 <= begin <= end <= data_bytes) or end - begin != expected:
            raise ModelError(
                f"{path}: tensor {name}: data [{begin}, {end}) does not fit shape {list(shape)} {dtype_name} "
                f"({expected} bytes) inside the {data_bytes}-byte data section (file truncated?)"
            )
        data = mapped[begin:end].view(np_dtype).reshape(shape) if expected else np.zeros(shape, np_dtype)
        tensors[name] = StoredTensor(data, stored, shape)
    return tensors


def read_checkpoint_dir(directory: Path) -> dict[str, StoredTensor]:
    """model.safetensors, or the shards listed in model.safetensors.index.json."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelError(f"{index}: not a valid safetensors index ({exc})") from None
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = directory / shard
            if not shard_path.exists():
                raise ModelError(f"{index}: shard {shard} is missing")
            tensors.update(read(shard_path))
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise ModelError(f"{index}: {len(missing)} tensors listed but absent from the shards, "
                             f"e.g. {missing[0]}")
        return tensors
    single = directory / "model.safetensors"
    if not single.exists():
        raise ModelError(f"{directory}: no model.safetensors or model.safetensors.index.json")
    return read(single)
