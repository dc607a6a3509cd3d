"""Q8_0 weights times up to 8 rows of x quantized to int8: ggml's numerics for the block types.

Each 32-column block of a row of x becomes 32 int8 with a float32 scale (d = amax/127, q = x/d rounded to
nearest, ties to even); a weight block (f16 dw, 32 int8) meets it as an integer dot product, and the integer
partial sums are scaled by dw*d in float32. Two paths, the instruction chosen when the product compiles:
"vnni" (vpdpbusd: unsigned x signed bytes summed by fours into int32; the weights are made unsigned by adding
128, and the accumulator starts at -128 times the sum of each four bytes of x, so no correction follows) and
"avx2" (vpmaddubsw + vpmaddwd: |w| times x with w's sign, so that pairs of products cannot saturate int16).
One 512-bit step covers two weight blocks; its 16 int32 lanes (8 per block) are widened to float and
accumulated with their block's scale, and reduced once per pass as in rows_dot.
"""
from __future__ import annotations

from functools import cache

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from nanoasr.kernels.blocks import BLOCKS
from nanoasr.kernels.quant_blocks import _f16x8
from nanoasr.kernels.rows_dot import ROWS, _RowsDot
from nanoasr.kernels.vector_ir import (F32, I8, I16, I32, V16, bytes_of, i64, lanes, load_vector, mac, pick,
                                       prefetch, unrolled_loop)

PATHS = ("vnni", "avx2")
I32X16 = ir.VectorType(I32, 16)


@cache
def host_path() -> str | None:
    """The integer path this CPU runs: "vnni" with AVX512-VNNI and AVX512-BW, "avx2" with AVX2, else None."""
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features()
    if features.get("avx512vnni") and features.get("avx512bw"):
        return "vnni"
    return "avx2" if features.get("avx2") else None


@njit(cache=True)
def _quantized(x, nb):  # x float32 [n <= 8, >= 32*nb] -> q int8 [pairs, nx, 64], d f32 [pairs, nx, 2],
    # bias int32 [pairs, nx, 16] (pairs = ceil(nb/2): blocks 2p and 2p+1 of row r side by side)
    nx = 1 if x.shape[0] == 1 else 4 if x.shape[0] <= 4 else 8
    pairs = (nb + 1) // 2
    buf = np.zeros(pairs * nx * 64 + 64, np.int8)
    start = (64 - buf.ctypes.data % 64) % 64  # one pair of blocks per cache line
    q = buf[start:start + pairs * nx * 64].reshape(pairs, nx, 64)
    d = np.zeros((pairs, nx, 2), np.float32)
    bias = np.zeros((pairs, nx, 16), np.int32)
    for r in range(x.shape[0]):
        for k in range(nb):
            amax = np.float32(0)
            for i in range(32):
                amax = max(amax, abs(x[r, 32 * k + i]))
            scale = amax / np.float32(127)
            inverse = np.float32(1) / scale if scale > 0 else np.float32(0)
            p, h = k // 2, 32 * (k % 2)
            d[p, r, k % 2] = scale
            for i in range(32):
                v = np.int32(np.rint(x[r, 32 * k + i] * inverse))
                q[p, r, h + i] = v
                bias[p, r, (h + i) // 4] -= 128 * v
    return q, d, bias


@intrinsic(prefer_literal=True)
def int8_rows_dot(typingctx, path, nx, data, q, d, bias, nb, r0, r1, out):
    """out[:, r0:r1] = x @ W[r0:r1].T over the first nb Q8_0 blocks of each row of data, r1 - r0 <= ROWS, for
    x quantized as _quantized gives it (q, d, bias); path ("vnni" | "avx2") and nx are compile-time
    constants."""
    if not isinstance(path, types.StringLiteral) or not isinstance(nx, types.IntegerLiteral):
        return None

    def codegen(context, builder, sig, args):
        arrays = [context.make_array(sig.args[i])(context, builder, args[i]) for i in (2, 3, 4, 5, 9)]
        _Int8RowsDot(builder, path.literal_value, nx.literal_value, *arrays).emit(*args[6:9])
        return context.get_dummy_value()
    return types.none(path, nx, data, q, d, bias, nb, r0, r1, out), codegen


class _Int8RowsDot(_RowsDot):
    """rows_dot's passes and reductions over Q8_0 rows, each step two blocks of int8 products."""

    def __init__(self, builder, path, nx, data, q, d, bias, out):
        super().__init__(builder, BLOCKS["q8_0"], nx, data, q, d, out)
        self.path, self.bias = path, bias

    def accumulate(self, ptrs, accs, k0, count, ahead):
        """accs = the rows at ptrs times x over `count` blocks from block k0 (even), two blocks a step (the
        second repeats the first past an odd count: its x is zeros with scale 0)."""
        b = self.b
        for a in sum(accs, []):
            b.store(ir.Constant(a.type.pointee, None), a)

        def step(pair):
            first = b.mul(pair, i64(2))
            second = b.select(b.icmp_unsigned("<", b.add(first, i64(1)), count), b.add(first, i64(1)), first)
            at = b.add(b.udiv(k0, i64(2)), pair)
            blocks = []
            for w in ptrs:
                blks = [b.gep(w, [b.mul(b.add(k0, k), i64(34))]) for k in (first, second)]
                for line in (0, 64):  # 68 bytes a step: the lines of the same step two row pairs on
                    prefetch(b, b.gep(blks[0], [b.add(ahead, i64(line))]))
                blocks.append(self.load_blocks(blks))
            self.products(blocks, accs, at)
        unrolled_loop(b, b.udiv(b.add(count, i64(1)), i64(2)), 2, step)

    def load_blocks(self, blks):
        """(<64 x i8> quants, <16 x float> scales) of two Q8_0 blocks, each scale over its block's 8 lanes."""
        b = self.b
        quants = pick(b, *(load_vector(b, k, 2, I8, 32) for k in blks), list(range(64)))
        scales = pick(b, *(_f16x8(b, k, 0) for k in blks), [0] * 8 + [8] * 8)
        return quants, scales

    def products(self, blocks, accs, at):
        """accs[j][r] += the int8 products of weight blocks j with row r of x, scaled (block pair `at`)."""
        b, nx = self.b, self.nx
        xq = b.gep(self.packed.data, [b.mul(at, i64(64 * nx))])
        xd = b.gep(self.sums.data, [b.mul(at, i64(2 * nx))])
        xb = b.gep(self.bias.data, [b.mul(at, i64(16 * nx))])
        for r in range(nx):
            xv = load_vector(b, xq, 64 * r, I8, 64)
            dx = lanes(b, load_vector(b, xd, 2 * r, F32, 2), [0] * 8 + [1] * 8)
            for j, (wq, dw) in enumerate(blocks):
                sums = self.vnni(wq, xv, load_vector(b, xb, 16 * r, I32, 16)) if self.path == "vnni" \
                    else self.avx2(wq, xv)
                mac(b, accs[j][r], b.sitofp(sums, V16), b.fmul(dw, dx))

    def vnni(self, wq, xv, start):
        """<16 x i32>: start + the sums of each four (w + 128) * x, which is the sums of w * x."""
        b = self.b
        fnty = ir.FunctionType(I32X16, [I32X16] * 3)
        fn = cgutils.get_or_insert_function(b.module, fnty, "llvm.x86.avx512.vpdpbusd.512")
        unsigned = b.xor(wq, bytes_of(-128, 64))
        return b.call(fn, [start, b.bitcast(unsigned, I32X16), b.bitcast(xv, I32X16)])

    def avx2(self, wq, xv):
        """<16 x i32>: the sums of each four w * x, as |w| * (x with w's sign) in two 256-bit halves."""
        b = self.b
        v16 = ir.VectorType(I16, 16)
        madd = cgutils.get_or_insert_function(b.module, ir.FunctionType(v16, [ir.VectorType(I8, 32)] * 2),
                                              "llvm.x86.avx2.pmadd.ub.sw")
        widen = cgutils.get_or_insert_function(b.module, ir.FunctionType(ir.VectorType(I32, 8), [v16] * 2),
                                               "llvm.x86.avx2.pmadd.wd")
        ones = ir.Constant(v16, [1] * 16)
        halves = []
        for h in range(2):
            w, x = (lanes(b, v, range(32 * h, 32 * h + 32)) for v in (wq, xv))
            negative = b.icmp_signed("<", w, bytes_of(0))
            magnitude = b.select(negative, b.neg(w), w)  # -128 stays 0x80: 128 unsigned
            signed = b.select(negative, b.neg(x), x)
            halves.append(b.call(widen, [b.call(madd, [magnitude, signed]), ones]))
        return pick(b, *halves, list(range(16)))


def _driver(path: str):
    """The product on `path`: x float32 [n <= 8, >= 32*nb] @ W.T -> out float32 [n, rows], W Q8_0 data."""
    def matvec(x, data, nb, out):
        q, d, bias = _quantized(x, nb)
        for t in prange((data.shape[0] + ROWS - 1) // ROWS):
            r0, r1 = t * ROWS, min(data.shape[0], (t + 1) * ROWS)
            if q.shape[1] == 1:
                int8_rows_dot(path, 1, data, q, d, bias, nb, r0, r1, out)
            elif q.shape[1] == 4:
                int8_rows_dot(path, 4, data, q, d, bias, nb, r0, r1, out)
            else:
                int8_rows_dot(path, 8, data, q, d, bias, nb, r0, r1, out)
    matvec.__name__ = matvec.__qualname__ = f"matvec_q8_0_int8_{path}"
    return njit(parallel=True, cache=True)(matvec)


MATVEC_INT8 = {path: _driver(path) for path in PATHS}
