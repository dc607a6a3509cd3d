"""One LLVM vector decoder per storage type: a block of stored weights as float vectors, exactly. The dense
types (f32, f16, bf16) are read as blocks of 32; the block-quantized ones are in quant_blocks.py.

A decoder (builder, pointer to the block's first byte) returns (groups, mins). groups: (s, [(q, off), ...]),
16-lane float vectors q of the values at element offset `off` of the block that share the 16-lane scale s
(None for the dense types); a value is q * s. mins: None, or 8 floats (Q4_K's dmin * m_j) each subtracted
from the 32 values j of the block. Groups may come as a generator, so that the caller interleaves decoding
with its use of the values.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from llvmlite import ir

from nanoasr.kernels.ir.quant_blocks import q4_k, q6_k, q8_0
from nanoasr.kernels.ir.vector import F32, I16, I32, V16, load_vector
from nanoasr.storage import BLOCK_TYPES


def _dense(load, itemsize):
    """A dense block of 32 values (`itemsize` bytes each) as one unscaled group; load(builder, blk, byte
    offset) gives 16 of them as floats."""
    def decode(builder, blk):
        return [(None, [(load(builder, blk, 0), 0), (load(builder, blk, 16 * itemsize), 16)])], None
    return decode


def _f32x16(builder, blk, off):
    return load_vector(builder, blk, off, F32, 16)


def _f16x16(builder, blk, off):
    return builder.fpext(load_vector(builder, blk, off, ir.HalfType(), 16), V16)


def _bf16x16(builder, blk, off):
    """bf16 bits are the top half of a float32."""
    i32x16 = ir.VectorType(I32, 16)
    wide = builder.zext(load_vector(builder, blk, off, I16, 16), i32x16)
    return builder.bitcast(builder.shl(wide, ir.Constant(i32x16, [16] * 16)), V16)


class Block(NamedTuple):
    decode: Callable
    nbytes: int  # stored bytes per block
    size: int  # values per block
    unroll: int  # blocks per iteration of the product's block loop
    has_mins: bool


def _quantized(decode: Callable, dtype: str, unroll: int, has_mins: bool) -> Block:
    size, nbytes = BLOCK_TYPES[dtype]
    return Block(decode, nbytes, size, unroll, has_mins)


BLOCKS = {
    "q8_0": _quantized(q8_0, "q8_0", 4, False), "q4_k": _quantized(q4_k, "q4_k", 1, True),
    "q6_k": _quantized(q6_k, "q6_k", 1, False), "f32": Block(_dense(_f32x16, 4), 128, 32, 2, False),
    "f16": Block(_dense(_f16x16, 2), 64, 32, 2, False), "bf16": Block(_dense(_bf16x16, 2), 64, 32, 2, False)}
