"""CUDA device decoders: element i of stored row o as float32, bit-identical to nanoasr.quant.reference (a
NaN stays a NaN, its payload aside).

Each decoder is value(w, h, o, i): w the stored array ([rows, cols] f32 / f16 / bf16 bits as uint16, or uint8
blocks [rows, row_bytes] in GGUF's layout), h the same bytes seen as float16 (the block scales; the dense
types ignore it). Float products go through mul_rn, so that the device compiler cannot fuse one with the
subtraction after it (Q4_K's min) into an FMA, which rounds once where the reference rounds twice.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda
from numba.cuda.core import config

if config.ENABLE_CUDASIM:
    @cuda.jit(device=True)
    def mul_rn(a, b):
        """The simulator multiplies numpy float32 scalars: already one rounding to nearest."""
        return a * b
else:
    from numba.cuda.libdevice import fmul_rn as mul_rn  # PTX mul.rn.f32, which ptxas never fuses


@cuda.jit(device=True)
def byte(w, o, k):
    """Byte k of stored row o as int32 (bytes are widened first, so no arithmetic wraps at 8 bits)."""
    return np.int32(w[o, k])


@cuda.jit(device=True)
def signed(b):
    """An int32 byte value 0..255 read as int8."""
    return b - ((b & 128) << 1)


# 2**(max(e, 1) - 134) for each finite bf16 exponent e: the weight of a mantissa's lowest bit once the
# implicit one is written into the mantissa (all exact float32; 2**-133 is subnormal).
BF16_STEP = np.ldexp(np.float32(1), np.maximum(np.arange(255), 1) - 134).astype(np.float32)


@cuda.jit(device=True)
def bf16_value(bits):
    """bf16 bits (int32) as float32, rebuilt from exponent and mantissa (the simulator has no bit casts):
    (128 + m) * 2**(e - 134) for normal numbers, m * 2**-133 for subnormal ones, both exact products."""
    exponent = (bits >> 7) & 255
    mantissa = bits & 127
    if exponent == 255:
        magnitude = np.float32(math.nan) if mantissa else np.float32(math.inf)
    else:
        implicit = 128 if exponent else 0
        magnitude = mul_rn(np.float32(mantissa + implicit), cuda.const.array_like(BF16_STEP)[exponent])
    return -magnitude if bits & 0x8000 else magnitude


@cuda.jit(device=True)
def f32(w, h, o, i):
    return w[o, i]


@cuda.jit(device=True)
def f16(w, h, o, i):
    return np.float32(w[o, i])


@cuda.jit(device=True)
def bf16(w, h, o, i):
    return bf16_value(np.int32(w[o, i]))


@cuda.jit(device=True)
def q8_0(w, h, o, i):
    """Blocks of 34 bytes: f16 d (halfword 17b of the row), 32 int8 q; x = q * d."""
    b = i >> 5
    q = signed(byte(w, o, 34 * b + 2 + (i & 31)))
    return mul_rn(np.float32(q), np.float32(h[o, 17 * b]))


@cuda.jit(device=True)
def q4_k_scale_min(w, o, at, j):
    """Sub-block j's 6-bit (scale, min) from the 12 packed bytes at byte `at`: j < 4 in the low 6 bits of
    bytes j / j + 4; j >= 4 in the low / high nibble of byte j + 4, topped by bits 6-7 of bytes j - 4 / j."""
    if j < 4:
        return byte(w, o, at + j) & 63, byte(w, o, at + 4 + j) & 63
    packed = byte(w, o, at + 4 + j)
    scale = (packed & 15) | ((byte(w, o, at + j - 4) >> 6) << 4)
    return scale, (packed >> 4) | ((byte(w, o, at + j) >> 6) << 4)


@cuda.jit(device=True)
def q4_k(w, h, o, i):
    """Super-blocks of 144 bytes: f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles; sub-block j
    of 32 lies in the low (j even) or high (j odd) nibbles of quant bytes 32 * (j // 2) ..;
    x = (d * scale_j) * q - dmin * min_j."""
    b = i >> 8
    j = (i >> 5) & 7
    scale, minimum = q4_k_scale_min(w, o, 144 * b + 4, j)
    q = (byte(w, o, 144 * b + 16 + 32 * (j >> 1) + (i & 31)) >> (4 * (j & 1))) & 15
    step = mul_rn(np.float32(h[o, 72 * b]), np.float32(scale))
    return mul_rn(step, np.float32(q)) - mul_rn(np.float32(h[o, 72 * b + 1]), np.float32(minimum))


@cuda.jit(device=True)
def q6_k(w, h, o, i):
    """Super-blocks of 210 bytes: two halves of 128 values, each with 64 bytes of low nibbles (value t < 64 in
    the low nibble of byte t, 64 + t in its high one) and 32 bytes of 2-bit highs (value 32k + l in bits 2k,
    2k + 1 of byte l); then 16 int8 scales (one per 16 values) and f16 d; x = (d * scale) * (q - 32)."""
    at = 210 * (i >> 8)
    e = i & 255
    t = e & 127
    low = (byte(w, o, at + 64 * (e >> 7) + (t & 63)) >> (4 * (t >> 6))) & 15
    high = (byte(w, o, at + 128 + 32 * (e >> 7) + (t & 31)) >> (2 * (t >> 5))) & 3
    scale = signed(byte(w, o, at + 192 + (e >> 4)))
    step = mul_rn(np.float32(h[o, 105 * (i >> 8) + 104]), np.float32(scale))
    return mul_rn(step, np.float32((low | (high << 4)) - 32))


VALUE = {"f32": f32, "f16": f16, "bf16": bf16, "q8_0": q8_0, "q4_k": q4_k, "q6_k": q6_k}
