"""Numba CPU kernels over weights in their stored type: x @ W.T for a few rows of x, and widening to float32.

Layouts are GGUF's (gguf.quants is the oracle): q8_0 blocks of 32 (f16 d, 32 int8), q4_k blocks of 256
(f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles), q6_k blocks of 256 (128 bytes of
low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales, f16 d).

Numba leaves LLVM's SLP vectoriser off, and its loop vectoriser unrolls the 32-element loop inside a block and
then vectorises across blocks with byte inserts and gathers (4-8 GB/s measured), so block work is written as
explicit LLVM vector code: `_put_*` decode 32 elements and store them (widening), and `_rowdot` builds, per
block type and x height (1, 4, 8), a loop over a row's blocks that keeps 32-lane partial sums per x row in
registers. Dense rows use flat loops, which the loop vectoriser handles. Importing this module compiles
nothing; each kernel compiles on its first call and is cached on disk (cache=True).
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


def _hsum(builder, v, n):
    """Pairwise sum of the n lanes of v."""
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n, 2 * n))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, ir.Constant(_I32, 0))


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

@njit(parallel=True, cache=True)
def _widen_f16(data, out):
    for r in prange(data.shape[0]):
        _row_f16(data[r], out[r])


@njit(parallel=True, cache=True)
def _widen_bf16(data, out):
    for r in prange(data.shape[0]):
        _row_bf16(data[r], out[r])


@njit(parallel=True, cache=True)
def _widen_q8_0(data, out):
    for r in prange(data.shape[0]):
        _row_q8_0(data[r], out[r])


@njit(parallel=True, cache=True)
def _widen_q4_k(data, out):
    for r in prange(data.shape[0]):
        _row_q4_k(data[r], out[r])


@njit(parallel=True, cache=True)
def _widen_q6_k(data, out):
    for r in prange(data.shape[0]):
        _row_q6_k(data[r], out[r])


@njit(parallel=True, cache=True)
def _widen_f32(data, out):
    for r in prange(data.shape[0]):
        for c in range(data.shape[1]):
            out[r, c] = data[r, c]


# ---- one row of x: the stored row is read once, block by block ----

@njit(fastmath=_REASSOC, cache=True)
def _dot(w, x):  # w, x float32 [cols] -> float32
    acc = np.float32(0)
    for c in range(w.shape[0]):
        acc += w[c] * x[c]
    return acc


@njit(fastmath=_REASSOC, cache=True)
def _dot_f16(row, x):  # row uint16 [cols], x float32 [cols]
    acc = np.float32(0)
    for c in range(row.shape[0]):
        acc += _h2f(row[c]) * x[c]
    return acc


@njit(fastmath=_REASSOC, cache=True)
def _dot_bf16(row, x):  # row uint16 [cols], x float32 [cols]
    acc = np.float32(0)
    for c in range(row.shape[0]):
        acc += _bf2f(row[c]) * x[c]
    return acc


@njit(parallel=True, cache=True)
def _mv1_f32(x, data, out):  # x [cols], data [rows, cols] -> out [rows]
    for r in prange(data.shape[0]):
        out[r] = _dot(data[r], x)


@njit(parallel=True, cache=True)
def _mv1_f16(x, data, out):
    for r in prange(data.shape[0]):
        out[r] = _dot_f16(data[r], x)


@njit(parallel=True, cache=True)
def _mv1_bf16(x, data, out):
    for r in prange(data.shape[0]):
        out[r] = _dot_bf16(data[r], x)


# ---- several rows of x: widen one stored row into a small buffer, then four dot products per pass ----

_CHUNK = 16  # rows per parallel task: each task allocates one row buffer


@njit(fastmath=_REASSOC, cache=True)
def _dot4(w, x, b, out, r):  # w float32 [cols], x float32 [B4, cols]: out[b:b+4, r] = x[b:b+4] @ w
    a0 = np.float32(0)
    a1 = np.float32(0)
    a2 = np.float32(0)
    a3 = np.float32(0)
    x0, x1, x2, x3 = x[b], x[b + 1], x[b + 2], x[b + 3]
    for c in range(w.shape[0]):
        wc = w[c]
        a0 += wc * x0[c]
        a1 += wc * x1[c]
        a2 += wc * x2[c]
        a3 += wc * x3[c]
    out[b, r] = a0
    out[b + 1, r] = a1
    out[b + 2, r] = a2
    out[b + 3, r] = a3


@njit(cache=True)
def _rows(x, w, out, r):  # all four-row groups of x against the widened row w
    for b in range(0, x.shape[0], 4):
        _dot4(w, x, b, out, r)


@njit(parallel=True, cache=True)
def _mvb_f32(x, data, out):  # x [B4, cols], data [rows, cols] -> out [B4, rows]
    for r in prange(data.shape[0]):
        _rows(x, data[r], out, r)


@njit(parallel=True, cache=True)
def _mvb_f16(x, data, out):
    rows = data.shape[0]
    for t in prange((rows + _CHUNK - 1) // _CHUNK):
        w = np.empty(x.shape[1], np.float32)
        for r in range(t * _CHUNK, min(rows, (t + 1) * _CHUNK)):
            _row_f16(data[r], w)
            _rows(x, w, out, r)


@njit(parallel=True, cache=True)
def _mvb_bf16(x, data, out):
    rows = data.shape[0]
    for t in prange((rows + _CHUNK - 1) // _CHUNK):
        w = np.empty(x.shape[1], np.float32)
        for r in range(t * _CHUNK, min(rows, (t + 1) * _CHUNK)):
            _row_bf16(data[r], w)
            _rows(x, w, out, r)


# ---- block types: one pass over the stored row, per-lane sums in registers (LLVM vector code) ----
#
# A block decoder returns groups (s, [(q, off), ...]): 16-lane float vectors q of quant values that share
# the 16-lane scale vector s and meet x at element offset `off` of the block, plus `direct` terms (w, off)
# met with the 32-column sums of x (Q4_K's mins). One row of x sums q*x over a group and multiplies by s
# once; several rows of x widen each weight vector q*s once and multiply it into every row.

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
    groups = []
    for c in range(4):
        wide = [builder.zext(_vec_at(builder, blk, 16 + 32 * c + 16 * k, _I8, 16), i32x16) for k in range(2)]
        for h in range(2):
            q = [builder.uitofp(builder.and_(builder.lshr(w, ir.Constant(i32x16, [4 * h] * 16)),
                                             ir.Constant(i32x16, [15] * 16)), _V16) for w in wide]
            off = 64 * c + 32 * h
            groups.append((_lanes(builder, scf, [2 * c + h] * 16), [(q[0], off), (q[1], off + 16)]))
    return groups, [(builder.fsub(ir.Constant(v8, None), mnf), 0)]


def _w_q6_k(builder, blk):
    """Q6_K block (128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, f16 d): each 16 elements
    are a group with scale d*scale_i."""
    d = _halfs(builder, blk, 194)  # the 8 f16 ending the block: d is the last
    scales = builder.sitofp(_vec_at(builder, blk, 192, _I8, 16), _V16)
    scf = builder.fmul(scales, _lanes(builder, d, [7] * 16))
    groups = []
    for h in range(2):
        qh = _vec_at(builder, blk, 128 + 32 * h, _I8, 32)
        for g in range(4):
            ql = _vec_at(builder, blk, 64 * h + 32 * (g & 1), _I8, 32)
            lo = builder.and_(builder.lshr(ql, _i8const(4 * (g >> 1))), _i8const(15))
            hi = builder.and_(builder.lshr(qh, _i8const(2 * g)), _i8const(3))
            q = builder.sub(builder.or_(lo, builder.shl(hi, _i8const(4))), _i8const(32))
            for k, qf in enumerate(_int_lanes(builder, q, True)):
                i = 8 * h + 2 * g + k
                groups.append((_lanes(builder, scf, [i] * 16), [(qf, 16 * i)]))
    return groups, []


def _rowdot(name, weights, block_bytes, block_elems, unroll, nx):
    """Intrinsic (row, xs, x, b, k0, nb) -> the dot products of blocks k0.. k0+nb-1 of one stored row with
    the matching columns of x[b:b+nx]
    (float32, or a tuple of nx); xs holds x's 32-column sums for the direct terms. The block loop is unrolled
    `unroll` times and sums rotate over several accumulators, so no single FMA chain sets the pace."""
    slots = 4 if nx == 1 else 2

    def rowdot(typingctx, row, xs, x, b, k0, nb):
        ret = types.float32 if nx == 1 else types.UniTuple(types.float32, nx)

        def codegen(context, builder, sig, args):
            i64 = lambda v: ir.Constant(ir.IntType(64), v)  # noqa: E731
            rowp = context.make_array(sig.args[0])(context, builder, args[0]).data
            xsa = context.make_array(sig.args[1])(context, builder, args[1])
            xa = context.make_array(sig.args[2])(context, builder, args[2])
            cols = cgutils.unpack_tuple(builder, xa.shape)[1]
            scols = cgutils.unpack_tuple(builder, xsa.shape)[1]
            first = [builder.add(args[3], i64(i)) for i in range(nx)]
            xrows = [builder.gep(xa.data, [builder.mul(r, cols)]) for r in first]
            srows = [builder.gep(xsa.data, [builder.mul(r, scols)]) for r in first]
            acc = [[cgutils.alloca_once_value(builder, ir.Constant(_V16, None)) for _ in range(slots)]
                   for _ in range(nx)]
            dacc = [cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(_F32, 8), None))
                    for _ in range(nx)]
            fma = {n: cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VectorType(_F32, n), [ir.VectorType(_F32, n)] * 3),
                f"llvm.fma.v{n}f32") for n in (8, 16)}

            def mac(ptr, a, b_):
                builder.store(builder.call(fma[a.type.count], [a, b_, builder.load(ptr)]), ptr)

            def block(index, slot):
                index = builder.add(index, args[4])
                blk = builder.gep(rowp, [builder.mul(index, i64(block_bytes))])
                xo = builder.mul(index, i64(block_elems))
                so = builder.mul(index, i64(block_elems // 32))
                groups, direct = weights(builder, blk)
                xv = lambda r, off: _vec_at(builder, builder.gep(xrows[r], [xo]), off, _F32, 16)  # noqa: E731
                for s, qs in groups:
                    if nx == 1:
                        p = builder.fmul(qs[0][0], xv(0, qs[0][1]))
                        for q, off in qs[1:]:
                            p = builder.call(fma[16], [q, xv(0, off), p])
                        mac(acc[0][slot], p, s)
                    else:
                        for q, off in qs:
                            w = builder.fmul(q, s)
                            for r in range(nx):
                                mac(acc[r][slot], w, xv(r, off))
                    slot = (slot + 1) % slots
                for w, off in direct:
                    for r in range(nx):
                        mac(dacc[r], w, _vec_at(builder, builder.gep(srows[r], [so]), off, _F32, 8))
                return slot

            nb = args[5]
            main = builder.udiv(nb, i64(unroll))
            with cgutils.for_range(builder, main) as loop:
                slot = 0
                for u in range(unroll):
                    slot = block(builder.add(builder.mul(loop.index, i64(unroll)), i64(u)), slot)
            with cgutils.for_range(builder, builder.sub(nb, builder.mul(main, i64(unroll)))) as loop:
                block(builder.add(builder.mul(main, i64(unroll)), loop.index), 0)
            sums = []
            for r in range(nx):
                total = builder.load(acc[r][0])
                for a in acc[r][1:]:
                    total = builder.fadd(total, builder.load(a))
                d = builder.load(dacc[r])
                total = builder.fadd(total, builder.shuffle_vector(d, ir.Constant(d.type, None), ir.Constant(
                    ir.VectorType(_I32, 16), list(range(16)))))
                sums.append(_hsum(builder, total, 16))
            return sums[0] if nx == 1 else context.make_tuple(builder, sig.return_type, sums)
        return ret(row, xs, x, b, k0, nb), codegen
    rowdot.__name__ = rowdot.__qualname__ = name
    return intrinsic(rowdot)


_DOT = {(t, n): _rowdot(f"_dot_{t}_{n}", weights, nbytes, per, unroll, n)
        for t, weights, per, nbytes, unroll in [("q8_0", _w_q8_0, 32, 34, 4), ("q4_k", _w_q4_k, 256, 144, 1),
                                                ("q6_k", _w_q6_k, 256, 210, 1)]
        for n in (1, 4, 8)}
_dot_q8_0_1, _dot_q8_0_4, _dot_q8_0_8 = (_DOT["q8_0", n] for n in (1, 4, 8))
_dot_q4_k_1, _dot_q4_k_4, _dot_q4_k_8 = (_DOT["q4_k", n] for n in (1, 4, 8))
_dot_q6_k_1, _dot_q6_k_4, _dot_q6_k_8 = (_DOT["q6_k", n] for n in (1, 4, 8))


@njit(fastmath=_REASSOC, cache=True)
def _sums32(x):  # x float32 [B, cols] -> float32 [B, cols // 32]: sums of x over each 32 columns
    out = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    for b in range(x.shape[0]):
        for g in range(out.shape[1]):
            s = np.float32(0)
            for k in range(32):
                s += x[b, 32 * g + k]
            out[b, g] = s
    return out


_TILE = 512  # columns per pass for several rows of x: 8 rows of 512 float32 stay in L1 beside the weights
_ROWS = 32  # weight rows per parallel task for several rows of x


@njit(cache=True)
def _add(out, r, sums):  # out[:, r] += sums (a tuple of len(out))
    for b in range(out.shape[0]):
        out[b, r] += sums[b]


@njit(parallel=True, cache=True)
def _mv_q8_0(x, data, out):  # x float32 [1, 4 or 8, cols], data uint8 [rows, nb*34] -> out float32 [B, rows]
    xs = np.empty((x.shape[0], 1), np.float32)  # no direct terms
    nb, step, rows = x.shape[1] // 32, _TILE // 32, data.shape[0]
    if x.shape[0] == 1:
        for r in prange(rows):
            out[0, r] = _dot_q8_0_1(data[r], xs, x, 0, 0, nb)
        return
    out[:] = 0
    for t in prange((rows + _ROWS - 1) // _ROWS):
        for k0 in range(0, nb, step):
            for r in range(t * _ROWS, min(rows, (t + 1) * _ROWS)):
                if x.shape[0] == 4:
                    _add(out, r, _dot_q8_0_4(data[r], xs, x, 0, k0, min(step, nb - k0)))
                else:
                    _add(out, r, _dot_q8_0_8(data[r], xs, x, 0, k0, min(step, nb - k0)))


@njit(parallel=True, cache=True)
def _mv_q4_k(x, data, out):  # x float32 [1, 4 or 8, cols], data uint8 [rows, nb*144] -> out float32 [B, rows]
    xs = _sums32(x)
    nb, step, rows = x.shape[1] // 256, _TILE // 256, data.shape[0]
    if x.shape[0] == 1:
        for r in prange(rows):
            out[0, r] = _dot_q4_k_1(data[r], xs, x, 0, 0, nb)
        return
    out[:] = 0
    for t in prange((rows + _ROWS - 1) // _ROWS):
        for k0 in range(0, nb, step):
            for r in range(t * _ROWS, min(rows, (t + 1) * _ROWS)):
                if x.shape[0] == 4:
                    _add(out, r, _dot_q4_k_4(data[r], xs, x, 0, k0, min(step, nb - k0)))
                else:
                    _add(out, r, _dot_q4_k_8(data[r], xs, x, 0, k0, min(step, nb - k0)))


@njit(parallel=True, cache=True)
def _mv_q6_k(x, data, out):  # x float32 [1, 4 or 8, cols], data uint8 [rows, nb*210] -> out float32 [B, rows]
    xs = np.empty((x.shape[0], 1), np.float32)  # no direct terms
    nb, step, rows = x.shape[1] // 256, _TILE // 256, data.shape[0]
    if x.shape[0] == 1:
        for r in prange(rows):
            out[0, r] = _dot_q6_k_1(data[r], xs, x, 0, 0, nb)
        return
    out[:] = 0
    for t in prange((rows + _ROWS - 1) // _ROWS):
        for k0 in range(0, nb, step):
            for r in range(t * _ROWS, min(rows, (t + 1) * _ROWS)):
                if x.shape[0] == 4:
                    _add(out, r, _dot_q6_k_4(data[r], xs, x, 0, k0, min(step, nb - k0)))
                else:
                    _add(out, r, _dot_q6_k_8(data[r], xs, x, 0, k0, min(step, nb - k0)))


_MV1 = {"f32": _mv1_f32, "f16": _mv1_f16, "bf16": _mv1_bf16}
_MVB = {"f32": _mvb_f32, "f16": _mvb_f16, "bf16": _mvb_bf16}
_MVQ = {"q8_0": _mv_q8_0, "q4_k": _mv_q4_k, "q6_k": _mv_q6_k}
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
    n = x.shape[0]
    if n == 1 and dtype not in _MVQ:
        _MV1[dtype](x[0], data, out[0])
        return
    width = 1 if n == 1 else 4 if n <= 4 else 8  # the x heights the block kernels are built for
    kernel = _MVQ.get(dtype) or _MVB[dtype]
    # each weight vector meets every row of x: x rows split across cache lines cost ~1.6x in that loop
    if width == n and (n == 1 or x.ctypes.data % 64 == 0 and x.strides[0] % 64 == 0):
        kernel(x, data, out)
        return
    xp = _aligned_zeros(width, x.shape[1])
    xp[:n] = x
    op = np.empty((width, out.shape[1]), np.float32)
    kernel(xp, data, op)
    out[:] = op[:n]


def _aligned_zeros(n: int, cols: int) -> np.ndarray:
    """float32 zeros [n, cols] starting on a 64-byte boundary."""
    buf = np.zeros(n * cols + 16, np.float32)
    start = (-buf.ctypes.data % 64) // 4
    return buf[start:start + n * cols].reshape(n, cols)


def widen(data: np.ndarray, dtype: str, rows: int, cols: int, out: np.ndarray) -> np.ndarray:
    """out[rows, cols] = W as float32, exactly as gguf.quants.dequantize (or an exact cast) gives it."""
    data = _stored(data, dtype, rows, cols)
    _f32_rows(out, "out", cols)
    if out.shape[0] != rows:
        raise ValueError(f"out must have {rows} rows; got {out.shape[0]}")
    _WIDEN[dtype](data, out)
    return out
