"""Q8_0, Q4_K and Q6_K weights times up to 8 rows of x quantized to int8: ggml's numerics for the block types.

Each 32-column block of a row of x becomes 32 int8 with a float32 scale (d = amax/127, q = x/d rounded to
nearest, ties to even); a 32-value weight block or sub-block meets it as an integer dot product, and the
integer partial sums are scaled in float32: by dw*d for Q8_0 (f16 dw, 32 int8), by d*sc_j*dx for Q4_K's
sub-block j (4-bit quants, 0..15), whose min is then subtracted as dmin*m_j times the block's sum of x
(dx times the sum of its int8); Q6_K's quants (q + 32, 0..63) meet x unsigned, each integer sum starting
at -32 times its four x, and are scaled per 16 values. Paths, the instruction chosen when the product
compiles: on x86 "vnni" (vpdpbusd: unsigned x signed bytes summed by fours into int32; Q8_0 weights are made
unsigned by adding 128, and the accumulator starts at -128 times the sum of each four bytes of x, so no
correction follows) and "avx2" (vpmaddubsw + vpmaddwd: |w| times x with w's sign, so that pairs of products
cannot saturate int16; Q4_K's and Q6_K's quants are unsigned already); on AArch64 "dotprod" and "i8mm", both
sdot here (signed x signed bytes summed by fours: the weights' quants as stored, each sum the VNNI path's),
"i8mm" differing in the GEMM (int8/gemm.py). One 512-bit step covers two 32-value
blocks; its 16 int32 lanes (8 per block) are widened to float and accumulated with their block's scale, and
reduced once per pass as in rows_dot. The scales are the vector ports' other work, so they are made once
for the two weight rows decoded together: their f16 fields gathered as integers and converted in one
instruction, Q4_K's packed 6-bit scales decoded side by side, and Q4_K's factors d*sc_j*dx made once a block
(Q6_K's per step: a block's worth for 8 rows of x would not stay in registers).
"""
from __future__ import annotations

from functools import cache

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from nanoasr.kernels import target
from nanoasr.kernels.ir.blocks import BLOCKS
from nanoasr.kernels.ir.neon import sdot
from nanoasr.kernels.ir.quant_blocks import f16x8, scales_mins
from nanoasr.kernels.ir.rows_dot import ROWS, RowsDot
from nanoasr.kernels.ir.vector import (F32, I8, I16, I32, V16, bytes_of, concatenated, i64, lanes,
                                       load_vector, mac, pad16, pick, prefetch, splat, store_vector,
                                       unrolled_loop)
from nanoasr.kernels.jit import njit

X86_PATHS = ("vnni", "avx2")
ARM_PATHS = ("dotprod", "i8mm")
PATHS = X86_PATHS + ARM_PATHS
KINDS = ("q8_0", "q4_k", "q6_k")
I32X16 = ir.VectorType(I32, 16)


@cache
def host_path() -> str | None:
    """The integer path this CPU runs (features of numba's target: target.py): on x86_64 "vnni" with
    AVX512-VNNI and AVX512-BW, "avx2" with AVX2; on aarch64 "i8mm" with i8mm and dotprod, "dotprod" with
    dotprod; else None."""
    features = target.features()
    if target.architecture() == "aarch64":
        return ("i8mm" if features.get("i8mm") else "dotprod") if features.get("dotprod") else None
    if target.architecture() != "x86_64":
        return None
    if features.get("avx512vnni") and features.get("avx512bw"):
        return "vnni"
    return "avx2" if features.get("avx2") else None


@intrinsic
def quantize_block(typingctx, x, r, k, q, at, fours):
    """Row r's block k of 32 columns of x (float32, columns contiguous) quantized: d = amax/127, each value
    x/d (x times 1/d, 0 for an all-zero block) rounded to nearest, ties to even, into q.flat[at:at + 32]
    (int8, contiguous); fours[:8] (int32) = the sums of each four of them; returns d. One vector pass per
    block, where a scalar loop per value was a good part of the many-row products for short inputs."""
    def codegen(context, builder, sig, args):
        xa, qa, fa = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 3, 5))
        b, (r, k, at) = builder, (args[1], args[2], args[4])
        row_bytes = cgutils.unpack_tuple(b, xa.strides)[0]
        row = b.gep(b.bitcast(xa.data, ir.PointerType(I8)), [b.mul(r, row_bytes)])
        row = b.bitcast(row, ir.PointerType(F32))
        v32 = ir.VectorType(F32, 32)
        values = load_vector(b, b.gep(row, [b.mul(k, i64(32))]), 0, F32, 32)
        # |x| as integers order as the floats do, and their max reduces in a tree of vector steps (a float
        # max reduction keeps NaN's rules: a chain of scalar steps)
        magnitudes = b.call(_fn(b, "llvm.fabs.v32f32", v32, [v32]), [values])
        magnitudes = b.bitcast(magnitudes, ir.VectorType(I32, 32))
        amax = b.call(_fn(b, "llvm.vector.reduce.umax.v32i32", I32, [magnitudes.type]), [magnitudes])
        amax = b.bitcast(amax, F32)
        scale = b.fdiv(amax, ir.Constant(F32, 127.0))
        inverse = b.select(b.fcmp_ordered(">", scale, ir.Constant(F32, 0.0)),
                           b.fdiv(ir.Constant(F32, 1.0), scale), ir.Constant(F32, 0.0))
        rounded = b.call(_fn(b, "llvm.rint.v32f32", v32, [v32]), [b.fmul(values, splat(b, inverse, 32))])
        ints = b.fptosi(rounded, ir.VectorType(I32, 32))
        store_vector(b, b.gep(qa.data, [at]), 0, b.trunc(ints, ir.VectorType(I8, 32)))
        sums = None
        for i in range(4):
            part = lanes(b, ints, list(range(i, 32, 4)))
            sums = part if sums is None else b.add(sums, part)
        store_vector(b, fa.data, 0, sums)
        return scale
    return types.float32(x, r, k, q, at, fours), codegen


def _fn(builder, name, ret, params):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, params), name)


@njit(cache=True)
def quantized(x, nb):  # x float32 [n <= 8, >= 32*nb] -> q int8 [pairs, nx, 64], d f32 [pairs, nx, 2],
    # bias int32 [pairs, nx, 16], sums f32 [pairs, nx, 2] (pairs = ceil(nb/2): blocks 2p and 2p+1 of row r
    # side by side; bias: -128 times each four q; sums: d times the sum of a block's q)
    nx = 1 if x.shape[0] == 1 else 4 if x.shape[0] <= 4 else 8
    pairs = (nb + 1) // 2
    buf = np.zeros(pairs * nx * 64 + 64, np.int8)
    start = (64 - buf.ctypes.data % 64) % 64  # one pair of blocks per cache line
    q = buf[start:start + pairs * nx * 64].reshape(pairs, nx, 64)
    d = np.zeros((pairs, nx, 2), np.float32)
    bias = np.zeros((pairs, nx, 16), np.int32)
    sums = np.zeros((pairs, nx, 2), np.float32)
    fours = np.empty(8, np.int32)
    flat = q.reshape(-1)
    for r in range(x.shape[0]):
        for k in range(nb):
            p, h = k // 2, 32 * (k % 2)
            scale = quantize_block(x, r, k, flat, (p * nx + r) * 64 + h, fours)
            d[p, r, k % 2] = scale
            total = 0
            for g in range(8):  # fours of columns: one int32 lane of the VNNI product each
                bias[p, r, h // 4 + g] = -128 * fours[g]
                total += fours[g]
            sums[p, r, k % 2] = scale * np.float32(total)
    return q, d, bias, sums


@intrinsic(prefer_literal=True)
def int8_rows_dot(typingctx, kind, path, nx, data, q, d, bias, sums, nb, r0, r1, out):
    """out[:, r0:r1] = x @ W[r0:r1].T over the first nb blocks (of `kind`, in KINDS) of each row of data,
    r1 - r0 <= ROWS, for x as quantized() gives it (q, d, bias, sums); kind, path (in PATHS)
    and nx are compile-time constants."""
    literal = (isinstance(kind, types.StringLiteral) and isinstance(path, types.StringLiteral)
               and isinstance(nx, types.IntegerLiteral))
    if not literal:
        return None
    made = {"q8_0": _Int8RowsDot, "q4_k": _Q4KInt8, "q6_k": _Q6KInt8}[kind.literal_value]

    def codegen(context, builder, sig, args):
        arrays = [context.make_array(sig.args[i])(context, builder, args[i]) for i in (3, 4, 5, 6, 7, 11)]
        made(builder, kind.literal_value, path.literal_value, nx.literal_value, *arrays).emit(*args[8:11])
        return context.get_dummy_value()
    return types.none(kind, path, nx, data, q, d, bias, sums, nb, r0, r1, out), codegen


class _Int8RowsDot(RowsDot):
    """rows_dot's passes and reductions over Q8_0 rows, each step two blocks of int8 products."""

    def __init__(self, builder, kind, path, nx, data, q, d, bias, sums, out):
        super().__init__(builder, BLOCKS[kind], nx, data, q, d, out)
        self.path, self.bias, self.xsums = path, bias, sums

    def accumulate(self, ptrs, accs, k0, count, ahead):
        """accs = the rows at ptrs times x over `count` blocks from block k0 (even), two blocks a step (the
        second repeats the first past an odd count: its x is zeros with scale 0)."""
        b = self.b
        self.zero_accs(accs)

        def step(pair):
            first = b.mul(pair, i64(2))
            second = b.select(b.icmp_unsigned("<", b.add(first, i64(1)), count), b.add(first, i64(1)), first)
            at = b.add(b.udiv(k0, i64(2)), pair)
            blks = [[b.gep(w, [b.mul(b.add(k0, k), i64(34))]) for k in (first, second)] for w in ptrs]
            for pair_blks in blks:
                for line in (0, 64):  # 68 bytes a step: the same step's lines `ahead` rows on
                    prefetch(b, b.gep(pair_blks[0], [b.add(ahead, i64(line))]))
            quants = [concatenated(b, [load_vector(b, k, 2, I8, 32) for k in pair_blks])
                      for pair_blks in blks]
            scales = self.block_scales(sum(blks, []))
            self.products(quants, lambda r, dx: self.scaled(scales, dx()), accs, at)
        unrolled_loop(b, b.udiv(b.add(count, i64(1)), i64(2)), 2, step)

    def zero_accs(self, accs):
        for a in sum(accs, []):
            self.b.store(ir.Constant(a.type.pointee, None), a)

    def block_scales(self, blks):
        """<4 x float>: the f16 scales of the blocks at blks (two weight rows' block pair)."""
        return f16_fields(self.b, [(blk, 1) for blk in blks])

    def scaled(self, scales, dx):
        """The 16-lane factors of each weight row's integer sums for one row of x: dw * dx of its block pair
        (lanes 0-7 the first block, 8-15 the second); dx <2 x float> that row's block pair scales."""
        b = self.b
        both = b.fmul(scales, lanes(b, dx, [0, 1, 0, 1]))
        return [lanes(b, both, [2 * j] * 8 + [2 * j + 1] * 8) for j in range(len(scales.type) // 2)]

    def products(self, quants, factors, accs, at):
        """accs[j][r] += the int8 products of weight quants j with row r of x (block pair `at`) times
        factors(r, dx)[j], a factor per int32 lane (dx() loads the row's <2 x float> scales of the pair)."""
        b, nx = self.b, self.nx
        xq, xd, xb = (b.gep(a.data, [b.mul(at, i64(n * nx))])
                      for a, n in ((self.packed, 64), (self.sums, 2), (self.bias, 16)))
        for r in range(nx):
            xv = load_vector(b, xq, 64 * r, I8, 64)
            row_factors = factors(r, lambda: load_vector(b, xd, 2 * r, F32, 2))
            for j, (wq, factor) in enumerate(zip(quants, row_factors)):
                sums = self.integer_sums(wq, xv, lambda: load_vector(b, xb, 16 * r, I32, 16))
                mac(b, accs[j][r], b.sitofp(sums, V16), factor)

    def pair_run(self, array, first_pair, r):
        """<8 x float>: row r's two values per block pair (d: the blocks' scales; sums: d times their sums of
        q) of the four pairs from first_pair, laid out [pairs, nx, 2]."""
        b = self.b
        at = [b.gep(array.data, [b.add(b.mul(b.add(first_pair, i64(p)), i64(2 * self.nx)), i64(2 * r))])
              for p in range(4)]
        return concatenated(b, [load_vector(b, a, 0, F32, 2) for a in at])

    def integer_sums(self, wq, xv, start):
        """<16 x i32>: the sums of each four w * x (start() gives the VNNI path's x correction)."""
        if self.path in ARM_PATHS:
            return sdot(self.b, ir.Constant(I32X16, None), wq, xv)
        return self.vnni(wq, xv, start()) if self.path == "vnni" else self.avx2(wq, xv)

    def vnni(self, wq, xv, start):
        """<16 x i32>: start + the sums of each four (w + 128) * x, which is the sums of w * x."""
        return vpdpbusd(self.b, start, self.b.xor(wq, bytes_of(-128, 64)), xv)

    def avx2(self, wq, xv):
        """<16 x i32>: the sums of each four w * x, as |w| * (x with w's sign)."""
        b = self.b
        negative = b.icmp_signed("<", wq, bytes_of(0, 64))
        magnitude = b.select(negative, b.neg(wq), wq)  # -128 stays 0x80: 128 unsigned
        return pmadd_halves(b, magnitude, b.select(negative, b.neg(xv), xv))


class _Q4KInt8(_Int8RowsDot):
    """Q4_K rows: per block of 256, four steps of two sub-blocks (one run of bytes' low and high nibbles).
    The hooks scales, block_factors, step_factors, quants and integer_sums are Q6_K's too (_Q6KInt8)."""

    def accumulate(self, ptrs, accs, k0, count, ahead):
        """accs = the rows at ptrs times x over `count` blocks from block k0."""
        b = self.b
        self.zero_accs(accs)

        def step(index):
            block = b.add(k0, index)
            blks = [b.gep(w, [b.mul(block, i64(self.block.nbytes))]) for w in ptrs]
            for blk in blks:  # the same block `ahead` rows on
                for line in range(0, self.block.nbytes, 64):
                    prefetch(b, b.gep(blk, [b.add(ahead, i64(line))]))
            scales, negmins = self.scales(blks)  # the rows' side by side
            first_pair = b.mul(block, i64(4))
            factors = [self.block_factors(scales, self.pair_run(self.sums, first_pair, r), len(blks))
                       for r in range(self.nx)]
            for c in range(4):
                self.products([self.quants(blk, c) for blk in blks],
                              lambda r, _: [self.step_factors(factors[r], c, j) for j in range(len(blks))],
                              accs, b.add(first_pair, i64(c)))
            if negmins is not None:  # less dmin * m_j times each sub-block's sum of x, once a block
                zero = ir.Constant(negmins.type, None)
                for r in range(self.nx):
                    xs = pad16(b, self.pair_run(self.xsums, first_pair, r))
                    for j in range(len(blks)):
                        row_mins = pick(b, negmins, zero, list(range(8 * j, 8 * j + 8)) + [8 * len(blks)] * 8)
                        mac(b, accs[j][r], row_mins, xs)
        unrolled_loop(b, count, 1, step)

    def scales(self, blks):
        return q4_k_scales(self.b, blks)

    def block_factors(self, scales, dx, rows):
        """The weight rows' scales of each sub-block (8 lanes a row, 32 values each) times a row of x's
        scale of those 32 values (dx, <8 x float>), for step_factors."""
        return self.b.fmul(scales, lanes(self.b, dx, list(range(8)) * rows))

    def step_factors(self, factors, c, j):
        """Weight row j's factor of each of the 16 int32 lanes of step c (8 lanes, 32 values each)."""
        return lanes(self.b, factors, [8 * j + 2 * c] * 8 + [8 * j + 2 * c + 1] * 8)

    def quants(self, blk, c):
        return q4_k_quants(self.b, blk, c)

    def integer_sums(self, wq, xv, start):
        """Quants 0..15 are unsigned bytes as they are, and signed ones too: no correction, no signs."""
        if self.path in ARM_PATHS:
            return sdot(self.b, ir.Constant(I32X16, None), wq, xv)
        if self.path == "vnni":
            return vpdpbusd(self.b, ir.Constant(I32X16, None), wq, xv)
        return pmadd_halves(self.b, wq, xv)


class _Q6KInt8(_Q4KInt8):
    """Q6_K rows: quants stored as q + 32 (0..63) meet x as unsigned bytes, and each sum starts at -32 times
    the sum of its four x (a quarter of the VNNI correction); a scale per 16 values (4 lanes), no mins."""

    def scales(self, blks):
        return q6_k_scales(self.b, blks)

    def block_factors(self, scales, dx, rows):
        """Kept apart: multiplied per step (step_factors), as a block's products for 8 rows of x would
        not leave the registers to hold them all."""
        return scales, dx

    def step_factors(self, factors, c, j):
        """Weight row j's scales of the 16 values of each int32 lane of step c (4 lanes each) times dx of
        the 32 values they are in."""
        scales, dx = factors
        return self.b.fmul(lanes(self.b, scales, [16 * j + 4 * c + lane // 4 for lane in range(16)]),
                           lanes(self.b, dx, [2 * c + lane // 8 for lane in range(16)]))

    def quants(self, blk, c):
        return q6_k_quants(self.b, blk, c)

    def integer_sums(self, wq, xv, start):
        offset = self.b.ashr(start(), ir.Constant(I32X16, [2] * 16))  # -32 times each four x
        if self.path in ARM_PATHS:
            return sdot(self.b, offset, wq, xv)
        if self.path == "vnni":
            return vpdpbusd(self.b, offset, wq, xv)
        return self.b.add(pmadd_halves(self.b, wq, xv), offset)


def q4_k_scales(b, blks):
    """The Q4_K blocks at blks (n of them, one per weight row): (d * sc_j, -dmin * m_j) of each one's 8
    sub-blocks j, side by side as <8n x float>. Their packed scales are decoded together, and their f16 d and
    dmin gathered into one conversion (f16_fields)."""
    n = len(blks)
    vn = ir.VectorType(F32, 8 * n)
    sc, mn = scales_mins(b, concatenated(b, [load_vector(b, blk, 4, I8, 16) for blk in blks]))
    dm = f16_fields(b, [(blk, 2) for blk in blks])  # d, dmin of each block
    mins = b.fmul(b.uitofp(mn, vn), lanes(b, dm, [2 * (i // 8) + 1 for i in range(8 * n)]))
    return b.fmul(b.uitofp(sc, vn), lanes(b, dm, [2 * (i // 8) for i in range(8 * n)])), b.fsub(
        ir.Constant(vn, None), mins)


def f16_fields(b, fields):
    """<4 x float> of the f16 values at the start of each (pointer, count) field, counts summing to 4,
    gathered as integers into one 64-bit word and converted together (a vector insert of each, vpinsrw,
    or a whole-vector load and conversion per field would keep the vector ports busier)."""
    i64t = ir.IntType(64)
    word, shift = None, 0
    for ptr, count in fields:
        value = b.zext(b.load(b.bitcast(ptr, ir.PointerType(ir.IntType(16 * count)))), i64t)
        value = b.shl(value, ir.Constant(i64t, shift)) if shift else value
        word = b.or_(word, value) if word is not None else value
        shift += 16 * count
    vector = b.insert_element(ir.Constant(ir.VectorType(i64t, 1), None), word, ir.Constant(I32, 0))
    return b.fpext(b.bitcast(vector, ir.VectorType(ir.HalfType(), 4)), ir.VectorType(F32, 4))


def q4_k_quants(b, blk, c):
    """<64 x i8> of a Q4_K block: sub-block 2c (the low nibbles of bytes 16+32c..) then 2c+1 (their high
    nibbles), 0..15."""
    v = load_vector(b, blk, 16 + 32 * c, I8, 32)
    return b.and_(_shifted_bytes(b, pick(b, v, v, list(range(32)) * 2), [0, 4]), bytes_of(15, 64))


def q6_k_scales(b, blks):
    """The Q6_K blocks at blks (n, one per weight row): (d * scale_i of each one's 16 sub-blocks i, side by
    side as <16n x float>; None: no mins)."""
    runs = []
    for blk in blks:
        d = f16x8(b, blk, 194)  # the 8 f16 ending the block: d is the last
        runs.append(b.fmul(b.sitofp(load_vector(b, blk, 192, I8, 16), V16), lanes(b, d, [7] * 16)))
    return concatenated(b, runs), None


def q6_k_quants(b, blk, c):
    """<64 x i8> of a Q6_K block: q + 32 (0..63) of values 64c.. (half h = c // 2 of the block, its runs
    g = 2(c % 2), +1: low nibbles from 32 bytes at 64h + 32(g % 2) shifted by 4(g // 2), high pairs from bytes
    128 + 32h shifted by 2g)."""
    h = c >> 1
    qh = load_vector(b, blk, 128 + 32 * h, I8, 32)
    runs = []
    for g in (2 * (c & 1), 2 * (c & 1) + 1):
        ql = load_vector(b, blk, 64 * h + 32 * (g & 1), I8, 32)
        low = b.and_(b.lshr(ql, bytes_of(4 * (g >> 1))), bytes_of(15))
        runs.append(b.or_(low, b.shl(b.and_(b.lshr(qh, bytes_of(2 * g)), bytes_of(3)), bytes_of(4))))
    return concatenated(b, runs)


def _shifted_bytes(b, v, shifts):
    """<64 x i8> v's bytes, each half's shifted right by its bit count in `shifts` as 16-bit lanes (one
    variable shift; bits of the next byte come in at the top: the caller masks them off)."""
    wide = ir.VectorType(I16, 32)
    amounts = ir.Constant(wide, [shifts[0]] * 16 + [shifts[1]] * 16)
    return b.bitcast(b.lshr(b.bitcast(v, wide), amounts), ir.VectorType(I8, 64))


def vpdpbusd(builder, start, unsigned, signed):
    """<16 x i32>: start + the sums of each four unsigned * signed bytes (<64 x i8> each)."""
    fnty = ir.FunctionType(I32X16, [I32X16] * 3)
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpdpbusd.512")
    return builder.call(fn, [start, builder.bitcast(unsigned, I32X16), builder.bitcast(signed, I32X16)])


def pmadd_halves(builder, unsigned, signed):
    """<16 x i32>: the sums of each four unsigned * signed bytes (<64 x i8> each) as two 256-bit halves of
    vpmaddubsw (pairs into int16, saturating: the caller keeps |products| below 2^14) and vpmaddwd."""
    return pair_sums(builder, pair_products(builder, unsigned, signed))


def pair_products(builder, unsigned, signed):
    """[<16 x i16>] * 2: vpmaddubsw on each 256-bit half of two <64 x i8>: each pair of unsigned * signed
    bytes summed into int16 (saturating: the caller keeps them, and any sums of them it adds, in range)."""
    v16 = ir.VectorType(I16, 16)
    madd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [ir.VectorType(I8, 32)] * 2),
                                          "llvm.x86.avx2.pmadd.ub.sw")
    return [builder.call(madd, [lanes(builder, v, range(32 * h, 32 * h + 32)) for v in (unsigned, signed)])
            for h in range(2)]


def pair_sums(builder, halves):
    """<16 x i32>: vpmaddwd of each <16 x i16> half with ones (each two int16 summed into int32), joined."""
    v16 = ir.VectorType(I16, 16)
    widen = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VectorType(I32, 8), [v16] * 2),
                                           "llvm.x86.avx2.pmadd.wd")
    return concatenated(builder, [builder.call(widen, [h, ir.Constant(v16, [1] * 16)]) for h in halves])


def _driver(kind: str, path: str):
    """The product on `path`: x float32 [n <= 8, >= nb*size] @ W.T -> out float32 [n, rows], W `kind` data
    of nb whole blocks per row."""
    per = BLOCKS[kind].size // 32

    def matvec(x, data, nb, out):
        q, d, bias, sums = quantized(x, nb * per)
        for t in prange((data.shape[0] + ROWS - 1) // ROWS):
            r0, r1 = t * ROWS, min(data.shape[0], (t + 1) * ROWS)
            if q.shape[1] == 1:
                int8_rows_dot(kind, path, 1, data, q, d, bias, sums, nb, r0, r1, out)
            elif q.shape[1] == 4:
                int8_rows_dot(kind, path, 4, data, q, d, bias, sums, nb, r0, r1, out)
            else:
                int8_rows_dot(kind, path, 8, data, q, d, bias, sums, nb, r0, r1, out)
    matvec.__name__ = matvec.__qualname__ = f"matvec_{kind}_int8_{path}"
    return njit(parallel=True, cache=True)(matvec)


MATVEC_INT8 = {(kind, path): _driver(kind, path) for kind in KINDS for path in PATHS}
