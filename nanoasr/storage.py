"""Storage types: the dense float types and GGUF's block layouts, and BF16's bits.

Below tensor.py and quant/, which both read it.
"""
from __future__ import annotations

import numpy as np

# Storage types and, for block-quantized ones, (elements per block, bytes per block) as in GGUF.
BLOCK_TYPES = {"q8_0": (32, 34), "q4_k": (256, 144), "q6_k": (256, 210)}
DENSE_TYPES = ("f32", "f16", "bf16")
DENSE_NUMPY = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}  # BF16 is held as its 16 bits
STORED_NUMPY = dict(DENSE_NUMPY, **{t: np.uint8 for t in BLOCK_TYPES})  # the dtype of each type's data


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """BF16 is the top half of an IEEE float32: shift the 16 bits into place."""
    return (bits.astype(np.uint32) << 16).view(np.float32)
