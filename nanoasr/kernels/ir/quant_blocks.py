"""LLVM vector decoders of the block-quantized types (GGUF layouts; gguf.quants is the oracle): q8_0 blocks of
32 (f16 d, 32 int8), q4_k blocks of 256 (f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
nibbles), q6_k blocks of 256 (128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales, f16 d).
The decoder contract is in blocks.py.
"""
from __future__ import annotations

from llvmlite import ir

from nanoasr.kernels.ir.vector import F32, I8, I32, V16, bytes_of, lanes, load_vector, pick


def f16x8(builder, blk, off):
    """The 8 f16 at byte offset `off` of blk as <8 x float>: one whole-vector conversion (a scalar one would
    be loaded with vpinsrw, which LLVM merges into a live register: a false dependence across blocks)."""
    halves = builder.bitcast(load_vector(builder, blk, off, I8, 16), ir.VectorType(ir.HalfType(), 8))
    return builder.fpext(halves, ir.VectorType(F32, 8))


def _signed_lanes(builder, v):
    """<32 x i8> as two <16 x float>."""
    return [builder.sitofp(lanes(builder, v, range(16 * h, 16 * h + 16)), V16) for h in range(2)]


def q8_0(builder, blk):
    """Q8_0 block (f16 d, 32 int8): one group of two vectors with scale d."""
    d = lanes(builder, f16x8(builder, blk, 0), [0] * 16)
    q = _signed_lanes(builder, load_vector(builder, blk, 2, I8, 32))
    return [(d, [(q[0], 0), (q[1], 16)])], None


def scales_mins(builder, v):
    """Q4_K's 8 6-bit scales and mins as <8n x i8>, from the 12 packed bytes of each of n blocks (v: 16 bytes
    from byte 4 of each, side by side): scale/min j < 4 are the low 6 bits of bytes j / j+4; j >= 4 take bytes
    j+4's low / high nibble, with bits 6-7 of bytes j-4 / j on top."""
    width = v.type.count
    low6 = builder.and_(v, bytes_of(63, width))
    top = builder.and_(builder.lshr(v, bytes_of(2, width)), bytes_of(0x30, width))
    zero = ir.Constant(v.type, None)

    def lanes_of(low, high):  # per block: lanes `low` of the first operand, `high` of the second
        return [i for at in range(0, width, 16)
                for i in [at + j for j in low] + [width + at + j for j in high]]

    nibbles = [builder.and_(v, bytes_of(15, width)), builder.lshr(v, bytes_of(4, width))]
    sc = builder.or_(pick(builder, low6, nibbles[0], lanes_of(range(4), range(8, 12))),
                     pick(builder, zero, top, lanes_of([0] * 4, range(4))))
    mn = builder.or_(pick(builder, low6, nibbles[1], lanes_of(range(4, 8), range(8, 12))),
                     pick(builder, zero, top, lanes_of([0] * 4, range(4, 8))))
    return sc, mn


def q4_k(builder, blk):
    """Q4_K block: sub-block j (32 nibbles, low halves of bytes 32*(j//2).. for even j, high for odd) is a
    group with scale d*sc_j, min dmin*m_j. Nibbles are split after widening 16 bytes to 32-bit lanes, which
    loads and widens in one instruction."""
    v8 = ir.VectorType(F32, 8)
    i32x16 = ir.VectorType(I32, 16)
    dm = f16x8(builder, blk, 0)
    sc, mn = scales_mins(builder, load_vector(builder, blk, 4, I8, 16))
    scf = builder.fmul(builder.uitofp(sc, v8), lanes(builder, dm, [0] * 8))
    mnf = builder.fmul(builder.uitofp(mn, v8), lanes(builder, dm, [1] * 8))

    def groups():
        for c in range(4):
            wide = [builder.zext(load_vector(builder, blk, 16 + 32 * c + 16 * k, I8, 16), i32x16)
                    for k in range(2)]
            for h in range(2):
                q = [builder.uitofp(builder.and_(builder.lshr(w, ir.Constant(i32x16, [4 * h] * 16)),
                                                 ir.Constant(i32x16, [15] * 16)), V16) for w in wide]
                off = 64 * c + 32 * h
                yield lanes(builder, scf, [2 * c + h] * 16), [(q[0], off), (q[1], off + 16)]
    return groups(), mnf


def q6_k(builder, blk):
    """Q6_K block (128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, f16 d): each 16 elements
    are a group with scale d*scale_i."""
    d = f16x8(builder, blk, 194)  # the 8 f16 ending the block: d is the last
    scales = builder.sitofp(load_vector(builder, blk, 192, I8, 16), V16)
    scf = builder.fmul(scales, lanes(builder, d, [7] * 16))

    def groups():
        for h in range(2):
            qh = load_vector(builder, blk, 128 + 32 * h, I8, 32)
            for g in range(4):
                ql = load_vector(builder, blk, 64 * h + 32 * (g & 1), I8, 32)
                lo = builder.and_(builder.lshr(ql, bytes_of(4 * (g >> 1))), bytes_of(15))
                hi = builder.and_(builder.lshr(qh, bytes_of(2 * g)), bytes_of(3))
                q = builder.sub(builder.or_(lo, builder.shl(hi, bytes_of(4))), bytes_of(32))
                for k, qf in enumerate(_signed_lanes(builder, q)):
                    i = 8 * h + 2 * g + k
                    yield lanes(builder, scf, [i] * 16), [(qf, 16 * i)]
    return groups(), None
