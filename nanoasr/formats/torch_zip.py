"""torch.save archives (FunASR's model.pt) read without torch and without running pickle code.

Format (torch >= 1.6): a zip whose members sit under one folder: `<dir>/data.pkl` (the pickled object),
`<dir>/data/<key>` (one member per storage, STORED uncompressed and aligned to 64 bytes), `<dir>/byteorder`
and `<dir>/version`. In data.pkl a tensor is `torch._utils._rebuild_tensor_v2(storage, offset, size,
stride, ...)` and a storage is a persistent id `('storage', torch.<Type>Storage, key, location, numel)`.

The unpickler resolves only the globals a plain state dict needs, each to a local stand-in, so no torch
code runs and anything else in the pickle is refused before it could run. Tensor data are views of one
read-only memory map of the archive.
"""
from __future__ import annotations

import collections
import io
import math
import pickle
import pickletools
import struct
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from nanoasr.errors import ModelError
from nanoasr.formats import bounds
from nanoasr.formats.mapping import map_read_only
from nanoasr.tensor import StoredTensor
from nanoasr.untrusted import short

# torch's storage classes -> (numpy dtype of the bytes, StoredTensor type; None for integer/bool buffers).
STORAGE_TYPES = {
    "FloatStorage": (np.float32, "f32"), "HalfStorage": (np.float16, "f16"),
    "BFloat16Storage": (np.uint16, "bf16"),  # numpy has no bfloat16: its bits are read as uint16
    "LongStorage": (np.int64, None), "IntStorage": (np.int32, None), "ShortStorage": (np.int16, None),
    "CharStorage": (np.int8, None), "ByteStorage": (np.uint8, None), "BoolStorage": (np.bool_, None),
}
MAX_PICKLE_BYTES = 16 << 20  # ~130 bytes a tensor (name, shape): FunASR's 1,347 tensors need ~0.2 MB
CONTAINERS = ("state_dict", "model_state_dict", "model")  # unwrapped in this order, as FunASR does
LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then name and extra-field lengths at byte 26
MAX_DEPTH = 64  # a state dict nests a few levels (containers, a tensor, its shape); CPython's hash of a
#                 tuple nested 300,000 deep overflows the C stack
MAX_BYTEORDER_BYTES = 16  # b"little" or b"big"
# what zipfile raises on a damaged archive or member (zlib.error: a corrupt deflated stream)
ZIP_ERRORS = (zipfile.BadZipFile, OSError, EOFError, RuntimeError, NotImplementedError, ValueError,
              OverflowError, struct.error, zlib.error)
# opcodes that add to the container beneath their arguments instead of making a new object
_ADDS_TO_CONTAINER = {"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"}
_MEMO_WRITES = {"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"}
_MEMO_READS = {"GET", "BINGET", "LONG_BINGET"}


class StorageKind(NamedTuple):
    name: str


class StorageRef(NamedTuple):
    kind: StorageKind
    key: str
    numel: int


class TensorRef(NamedTuple):
    storage: StorageRef
    offset: int
    shape: tuple
    stride: tuple


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                       metadata=None):
    return TensorRef(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None):
    return data  # a Parameter is its tensor here


ALLOWED = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
}


class _StateDictUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, where: str):
        super().__init__(io.BytesIO(data))
        self.where = where

    def find_class(self, module, name):
        if (module, name) in ALLOWED:
            return ALLOWED[module, name]
        if module == "torch" and name in STORAGE_TYPES:
            return StorageKind(name)
        if module == "torch" and name.endswith("Storage"):
            raise ModelError(f"{self.where}: storage type torch.{name} is not supported (expected one of "
                             f"{', '.join('torch.' + s for s in STORAGE_TYPES)})")
        raise ModelError(f"{self.where}: data.pkl calls {module}.{name}, which a plain state dict never "
                         f"needs; refused before running it (only tensors, parameters and OrderedDict "
                         f"are read)")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], StorageKind) and isinstance(pid[2], str) and _is_count(pid[4])):
            raise ModelError(f"{self.where}: data.pkl has a persistent id {short(pid)}; expected "
                             f"('storage', torch.<Type>Storage, key, location, numel)")
        return StorageRef(pid[1], pid[2], pid[4])


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _open_zip(path: Path) -> zipfile.ZipFile:
    bounds.regular_file(path, "torch.save archive")
    try:
        return zipfile.ZipFile(path)
    except ZIP_ERRORS as exc:
        raise ModelError(f"{path}: not a readable zip archive ({exc}); expected a torch.save file "
                         f"(model.pt), perhaps truncated") from None


def _pickle_member(archive: zipfile.ZipFile, path: Path) -> zipfile.ZipInfo:
    """The one `<dir>/data.pkl` at the top of the archive."""
    found = [i for i in archive.infolist() if i.filename.count("/") == 1 and i.filename.endswith("/data.pkl")]
    if len(found) != 1:
        raise ModelError(f"{path}: expected one <dir>/data.pkl in the zip (a torch.save archive), "
                         f"found {len(found)}")
    return found[0]


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, path: Path) -> bytes:
    """A member's bytes, at most `limit` of them (its stated size is not trusted: a deflated member can
    expand past it); any damage to the archive is one ModelError."""
    if info.file_size > limit:
        raise ModelError(f"{path}: {info.filename} claims {info.file_size} bytes (expected at most {limit})")
    try:
        with archive.open(info) as f:
            data = f.read(limit + 1)
    except ZIP_ERRORS as exc:
        raise ModelError(f"{path}: {info.filename} cannot be read ({exc})") from None
    if len(data) > limit:
        raise ModelError(f"{path}: {info.filename} holds more than {limit} bytes")
    return data


class _Depths:
    """The unpickler's stack as the nesting depth of each value, marks kept apart (a scan for the last mark
    on every opcode would take quadratic time), and the memo's depths by index."""

    def __init__(self):
        self.stack, self.marks, self.memo = [], [], {}

    def pop(self, n: int) -> list:
        floor = self.marks[-1] if self.marks else 0
        if n > len(self.stack) - floor:
            raise ValueError("an opcode takes more values than the stack holds")
        popped = self.stack[len(self.stack) - n:]
        del self.stack[len(self.stack) - n:]
        return popped

    def pop_to_mark(self) -> list:
        if not self.marks:
            raise ValueError("an opcode takes a mark the stack does not hold")
        at = self.marks.pop()
        popped = self.stack[at:]
        del self.stack[at:]
        return popped

    def memo_step(self, name: str, arg) -> None:
        if name in _MEMO_READS:
            self.stack.append(self.memo.get(arg, 0))
            return
        key = len(self.memo) if name == "MEMOIZE" else arg
        if key > len(self.memo):  # picklers number the memo 0, 1, 2, ...: a larger index only sizes a table
            raise ValueError(f"memo index {short(key)} skips past the {len(self.memo)} entries "
                             f"written")
        self.memo[key] = self.stack[-1] if len(self.stack) > (self.marks[-1] if self.marks else 0) else 0

    def step(self, op, arg) -> None:
        """One opcode: a new object is one deeper than what it holds."""
        if op.name in _MEMO_WRITES or op.name in _MEMO_READS:
            self.memo_step(op.name, arg)
            return
        before = op.stack_before
        if pickletools.markobject in before:
            inside = self.pop_to_mark()
            below = self.pop(before.index(pickletools.markobject))
        else:
            inside, below = [], self.pop(len(before))
        if op.name == "DUP":
            depth = below[0]
        elif op.name in _ADDS_TO_CONTAINER:
            depth = max([below[0]] + [1 + d for d in below[1:] + inside])
        else:
            depth = 1 + max(below + inside, default=-1)
        if depth > MAX_DEPTH:
            raise ValueError(f"values nest more than {MAX_DEPTH} deep (a state dict nests a few levels)")
        for item in op.stack_after:
            if item is pickletools.markobject:
                self.marks.append(len(self.stack))
            else:
                self.stack.append(depth)


def _check_opcodes(data: bytes, path: Path) -> None:
    """Nesting depth and memo indices, read from the opcodes before anything is built: the C unpickler
    sizes its memo from the largest index it is given, and a tuple nested 300,000 deep crashes CPython
    when it is hashed as a key."""
    depths = _Depths()
    try:
        for op, arg, _ in pickletools.genops(data):
            depths.step(op, arg)
    except ValueError as exc:  # genops' own errors too: an unknown opcode, an argument past the end
        raise ModelError(f"{path}: data.pkl is refused ({exc})") from None


def _unpickle(data: bytes, path: Path):
    _check_opcodes(data, path)
    try:
        return _StateDictUnpickler(data, str(path)).load()
    except ModelError:
        raise
    except Exception as exc:  # a malformed pickle makes the unpickler raise almost any type
        raise ModelError(f"{path}: data.pkl is not a valid pickle ({type(exc).__name__}: {exc})") from None


def _byteorder(archive: zipfile.ZipFile, prefix: str, path: Path) -> None:
    if prefix + "byteorder" not in archive.namelist():
        return  # archives before torch 1.10 have no byteorder record; they are little-endian
    order = _read_member(archive, archive.getinfo(prefix + "byteorder"), MAX_BYTEORDER_BYTES, path)
    if order != b"little":
        raise ModelError(f"{path}: byteorder is {order[:16]!r}, expected b'little'")


def unwrap(obj, path: Path) -> dict:
    """The state dict inside FunASR's containers (`state_dict`, `model_state_dict`, `model`), with one
    `module.` prefix removed from its keys, as funasr/models/fun_asr_nano/checkpoint_utils.py does."""
    while isinstance(obj, dict):
        inner = next((obj[k] for k in CONTAINERS if isinstance(obj.get(k), dict)), None)
        if inner is None:
            break
        obj = inner
    if not isinstance(obj, dict):
        raise ModelError(f"{path}: data.pkl holds a {type(obj).__name__}, expected a dict of tensors")
    out = {}
    for key, value in obj.items():
        name = key[len("module."):] if isinstance(key, str) and key.startswith("module.") else key
        if not isinstance(name, str) or not isinstance(value, TensorRef):
            raise ModelError(f"{path}: state dict entry {short(key)} is a {type(value).__name__}, "
                             f"expected a tensor under a string name")
        if name in out:
            raise ModelError(f"{path}: state dict holds {name} twice (with and without 'module.')")
        out[name] = value
    return out


def _member_data(mapped: np.ndarray, archive: zipfile.ZipFile, name: str, path: Path) -> np.ndarray:
    """The bytes of one STORED member as a view of the memory map (offset from its local file header)."""
    try:
        info = archive.getinfo(name)
    except KeyError:
        raise ModelError(f"{path}: storage {name} is missing from the archive") from None
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1:
        raise ModelError(f"{path}: storage {name} is compressed or encrypted (method {info.compress_type}); "
                         f"expected it stored uncompressed, as torch.save writes it, so it can be "
                         f"memory-mapped")
    head = bytes(mapped[info.header_offset:info.header_offset + LOCAL_HEADER.size])
    if len(head) < LOCAL_HEADER.size or LOCAL_HEADER.unpack(head)[0] != b"PK\x03\x04":
        raise ModelError(f"{path}: storage {name}: no local zip header at byte {info.header_offset}")
    _, name_len, extra_len = LOCAL_HEADER.unpack(head)
    start = info.header_offset + LOCAL_HEADER.size + name_len + extra_len
    if start + info.file_size > mapped.shape[0]:
        raise ModelError(f"{path}: storage {name}: bytes [{start}, {start + info.file_size}) lie past the "
                         f"end of the {mapped.shape[0]}-byte file (truncated?)")
    return mapped[start:start + info.file_size]


def _c_strides(shape: tuple) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _check_ref(ref: TensorRef, name: str, path: Path, file_size: int) -> None:
    """The tensor's fields, each bounded by the file's size before a product of them is taken (a zero-size
    tensor could otherwise state any other dimension)."""
    if not (isinstance(ref.storage, StorageRef) and _is_count(ref.offset)
            and isinstance(ref.shape, tuple) and all(map(_is_count, ref.shape))
            and isinstance(ref.stride, tuple) and len(ref.stride) == len(ref.shape)
            and all(map(_is_count, ref.stride))):
        raise ModelError(f"{path}: tensor {name}: expected a storage, a non-negative offset and matching "
                         f"size and stride tuples, found {short(tuple(ref))}")
    bounds.count(len(ref.shape), bounds.MAX_RANK, f"tensor {name}: the number of dimensions", str(path))
    count = math.prod(ref.shape)
    extent = ref.offset + sum((n - 1) * s for n, s in zip(ref.shape, ref.stride)) + 1
    if count and extent > ref.storage.numel:
        raise ModelError(f"{path}: tensor {name}: data reach element {extent} but its storage "
                         f"{ref.storage.key} holds {ref.storage.numel}")
    if count > ref.storage.numel:  # zero strides repeat elements: a copy of such a view could be any size
        raise ModelError(f"{path}: tensor {name}: {count} elements from a storage of {ref.storage.numel}; "
                         f"expected a tensor that owns its elements")
    bounds.dims(ref.shape, bounds.MAX_RANK, file_size, f"tensor {name} shape", str(path))
    bounds.dims(ref.stride, bounds.MAX_RANK, file_size, f"tensor {name} strides", str(path))
    bounds.count(ref.offset, file_size, f"tensor {name} storage offset", str(path))


def _storage_array(ref: StorageRef, raw: np.ndarray, np_dtype, path: Path) -> np.ndarray:
    expected = ref.numel * np.dtype(np_dtype).itemsize
    if raw.shape[0] != expected:
        raise ModelError(f"{path}: storage {ref.key}: expected {expected} bytes ({ref.numel} x "
                         f"{ref.kind.name}), found {raw.shape[0]}")
    if raw.ctypes.data % np.dtype(np_dtype).itemsize:
        raw = raw.copy()  # a member some other zip tool left unaligned: numba kernels want aligned data
    return raw.view(np_dtype)


def _tensor(ref: TensorRef, elements: np.ndarray, stored: str) -> StoredTensor:
    count = math.prod(ref.shape)
    nonzero = tuple(s for n, s in zip(ref.shape, ref.stride) if n != 1)
    if nonzero == tuple(s for n, s in zip(ref.shape, _c_strides(ref.shape)) if n != 1):
        data = elements[ref.offset:ref.offset + count].reshape(ref.shape)
    else:  # a strided view torch saved as is: made contiguous (a copy)
        itemsize = elements.dtype.itemsize
        view = np.lib.stride_tricks.as_strided(elements[ref.offset:], ref.shape,
                                               tuple(s * itemsize for s in ref.stride), writeable=False)
        data = np.ascontiguousarray(view)
    return StoredTensor(data, stored, tuple(ref.shape))


def read(path: str | Path) -> dict[str, StoredTensor]:
    """Every float tensor of a torch.save state dict (FunASR containers unwrapped), by its own name.

    Integer and bool buffers (counters such as `num_batches_tracked`) are left out: no weight is an integer.
    """
    path = Path(path)
    archive = _open_zip(path)
    with archive:
        info = _pickle_member(archive, path)
        prefix = info.filename[:-len("data.pkl")]
        _byteorder(archive, prefix, path)
        refs = unwrap(_unpickle(_read_member(archive, info, MAX_PICKLE_BYTES, path), path), path)
        mapped = map_read_only(path)
        storages, tensors = {}, {}
        for name, ref in refs.items():
            _check_ref(ref, name, path, mapped.shape[0])
            np_dtype, stored = STORAGE_TYPES[ref.storage.kind.name]
            if stored is None:
                continue
            if ref.storage not in storages:  # shared by tied tensors: one view, checked once per claim
                raw = _member_data(mapped, archive, f"{prefix}data/{ref.storage.key}", path)
                storages[ref.storage] = _storage_array(ref.storage, raw, np_dtype, path)
            tensors[name] = _tensor(ref, storages[ref.storage], stored)
    return tensors
