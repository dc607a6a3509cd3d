"""StoredTensor: a weight kept in its stored type (memory-mapped where the file allows), widened on use."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nanoasr.quant.reference import dequantize
from nanoasr.storage import BLOCK_TYPES, bf16_to_f32


@dataclass(frozen=True, eq=False)
class StoredTensor:
    """A tensor of logical `shape` held as `data` in storage type `dtype`.

    dense f32/f16: data has the logical shape and that numpy dtype; bf16: uint16 bits of the logical shape;
    q8_0/q4_k/q6_k: uint8 blocks of shape [rows, row_bytes] (GGUF's layout, rows = shape[0]).
    activations: how a product treats the rows it meets ("exact": float32; "int8": quantized per 32-column
    block in few-row products; "bf16": rounded to bf16; see nanoasr.backend.ACTIVATIONS); the backend sets
    it when it places the weights.
    """

    data: np.ndarray
    dtype: str
    shape: tuple[int, ...]
    activations: str = "exact"

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def numpy(self) -> np.ndarray:
        """The tensor widened to float32 with its logical shape."""
        return widen(self)


def widen(t: StoredTensor) -> np.ndarray:
    if t.dtype == "f32":
        return np.ascontiguousarray(t.data, dtype=np.float32)
    if t.dtype == "f16":
        return t.data.astype(np.float32)
    if t.dtype == "bf16":
        return bf16_to_f32(t.data)
    return dequantize(t.data, t.dtype, t.shape)


# Byte offsets of the float16 scales in one block (Q4_K: d and dmin); a NaN/Inf scale spoils its whole block.
BLOCK_SCALES = {"q8_0": (0,), "q4_k": (0, 2), "q6_k": (208,)}
F16_EXPONENT, BF16_EXPONENT = 0x7C00, 0x7F80  # all exponent bits set: Inf or NaN
SCAN_CHUNK = 1 << 22  # elements read at a time, so a scan never holds a widened copy of a large matrix


def _exponent_full(bits: np.ndarray, mask: int) -> bool:
    return bool(((bits & mask) == mask).any())


def _any_in_chunks(flat: np.ndarray, test) -> bool:
    return any(test(flat[i:i + SCAN_CHUNK]) for i in range(0, flat.shape[0], SCAN_CHUNK))


def has_nonfinite(t: StoredTensor) -> bool:
    """Whether any stored value is NaN or Inf (for block types: any block scale, the only floats there)."""
    if t.dtype == "f32":
        return _any_in_chunks(np.ravel(t.data), lambda x: not np.isfinite(x).all())
    if t.dtype in ("f16", "bf16"):
        mask = F16_EXPONENT if t.dtype == "f16" else BF16_EXPONENT
        return _any_in_chunks(np.ravel(t.data).view(np.uint16), lambda bits: _exponent_full(bits, mask))
    blocks = np.reshape(t.data, (-1, BLOCK_TYPES[t.dtype][1]))
    for offset in BLOCK_SCALES[t.dtype]:
        scales = blocks[:, offset:offset + 2]  # little-endian float16 bytes, high byte holds the exponent
        if _any_in_chunks(scales, lambda pair: _exponent_full(pair[:, 1], F16_EXPONENT >> 8)):
            return True
    return False


def dense(array: np.ndarray) -> StoredTensor:
    """Wrap a float32/float16 array (tests, converted weights)."""
    dtype = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}[array.dtype]
    return StoredTensor(array, dtype, tuple(array.shape))


def take_rows(t: StoredTensor, ids) -> np.ndarray:
    """Rows `ids` of a [rows, cols] tensor, widened to float32 (embedding lookup)."""
    ids = np.asarray(ids)
    return widen(StoredTensor(t.data[ids], t.dtype, (len(ids), *t.shape[1:])))
