"""GGUF reading: a bounded, memory-mapped header reader, and the tensors as StoredTensor views of the file.

Returns the raw metadata and tensors; what they mean for the model is nanoasr.checkpoints.gguf_schema's
business.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUFValueType, GGMLQuantizationType, Keys

from nanoasr.errors import ModelError
from nanoasr.formats import bounds
from nanoasr.formats.mapping import map_read_only
from nanoasr.storage import DENSE_NUMPY
from nanoasr.tensor import StoredTensor

# the storage types nanoasr reads and writes -> their GGML types
GGML_TYPES = {"f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16,
              "bf16": GGMLQuantizationType.BF16, "q8_0": GGMLQuantizationType.Q8_0,
              "q4_k": GGMLQuantizationType.Q4_K, "q6_k": GGMLQuantizationType.Q6_K}
STORED_TYPES = {ggml: stored for stored, ggml in GGML_TYPES.items()}

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


class NumericArray:
    """A numeric metadata array as a read-only view of the file's memory map. Python numbers take about ten
    times the bytes of the file's, so the array is converted (`tolist`) only by the reader of a key that uses
    it. Equal to a list of the same numbers; never equal to a scalar."""

    __slots__ = ("array",)
    __hash__ = None

    def __init__(self, array: np.ndarray):
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def tolist(self) -> list:
        return self.array.tolist()

    def __eq__(self, other):
        if isinstance(other, NumericArray):
            other = other.tolist()
        return self.tolist() == other if isinstance(other, list) else NotImplemented

    def __repr__(self) -> str:
        return f"<array of {len(self.array)} {self.array.dtype}>"


@dataclass(frozen=True)
class Header:
    version: int
    values: dict  # key -> str | int | float | bool | list of str | NumericArray
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
        # the lengths walked first, then the run of strings copied once and cut: no memoryview per string,
        # whose 450,000 for a vocabulary kept the garbage collector busy (read_header of a Q8_0 GGUF in a
        # fresh process: 0.41-0.43 s with them, 0.22 s without)
        buf, first, size, unpack = self.buf, self.offset, self.size, _U64.unpack_from
        starts, offset = [], first
        try:
            for _ in range(count):  # not a list of `count` made first: the count may be a corrupt file's
                starts.append(offset + 8)
                offset += 8 + unpack(buf, offset)[0]
        except (struct.error, OverflowError):  # a length field past the end of the file, or past 2^63
            offset = size + 1
        if offset > size:
            raise ModelError(f"{self.where}: {what}: {count} strings run past the end of the "
                             f"{size}-byte file (truncated or corrupt)")
        self.offset = offset
        run, ends = bytes(buf[first:offset]), starts[1:] + [offset + 8]
        try:
            return [run[a - first:b - 8 - first].decode() for a, b in zip(starts, ends)]
        except UnicodeDecodeError:  # _text says which array
            return [self._text(run[a - first:b - 8 - first], what) for a, b in zip(starts, ends)]

    def _text(self, raw, what: str) -> str:
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise ModelError(f"{self.where}: {what} is not UTF-8 ({exc})") from None


def _value_type(raw: int, what: str, where: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise ModelError(f"{where}: {what} has unknown value type {raw}") from None


def _array(cur: _Cursor, key: str) -> list | NumericArray:
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
    values = NumericArray(np.frombuffer(cur.buf, SCALARS[item], count=n, offset=cur.offset))
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
    """Keys and tensor infos of a GGUF file, every count and extent checked against the file size; numeric
    arrays are views of the file's memory map until a key is used."""
    mapped = _map(path)
    return _walk(memoryview(mapped), mapped.shape[0], str(path))


def _map(path: Path) -> np.memmap:
    bounds.regular_file(path, "GGUF file")
    if path.stat().st_size < 4:  # numpy cannot map an empty file
        raise ModelError(f"{path}: truncated: {path.stat().st_size} bytes, not a GGUF file")
    return map_read_only(path)


# --- tensors as stored ----------------------------------------------------------------------------------

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


def read(path: str | Path) -> tuple[dict, dict[str, StoredTensor]]:
    """A GGUF file -> (metadata values, tensors); tensor data are views of one read-only memory map."""
    path = Path(path)
    header = read_header(path)
    mapped = map_read_only(path)
    return header.values, {info.name: _stored(mapped, info, str(path)) for info in header.tensors}
