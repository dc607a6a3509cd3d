"""Dequantizers for GGUF block types in plain vectorised numpy: the reference twin of the CPU/CUDA kernels.

Each function reads all blocks at once; the arithmetic follows ggml's dequantize_row_* operation by
operation in float32, so the result is bit-identical to ggml and to the gguf package.
"""
from __future__ import annotations

import numpy as np

from nanoasr.storage import BLOCK_TYPES, bf16_to_f32


def dequantize(data: np.ndarray, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """data (uint8 blocks [rows, row_bytes], or dense f32/f16/bf16-bits) -> float32 of logical `shape`."""
    shape = tuple(int(n) for n in shape)
    if dtype == "f32":
        return np.asarray(data, dtype=np.float32).reshape(shape)
    if dtype == "f16":
        return np.asarray(data).astype(np.float32).reshape(shape)
    if dtype == "bf16":
        return bf16_to_f32(np.asarray(data)).reshape(shape)
    if dtype not in BLOCK_TYPES:
        raise ValueError(f"cannot dequantize type {dtype!r} (expected f32, f16, bf16 or one of "
                         f"{', '.join(BLOCK_TYPES)})")
    block, block_bytes = BLOCK_TYPES[dtype]
    count = int(np.prod(shape, dtype=np.int64))
    if shape[-1] % block or np.asarray(data).size != count // block * block_bytes:
        raise ValueError(f"{dtype} data of {np.asarray(data).size} bytes does not hold shape {list(shape)} "
                         f"(expected rows of whole {block}-element blocks, {block_bytes} bytes each)")
    blocks = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, block_bytes)
    return _DEQUANTIZERS[dtype](blocks).reshape(shape)


def f16_field(blocks: np.ndarray, start: int) -> np.ndarray:
    """The little-endian float16 at byte `start` of each block, as float32 [n_blocks, 1]."""
    bits = blocks[:, start].astype(np.uint16) | (blocks[:, start + 1].astype(np.uint16) << 8)
    return bits.view(np.float16).astype(np.float32)[:, None]


def q8_0(blocks: np.ndarray) -> np.ndarray:
    """[n, 34] -> [n, 32]: f16 scale d, then 32 int8 quants; x = q * d."""
    return blocks[:, 2:].view(np.int8).astype(np.float32) * f16_field(blocks, 0)


def q4_k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[n, 12] -> (scales, mins) [n, 8] of 6 bits each.

    Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; scales/mins 4-7 keep their low
    4 bits in the nibbles of bytes 8-11 and their top 2 bits in the spare top bits of bytes 0-3 / 4-7.
    """
    low, mid, high = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([low & 63, (high & 15) | ((low >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 63, (high >> 4) | ((mid >> 6) << 4)], axis=1)
    return scales, mins


def q4_k(blocks: np.ndarray) -> np.ndarray:
    """[n, 144] -> [n, 256]: f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of 4-bit quants.

    Eight sub-blocks of 32: x = (d * scale_j) * q - (dmin * min_j). Quant bytes come in four groups of
    32; a group's low nibbles are sub-block 2g, its high nibbles sub-block 2g + 1.
    """
    n = len(blocks)
    scales, mins = q4_k_scales(blocks[:, 4:16])
    d = f16_field(blocks, 0) * scales.astype(np.float32)
    m = f16_field(blocks, 2) * mins.astype(np.float32)
    qs = blocks[:, 16:].reshape(n, 4, 1, 32)
    q = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)
    return (d[:, :, None] * q - m[:, :, None]).reshape(n, 256)


def q6_k(blocks: np.ndarray) -> np.ndarray:
    """[n, 210] -> [n, 256]: 128 bytes low nibbles, 64 bytes 2-bit highs, 16 int8 scales, f16 d.

    Two halves of 128 elements, each with 64 low-nibble bytes (element e < 64 in the low nibble of
    byte e, element 64 + e in its high nibble) and 32 high-bit bytes (element 32k + l in bits 2k, 2k+1
    of byte l). Sixteen sub-blocks of 16: x = (d * scale_j) * (q - 32).
    """
    n = len(blocks)
    ql = blocks[:, :128].reshape(n, 2, 1, 64)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    low = np.concatenate([ql & 15, ql >> 4], axis=2).reshape(n, 2, 128)
    high = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=2).reshape(n, 2, 128)
    q = ((low | (high << 4)).astype(np.int8) - np.int8(32)).reshape(n, 16, 16).astype(np.float32)
    d = f16_field(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32)
    return (d[:, :, None] * q).reshape(n, 256)


_DEQUANTIZERS = {"q8_0": q8_0, "q4_k": q4_k, "q6_k": q6_k}
