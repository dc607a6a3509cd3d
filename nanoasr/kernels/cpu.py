"""Numba CPU kernels over weights in their stored type: x @ W.T for a few rows of x, and widening to float32.

Layouts are GGUF's (gguf.quants is the oracle): q8_0 blocks of 32 (f16 d, 32 int8), q4_k blocks of 256
(f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles), q6_k blocks of 256 (128 bytes of
low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales, f16 d).

Numba leaves LLVM's SLP vectoriser off, and its loop vectoriser unrolls the 32-element loop inside a block and
then vectorises across blocks with byte inserts and gathers (4-8 GB/s measured), so block work is written as
explicit LLVM vector code: `_put_*` decode 32 elements and store them (widening); `_rowsdot` builds, per
block type and for 1, 4 or 8 rows of x, a loop over weight rows that keeps 16-lane partial sums in registers.

x is first packed as [cols/16, nx, 16] with nx = 1, 4 or 8 (16 columns of every row side by side, rows past
B zero, 64-byte aligned), so the columns that meet one 16-lane weight vector are nx consecutive vectors.
Each weight vector is decoded once into a register and multiplied into all rows (one accumulator per x row);
two weight rows are decoded together, so each load of x feeds two FMAs and two weight streams are in flight;
the partial-sum vectors of a row are reduced together once per row (`_lane_sums`). Weight lines of the
next-but-one row pair are prefetched: the hardware prefetcher alone does not run far enough ahead. A row of
x gets the same arithmetic in the same order whatever rows share its batch, so batched decoding picks the same
tokens as decoding alone.

Importing this module compiles nothing; each kernel compiles on its first call and is cached on disk
(cache=True).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

QK = {"q8_0": (32, 34), "q4_k": (256, 144), "q6_k": (256, 210)}
_STORED = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "q8_0": np.uint8, "q4_k": np.uint8,
           "q6_k": np.uint8}
_REASSOC = {"reassoc", "contract"}  # lets the vectoriser keep per-lane partial sums; widening stays exact

_F32 = ir.FloatType()
_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)


# ---- LLVM vector building blocks (arguments: uint8 row, byte offsets, float32 row, element offsets) ----

def _at(context, builder, aryty, ary, off, elty, n):
    """Pointer to n elements of elty at element offset `off` of a contiguous array (unaligned)."""
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.bitcast(builder.gep(data, [off]), ir.PointerType(ir.VectorType(elty, n)))


def _load(builder, ptr):
    v = builder.load(ptr)
    v.align = 1
    return v


def _splat(builder, value, elty, n):
    undef = ir.Constant(ir.VectorType(elty, n), ir.Undefined)
    vec = builder.insert_element(undef, value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(_I32, n), [0] * n))


def _halves(builder, lo, hi, n):
    """<2n x float> whose first n lanes are `lo` and last n lanes are `hi`."""
    return builder.shuffle_vector(_splat(builder, lo, _F32, n), _splat(builder, hi, _F32, n),
                                  ir.Constant(ir.VectorType(_I32, 2 * n), [0] * n + [n] * n))


def _bytes(context, builder, sig, args, i, n):
    return _load(builder, _at(context, builder, sig.args[i], args[i], args[i + 1], _I8, n))


def _nibbles(builder, v, shift, n):
    """(v >> shift) & 15 of a <n x i8> vector, as float."""
    v = builder.and_(builder.lshr(v, _splat(builder, builder.trunc(shift, _I8), _I8, n)),
                     ir.Constant(ir.VectorType(_I8, n), [15] * n))
    return builder.uitofp(v, ir.VectorType(_F32, n))


def _q6(context, builder, sig, args, n):
    """Q6_K values (ql nibble | qh pair << 4) - 32 as float; args: q, ql_off, ql_shift, qh_off, qh_shift."""
    vt = ir.VectorType(_I8, n)
    ql = _load(builder, _at(context, builder, sig.args[0], args[0], args[1], _I8, n))
    qh = _load(builder, _at(context, builder, sig.args[0], args[0], args[3], _I8, n))
    lo = builder.and_(builder.lshr(ql, _splat(builder, builder.trunc(args[2], _I8), _I8, n)),
                      ir.Constant(vt, [15] * n))
    hi = builder.and_(builder.lshr(qh, _splat(builder, builder.trunc(args[4], _I8), _I8, n)),
                      ir.Constant(vt, [3] * n))
    q = builder.sub(builder.or_(lo, builder.shl(hi, ir.Constant(vt, [4] * n))), ir.Constant(vt, [32] * n))
    return builder.sitofp(q, ir.VectorType(_F32, n))


def _floats(context, builder, sig, args, i, n):
    return _load(builder, _at(context, builder, sig.args[i], args[i], args[i + 1], _F32, n))


def _store(context, builder, sig, args, i, value, n):
    builder.store(value, _at(context, builder, sig.args[i], args[i], args[i + 1], _F32, n)).align = 1


@intrinsic
def _f16_at(typingctx, q, off):
    """The f16 stored at byte `off` of q, as float32 (exact)."""
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.PointerType(_I16))
        bits = builder.zext(_load(builder, ptr), _I32)
        # through a zeroed vector, so the conversion does not wait on whatever last used the register
        vec = builder.insert_element(ir.Constant(ir.VectorType(_I32, 4), None), bits, ir.Constant(_I32, 0))
        half = builder.bitcast(vec, ir.VectorType(ir.HalfType(), 8))
        four = builder.shuffle_vector(half, half, ir.Constant(ir.VectorType(_I32, 4), [0, 1, 2, 3]))
        return builder.extract_element(builder.fpext(four, ir.VectorType(_F32, 4)), ir.Constant(_I32, 0))
    return types.float32(q, off), codegen


@intrinsic
def _h2f(typingctx, bits):
    """f16 bits (uint16) to float32 (exact; signalling NaNs come back quiet)."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), _F32)
    return types.float32(bits), codegen


@intrinsic
def _bf2f(typingctx, bits):
    """bf16 bits (uint16) to float32: the top half of the float32."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.shl(builder.zext(args[0], _I32), ir.Constant(_I32, 16)), _F32)
    return types.float32(bits), codegen


@intrinsic
def _put_i8(typingctx, q, qoff, d, out, ooff):
    """out[ooff+k] = int8(q[qoff+k]) * d, k < 32."""
    def codegen(context, builder, sig, args):
        qf = builder.sitofp(_bytes(context, builder, sig, args, 0, 32), ir.VectorType(_F32, 32))
        _store(context, builder, sig, args, 3, builder.fmul(qf, _splat(builder, args[2], _F32, 32)), 32)
        return context.get_dummy_value()
    return types.none(q, qoff, d, out, ooff), codegen


@intrinsic
def _put_nib(typingctx, q, qoff, shift, d, m, out, ooff):
    """out[ooff+k] = d * ((q[qoff+k] >> shift) & 15) - m, k < 32 (multiply, then subtract: as gguf)."""
    def codegen(context, builder, sig, args):
        qf = _nibbles(builder, _bytes(context, builder, sig, args, 0, 32), args[2], 32)
        d, m = _splat(builder, args[3], _F32, 32), _splat(builder, args[4], _F32, 32)
        v = builder.fsub(builder.fmul(d, qf), m)
        _store(context, builder, sig, args, 5, v, 32)
        return context.get_dummy_value()
    return types.none(q, qoff, shift, d, m, out, ooff), codegen


@intrinsic
def _put_q6(typingctx, q, qloff, qlshift, qhoff, qhshift, s0, s1, out, ooff):
    """out[ooff+k] = s_k * q6_k, k < 32, with s_k = s0 for k < 16 and s1 after."""
    def codegen(context, builder, sig, args):
        v = builder.fmul(_halves(builder, args[5], args[6], 16), _q6(context, builder, sig, args, 32))
        _store(context, builder, sig, args, 7, v, 32)
        return context.get_dummy_value()
    return types.none(q, qloff, qlshift, qhoff, qhshift, s0, s1, out, ooff), codegen


# ---- per-row decoding (exact, shared by widen and the batched product) ----

@njit(cache=True)
def _row_f16(row, w):  # row uint16 [cols] -> w float32 [cols]
    for c in range(row.shape[0]):
        w[c] = _h2f(row[c])


@njit(cache=True)
def _row_bf16(row, w):  # row uint16 [cols] -> w float32 [cols]
    for c in range(row.shape[0]):
        w[c] = _bf2f(row[c])


@njit(cache=True)
def _row_q8_0(row, w):  # row uint8 [nb*34] -> w float32 [nb*32]
    for b in range(w.shape[0] // 32):
        _put_i8(row, b * 34 + 2, _f16_at(row, b * 34), w, b * 32)


@njit(cache=True)
def _scale_min(row, o, j):
    """The 6-bit scale and min of sub-block j of the Q4_K block at byte o (its 12 scale bytes at o+4)."""
    s = o + 4
    if j < 4:
        return row[s + j] & 63, row[s + j + 4] & 63
    sc = (row[s + j + 4] & 15) | ((row[s + j - 4] >> 6) << 4)
    return sc, (row[s + j + 4] >> 4) | ((row[s + j] >> 6) << 4)


@njit(cache=True)
def _row_q4_k(row, w):  # row uint8 [nb*144] -> w float32 [nb*256]
    for b in range(w.shape[0] // 256):
        o = b * 144
        d = _f16_at(row, o)
        dmin = _f16_at(row, o + 2)
        for j in range(8):
            sc, m = _scale_min(row, o, j)
            _put_nib(row, o + 16 + 32 * (j >> 1), 4 * (j & 1), d * np.float32(sc), dmin * np.float32(m),
                     w, b * 256 + 32 * j)


@njit(cache=True)
def _row_q6_k(row, w):  # row uint8 [nb*210] -> w float32 [nb*256]
    for b in range(w.shape[0] // 256):
        o = b * 210
        d = _f16_at(row, o + 208)
        for h in range(2):
            for g in range(4):
                s = o + 192 + 8 * h + 2 * g
                _put_q6(row, o + 64 * h + 32 * (g & 1), 4 * (g >> 1), o + 128 + 32 * h, 2 * g,
                        d * np.float32(np.int8(row[s])), d * np.float32(np.int8(row[s + 1])),
                        w, b * 256 + 128 * h + 32 * g)


# ---- widen: every row into the caller's float32 buffer ----
# Serial on purpose: widening feeds a BLAS GEMM right after, and a numba parallel region between GEMMs leaves
# its threads spinning on the cores BLAS needs (measured: the encoder took 4x as long). One thread widens a
# layer's matrix in well under a millisecond.

@njit(cache=True)
def _widen_f16(data, out):
    for r in range(data.shape[0]):
        _row_f16(data[r], out[r])


@njit(cache=True)
def _widen_bf16(data, out):
    for r in range(data.shape[0]):
        _row_bf16(data[r], out[r])


@njit(cache=True)
def _widen_q8_0(data, out):
    for r in range(data.shape[0]):
        _row_q8_0(data[r], out[r])


@njit(cache=True)
def _widen_q4_k(data, out):
    for r in range(data.shape[0]):
        _row_q4_k(data[r], out[r])


@njit(cache=True)
def _widen_q6_k(data, out):
    for r in range(data.shape[0]):
        _row_q6_k(data[r], out[r])


@njit(cache=True)
def _widen_f32(data, out):
    for r in range(data.shape[0]):
        for c in range(data.shape[1]):
            out[r, c] = data[r, c]


# ---- block types: one pass over the stored row, per-lane sums in registers (LLVM vector code) ----
#
# A block decoder returns groups (s, [(q, off), ...]): 16-lane float vectors q of values that share the
# 16-lane scale vector s (None: unscaled, the dense types) and meet x at element offset `off` of the block,
# plus `direct` terms (w, off): 8-lane vectors met with the 32-column sums of x (Q4_K's mins). One row of x
# sums q*x over a group and multiplies by s once; several rows of x widen each weight vector q*s once and
# multiply it into every row. Groups may come as a generator, so two rows' decoding interleaves with the FMAs.

_V16 = ir.VectorType(_F32, 16)


def _vec_at(builder, base, off, elty, n):
    """Load n elements of elty at element offset `off` (an int) of pointer `base`."""
    ptr = builder.gep(base, [ir.Constant(ir.IntType(64), off)]) if off else base
    return _load(builder, builder.bitcast(ptr, ir.PointerType(ir.VectorType(elty, n))))


def _lanes(builder, v, idx):
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, len(idx)), list(idx)))


def _halfs(builder, blk, off):
    """The 8 f16 at byte offset `off` of blk as <8 x float>: one whole-vector conversion (a scalar one would
    be loaded with vpinsrw, which LLVM merges into a live register: a false dependence across blocks)."""
    halves = builder.bitcast(_vec_at(builder, blk, off, _I8, 16), ir.VectorType(ir.HalfType(), 8))
    return builder.fpext(halves, ir.VectorType(_F32, 8))


def _int_lanes(builder, v, signed):
    """<32 x i8> as two <16 x float>."""
    conv = builder.sitofp if signed else builder.uitofp
    return [conv(_lanes(builder, v, range(16 * h, 16 * h + 16)), _V16) for h in range(2)]


def _i8const(value, n=32):
    return ir.Constant(ir.VectorType(_I8, n), value if isinstance(value, list) else [value] * n)


def _w_q8_0(builder, blk):
    """Q8_0 block (f16 d, 32 int8): one group of two vectors with scale d."""
    d = _lanes(builder, _halfs(builder, blk, 0), [0] * 16)
    q = _int_lanes(builder, _vec_at(builder, blk, 2, _I8, 32), True)
    return [(d, [(q[0], 0), (q[1], 16)])], []


def _scales_mins(builder, v):
    """Q4_K's 8 6-bit scales and mins as <8 x i8>, from its 12 packed bytes (v = 16 bytes from byte 4):
    scale/min j < 4 are the low 6 bits of bytes j / j+4; j >= 4 take bytes j+4's low / high nibble, with
    bits 6-7 of bytes j-4 / j on top."""
    const = lambda value: _i8const(value, 16)  # noqa: E731
    low6 = builder.and_(v, const(63))
    top = builder.and_(builder.lshr(v, const(2)), const(0x30))
    zero = ir.Constant(v.type, None)
    sc = builder.or_(_pick(builder, low6, builder.and_(v, const(15)), [0, 1, 2, 3, 24, 25, 26, 27]),
                     _pick(builder, zero, top, [0, 0, 0, 0, 16, 17, 18, 19]))
    mn = builder.or_(_pick(builder, low6, builder.lshr(v, const(4)), [4, 5, 6, 7, 24, 25, 26, 27]),
                     _pick(builder, zero, top, [0, 0, 0, 0, 20, 21, 22, 23]))
    return sc, mn


def _pick(builder, a, b, idx):
    """Lanes idx of a and b side by side (b's lanes numbered from len(a))."""
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def _w_q4_k(builder, blk):
    """Q4_K block: sub-block j (32 nibbles, low halves of bytes 32*(j//2).. for even j, high for odd) is a
    group with scale d*sc_j; the mins enter as -dmin*m_j against the 32-column sums of x. Nibbles are split
    after widening 16 bytes to 32-bit lanes, which loads and widens in one instruction."""
    v8 = ir.VectorType(_F32, 8)
    i32x16 = ir.VectorType(_I32, 16)
    dm = _halfs(builder, blk, 0)
    sc, mn = _scales_mins(builder, _vec_at(builder, blk, 4, _I8, 16))
    scf = builder.fmul(builder.uitofp(sc, v8), _lanes(builder, dm, [0] * 8))
    mnf = builder.fmul(builder.uitofp(mn, v8), _lanes(builder, dm, [1] * 8))

    def groups():
        for c in range(4):
            wide = [builder.zext(_vec_at(builder, blk, 16 + 32 * c + 16 * k, _I8, 16), i32x16)
                    for k in range(2)]
            for h in range(2):
                q = [builder.uitofp(builder.and_(builder.lshr(w, ir.Constant(i32x16, [4 * h] * 16)),
                                                 ir.Constant(i32x16, [15] * 16)), _V16) for w in wide]
                off = 64 * c + 32 * h
                yield _lanes(builder, scf, [2 * c + h] * 16), [(q[0], off), (q[1], off + 16)]
    return groups(), [(builder.fsub(ir.Constant(v8, None), mnf), 0)]


def _w_q6_k(builder, blk):
    """Q6_K block (128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, f16 d): each 16 elements
    are a group with scale d*scale_i."""
    d = _halfs(builder, blk, 194)  # the 8 f16 ending the block: d is the last
    scales = builder.sitofp(_vec_at(builder, blk, 192, _I8, 16), _V16)
    scf = builder.fmul(scales, _lanes(builder, d, [7] * 16))

    def groups():
        for h in range(2):
            qh = _vec_at(builder, blk, 128 + 32 * h, _I8, 32)
            for g in range(4):
                ql = _vec_at(builder, blk, 64 * h + 32 * (g & 1), _I8, 32)
                lo = builder.and_(builder.lshr(ql, _i8const(4 * (g >> 1))), _i8const(15))
                hi = builder.and_(builder.lshr(qh, _i8const(2 * g)), _i8const(3))
                q = builder.sub(builder.or_(lo, builder.shl(hi, _i8const(4))), _i8const(32))
                for k, qf in enumerate(_int_lanes(builder, q, True)):
                    i = 8 * h + 2 * g + k
                    yield _lanes(builder, scf, [i] * 16), [(qf, 16 * i)]
    return groups(), []


def _w_dense(load, size):
    """A dense block of 32 values (`size` bytes each) as one unscaled group; load(builder, blk, byte offset)
    gives 16 of them as floats."""
    def weights(builder, blk):
        return [(None, [(load(builder, blk, 0), 0), (load(builder, blk, 16 * size), 16)])], []
    return weights


def _f32x16(builder, blk, off):
    return _vec_at(builder, blk, off, _F32, 16)


def _f16x16(builder, blk, off):
    return builder.fpext(_vec_at(builder, blk, off, ir.HalfType(), 16), _V16)


def _bf16x16(builder, blk, off):
    i32x16 = ir.VectorType(_I32, 16)
    wide = builder.zext(_vec_at(builder, blk, off, _I16, 16), i32x16)
    return builder.bitcast(builder.shl(wide, ir.Constant(i32x16, [16] * 16)), _V16)


def _fma(builder, a, b, c):
    """a * b + c, one rounding, for float vectors."""
    ty = a.type
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3),
                                        f"llvm.fma.v{ty.count}f32")
    return builder.call(fn, [a, b, c])


def _mac(builder, ptr, a, b):  # *ptr += a * b
    builder.store(_fma(builder, a, b, builder.load(ptr)), ptr)


def _prefetch(builder, ptr):
    """Ask for the cache line at ptr (i8*). With several rows of x each weight line keeps the core busy for
    many cycles, and the hardware prefetcher does not run far enough ahead of such a slow stream."""
    fnty = ir.FunctionType(ir.VoidType(), [ptr.type, _I32, _I32, _I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


def _block_loop(builder, nb, unroll, block):
    """block(index, slot) -> next slot, for index < nb, the loop unrolled `unroll` times."""
    i64 = lambda v: ir.Constant(ir.IntType(64), v)  # noqa: E731
    main = builder.udiv(nb, i64(unroll))
    with cgutils.for_range(builder, main) as loop:
        slot = 0
        for u in range(unroll):
            slot = block(builder.add(builder.mul(loop.index, i64(unroll)), i64(u)), slot)
    with cgutils.for_range(builder, builder.sub(nb, builder.mul(main, i64(unroll)))) as loop:
        block(builder.add(builder.mul(main, i64(unroll)), loop.index), 0)


def _widen16(builder, v):
    """<8 x float> as <16 x float>, zeros above."""
    return _pick(builder, v, ir.Constant(v.type, None), list(range(16)))


def _lane_sums(builder, vs):
    """<len(vs) x float> of the lane sums of the 16-lane vectors vs (a power of two of them, at most 16):
    pairs are folded into vectors of half-length segments until one is left, then its segments summed."""
    seg = 16
    while len(vs) > 1:
        half = seg // 2
        lo = [s * seg + j for s in range(16 // seg) for j in range(half)]
        lo += [16 + i for i in lo]
        hi = [i + half for i in lo]
        vs = [builder.fadd(_pick(builder, a, b, lo), _pick(builder, a, b, hi))
              for a, b in zip(vs[::2], vs[1::2])]
        seg = half
    v, width = vs[0], 16
    while seg > 1:
        half = seg // 2
        lo = [s * seg + j for s in range(width // seg) for j in range(half)]
        v = builder.fadd(_lanes(builder, v, lo), _lanes(builder, v, [i + half for i in lo]))
        seg, width = half, width // 2
    return v


_TILE = 4096  # columns per pass for several rows of x: whole rows at these models' widths measured fastest
_ROWS = 32  # weight rows per parallel task for several rows of x
_PAIR = 2  # weight rows decoded together, so that each load of x feeds two FMAs


def _rowsdot(name, weights, block_bytes, block_elems, unroll, nx):
    """Intrinsic (data, xp, xs, nb, r0, r1, out): out[:, r0:r1] = x @ W[r0:r1].T over the first nb blocks of
    each row, r1 - r0 <= _ROWS, for x packed as xp [nb*block_elems/16, nx, 16] (16 columns of every row of x
    side by side; xs: its 32-column sums packed [nb, nx, 16], 8 sums and 8 zeros, for the direct terms); rows
    of x past out.shape[0] are padding, not written. Each weight vector is decoded once into a register and
    met with the same 16 columns of all nx rows (nx accumulators), for two weight rows at once; per row and
    pass over the columns (_TILE of them) the nx sums are reduced together."""
    def rowsdot(typingctx, data, xp, xs, nb, r0, r1, out):
        def codegen(context, builder, sig, args):
            i64 = lambda v: ir.Constant(ir.IntType(64), v)  # noqa: E731
            da, xa, sa = (context.make_array(sig.args[i])(context, builder, args[i]) for i in range(3))
            oa = context.make_array(sig.args[6])(context, builder, args[6])
            base = builder.bitcast(da.data, ir.PointerType(_I8))
            stride = cgutils.unpack_tuple(builder, da.strides)[0]
            nout, orow = cgutils.unpack_tuple(builder, oa.shape)
            nb, r0, r1 = args[3:6]
            rows = builder.sub(r1, r0)
            vec = ir.VectorType(_F32, nx)
            sums = cgutils.alloca_once(builder, vec, size=_ROWS)  # per row, summed over the tiles
            with cgutils.for_range(builder, rows) as row:
                builder.store(ir.Constant(vec, None), builder.gep(sums, [row.index]))
            acc = [[cgutils.alloca_once(builder, _V16) for _ in range(nx)] for _ in range(_PAIR)]
            step = max(1, _TILE // block_elems)
            last = builder.sub(rows, i64(1))
            ahead = builder.mul(stride, i64(2 * _PAIR))
            with cgutils.for_range(builder, builder.udiv(builder.add(nb, i64(step - 1)), i64(step))) as tile:
                k0 = builder.mul(tile.index, i64(step))
                left = builder.sub(nb, k0)
                kn = builder.select(builder.icmp_unsigned("<", left, i64(step)), left, i64(step))
                pairs = builder.udiv(builder.add(rows, i64(_PAIR - 1)), i64(_PAIR))
                with cgutils.for_range(builder, pairs) as pair:
                    # rows i, i+1 (the last row twice when the count is odd)
                    first = builder.mul(pair.index, i64(_PAIR))
                    nxt = [builder.add(first, i64(j)) for j in range(1, _PAIR)]
                    idx = [first] + [builder.select(builder.icmp_unsigned("<", i, rows), i, last)
                                     for i in nxt]
                    wrows = [builder.gep(base, [builder.mul(builder.add(r0, i), stride)]) for i in idx]
                    for a in sum(acc, []):
                        builder.store(ir.Constant(a.type.pointee, None), a)

                    def block(index, slot):
                        index = builder.add(index, k0)
                        xb = builder.gep(xa.data, [builder.mul(index, i64(block_elems * nx))])
                        sb = builder.gep(sa.data, [builder.mul(index, i64(16 * nx))])
                        blks = [builder.gep(w, [builder.mul(index, i64(block_bytes))]) for w in wrows]
                        for blk in blks:  # the same block two row pairs on
                            for line in range(0, block_bytes, 64):
                                _prefetch(builder, builder.gep(blk, [builder.add(ahead, i64(line))]))
                        decoded = [weights(builder, blk) for blk in blks]
                        for groups in zip(*(g for g, _ in decoded)):
                            for qs in zip(*(q for _, q in groups)):
                                ws = [q if s is None else builder.fmul(q, s)
                                      for (q, _), (s, _) in zip(qs, groups)]
                                for b in range(nx):
                                    xv = _vec_at(builder, xb, qs[0][1] * nx + 16 * b, _F32, 16)
                                    for j, w in enumerate(ws):
                                        _mac(builder, acc[j][b], w, xv)
                        for direct in zip(*(d for _, d in decoded)):  # 8 lanes, widened
                            for b in range(nx):
                                sv = _vec_at(builder, sb, 16 * b, _F32, 16)
                                for j, (w, _) in enumerate(direct):
                                    _mac(builder, acc[j][b], _widen16(builder, w), sv)
                        return slot

                    _block_loop(builder, kn, unroll, block)
                    for j, i in enumerate(idx):  # a repeated row is added once
                        at = builder.gep(sums, [i])
                        old = builder.load(at)
                        new = builder.fadd(old, _lane_sums(builder, [builder.load(a) for a in acc[j]]))
                        if j:
                            new = builder.select(builder.icmp_unsigned("==", i, idx[j - 1]), old, new)
                        builder.store(new, at)
            with cgutils.for_range(builder, rows) as row:
                v = builder.load(builder.gep(sums, [row.index]))
                r = builder.add(r0, row.index)
                for b in range(nx):
                    with builder.if_then(builder.icmp_signed("<", i64(b), nout)):
                        builder.store(builder.extract_element(v, ir.Constant(_I32, b)),
                                      builder.gep(oa.data, [builder.add(builder.mul(i64(b), orow), r)]))
            return context.get_dummy_value()
        return types.none(data, xp, xs, nb, r0, r1, out), codegen
    rowsdot.__name__ = rowsdot.__qualname__ = name
    return intrinsic(rowsdot)


_BLOCKS = {  # type: (decoder, bytes and elements per block, block loop unrolling)
    "q8_0": (_w_q8_0, 34, 32, 4), "q4_k": (_w_q4_k, 144, 256, 1), "q6_k": (_w_q6_k, 210, 256, 1),
    "f32": (_w_dense(_f32x16, 4), 128, 32, 2), "f16": (_w_dense(_f16x16, 2), 64, 32, 2),
    "bf16": (_w_dense(_bf16x16, 2), 64, 32, 2)}
_DOTS = {(t, nx): _rowsdot(f"_dots_{t}_{nx}", *_BLOCKS[t], nx) for t in _BLOCKS for nx in (1, 4, 8)}
_dots_q8_0_1, _dots_q4_k_1, _dots_q6_k_1, _dots_f32_1, _dots_f16_1, _dots_bf16_1 = (_DOTS[t, 1]
                                                                                    for t in _BLOCKS)
_dots_q8_0_4, _dots_q4_k_4, _dots_q6_k_4, _dots_f32_4, _dots_f16_4, _dots_bf16_4 = (_DOTS[t, 4]
                                                                                    for t in _BLOCKS)
_dots_q8_0_8, _dots_q4_k_8, _dots_q6_k_8, _dots_f32_8, _dots_f16_8, _dots_bf16_8 = (_DOTS[t, 8]
                                                                                    for t in _BLOCKS)


@njit(cache=True)
def _packed(x, cols):  # x float32 [n <= 8, >= cols] -> float32 [cols/16, nx = 1, 4 or 8, 16]
    """16 columns of every row of x side by side (rows past n are zeros), starting on a 64-byte boundary so
    that no 16-column vector straddles cache lines."""
    nx = 1 if x.shape[0] == 1 else 4 if x.shape[0] <= 4 else 8
    buf = np.zeros(cols * nx + 16, np.float32)
    start = (64 - buf.ctypes.data % 64) % 64 // 4
    xp = buf[start:start + cols * nx].reshape(cols // 16, nx, 16)
    for g in range(cols // 16):
        for b in range(x.shape[0]):
            for k in range(16):
                xp[g, b, k] = x[b, 16 * g + k]
    return xp


@njit(fastmath=_REASSOC, cache=True)
def _packed_sums(xp):  # xp float32 [16*nb, nx, 16] -> float32 [nb, nx, 16]: sums of each 32 columns, 8 zeros
    xs = np.zeros((xp.shape[0] // 16, xp.shape[1], 16), np.float32)
    for i in range(xs.shape[0]):
        for b in range(xs.shape[1]):
            for j in range(8):
                g = 2 * (8 * i + j)
                s = np.float32(0)
                for k in range(16):
                    s += xp[g, b, k] + xp[g + 1, b, k]
                xs[i, b, j] = s
    return xs


# Several rows of x, one driver per stored type: x float32 [n <= 8, cols], data [rows, ...] stored (nb whole
# blocks of per columns a row), out float32 [n, rows]. Only q4_k has direct terms; the others pass xp as xs.

@njit(parallel=True, cache=True)
def _mvp_q8_0(x, data, nb, out):
    xp = _packed(x, nb * 32)
    xs = xp
    for t in prange((data.shape[0] + _ROWS - 1) // _ROWS):
        r0, r1 = t * _ROWS, min(data.shape[0], (t + 1) * _ROWS)
        if xp.shape[1] == 1:
            _dots_q8_0_1(data, xp, xs, nb, r0, r1, out)
        elif xp.shape[1] == 4:
            _dots_q8_0_4(data, xp, xs, nb, r0, r1, out)
        else:
            _dots_q8_0_8(data, xp, xs, nb, r0, r1, out)


@njit(parallel=True, cache=True)
def _mvp_q4_k(x, data, nb, out):
    xp = _packed(x, nb * 256)
    xs = _packed_sums(xp)
    for t in prange((data.shape[0] + _ROWS - 1) // _ROWS):
        r0, r1 = t * _ROWS, min(data.shape[0], (t + 1) * _ROWS)
        if xp.shape[1] == 1:
            _dots_q4_k_1(data, xp, xs, nb, r0, r1, out)
        elif xp.shape[1] == 4:
            _dots_q4_k_4(data, xp, xs, nb, r0, r1, out)
        else:
            _dots_q4_k_8(data, xp, xs, nb, r0, r1, out)


@njit(parallel=True, cache=True)
def _mvp_q6_k(x, data, nb, out):
    xp = _packed(x, nb * 256)
    xs = xp
    for t in prange((data.shape[0] + _ROWS - 1) // _ROWS):
        r0, r1 = t * _ROWS, min(data.shape[0], (t + 1) * _ROWS)
        if xp.shape[1] == 1:
            _dots_q6_k_1(data, xp, xs, nb, r0, r1, out)
        elif xp.shape[1] == 4:
            _dots_q6_k_4(data, xp, xs, nb, r0, r1, out)
        else:
            _dots_q6_k_8(data, xp, xs, nb, r0, r1, out)


@njit(parallel=True, cache=True)
def _mvp_f32(x, data, nb, out):
    xp = _packed(x, nb * 32)
    xs = xp
    for t in prange((data.shape[0] + _ROWS - 1) // _ROWS):
        r0, r1 = t * _ROWS, min(data.shape[0], (t + 1) * _ROWS)
        if xp.shape[1] == 1:
            _dots_f32_1(data, xp, xs, nb, r0, r1, out)
        elif xp.shape[1] == 4:
            _dots_f32_4(data, xp, xs, nb, r0, r1, out)
        else:
            _dots_f32_8(data, xp, xs, nb, r0, r1, out)


@njit(parallel=True, cache=True)
def _mvp_f16(x, data, nb, out):
    xp = _packed(x, nb * 32)
    xs = xp
    for t in prange((data.shape[0] + _ROWS - 1) // _ROWS):
        r0, r1 = t * _ROWS, min(data.shape[0], (t + 1) * _ROWS)
        if xp.shape[1] == 1:
            _dots_f16_1(data, xp, xs, nb, r0, r1, out)
        elif xp.shape[1] == 4:
            _dots_f16_4(data, xp, xs, nb, r0, r1, out)
        else:
            _dots_f16_8(data, xp, xs, nb, r0, r1, out)


@njit(parallel=True, cache=True)
def _mvp_bf16(x, data, nb, out):
    xp = _packed(x, nb * 32)
    xs = xp
    for t in prange((data.shape[0] + _ROWS - 1) // _ROWS):
        r0, r1 = t * _ROWS, min(data.shape[0], (t + 1) * _ROWS)
        if xp.shape[1] == 1:
            _dots_bf16_1(data, xp, xs, nb, r0, r1, out)
        elif xp.shape[1] == 4:
            _dots_bf16_4(data, xp, xs, nb, r0, r1, out)
        else:
            _dots_bf16_8(data, xp, xs, nb, r0, r1, out)


_MVP = {"f32": _mvp_f32, "f16": _mvp_f16, "bf16": _mvp_bf16, "q8_0": _mvp_q8_0, "q4_k": _mvp_q4_k,
        "q6_k": _mvp_q6_k}
_WIDEN = {"f32": _widen_f32, "f16": _widen_f16, "bf16": _widen_bf16, "q8_0": _widen_q8_0,
          "q4_k": _widen_q4_k, "q6_k": _widen_q6_k}


# ---- entry points ----

def _stored(data: np.ndarray, dtype: str, rows: int, cols: int) -> np.ndarray:
    """The stored array checked against (dtype, rows, cols), as the kernels take it (f16 as uint16 bits)."""
    if dtype not in _STORED:
        raise ValueError(f"storage type must be one of {', '.join(_STORED)}; got {dtype!r}")
    if dtype in QK:
        per, nbytes = QK[dtype]
        if cols % per:
            raise ValueError(f"{dtype} row length must be a multiple of {per}; got {cols}")
        shape = (rows, cols // per * nbytes)
    else:
        shape = (rows, cols)
    if data.dtype != _STORED[dtype] or data.shape != shape:
        raise ValueError(f"{dtype} data of a [{rows}, {cols}] tensor must be {np.dtype(_STORED[dtype])} "
                         f"{list(shape)}; got {data.dtype} {list(data.shape)}")
    if data.strides[1] != data.itemsize:
        raise ValueError(f"{dtype} data rows must be contiguous; got strides {data.strides}")
    return data.view(np.uint16) if dtype == "f16" else data


def _f32_rows(a: np.ndarray, what: str, cols: int) -> None:
    if a.dtype != np.float32 or a.ndim != 2 or a.shape[1] != cols or not a.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous float32 [n, {cols}]; got {a.dtype} {list(a.shape)}")


def matvec(x: np.ndarray, data: np.ndarray, dtype: str, rows: int, cols: int, out: np.ndarray) -> np.ndarray:
    """out[B, rows] = x[B, cols] @ W.T for W stored as `data` in `dtype`, read in place (one pass over W
    for every 8 rows of x; B is meant to be small, as in batched decoding)."""
    data = _stored(data, dtype, rows, cols)
    _f32_rows(x, "x", cols)
    _f32_rows(out, "out", rows)
    if out.shape[0] != x.shape[0]:
        raise ValueError(f"out must have {x.shape[0]} rows like x; got {out.shape[0]}")
    for b in range(0, x.shape[0], 8):
        _product(x[b:b + 8], data, dtype, out[b:b + 8])
    return out


def _product(x, data, dtype, out):  # x [n <= 8, cols] -> out [n, rows]
    cols = x.shape[1]
    per = QK[dtype][0] if dtype in QK else 32
    nb = cols // per
    _MVP[dtype](x, data, nb, out)
    if nb * per < cols:  # dense rows: the columns past the last whole block of 32
        out += x[:, nb * per:] @ _dense_float(data[:, nb * per:], dtype).T


def _dense_float(data: np.ndarray, dtype: str) -> np.ndarray:
    """Dense stored values (f16 as uint16 bits) as float32, exactly."""
    if dtype == "f16":
        return data.view(np.float16).astype(np.float32)
    if dtype == "bf16":
        return (data.astype(np.uint32) << 16).view(np.float32)
    return data


def widen(data: np.ndarray, dtype: str, rows: int, cols: int, out: np.ndarray) -> np.ndarray:
    """out[rows, cols] = W as float32, exactly as gguf.quants.dequantize (or an exact cast) gives it."""
    data = _stored(data, dtype, rows, cols)
    _f32_rows(out, "out", cols)
    if out.shape[0] != rows:
        raise ValueError(f"out must have {rows} rows; got {out.shape[0]}")
    _WIDEN[dtype](data, out)
    return out
