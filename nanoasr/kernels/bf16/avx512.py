"""Many rows rounded to bf16 times a BF16 matrix (a stored one, or attention's keys and values, rounded) with
AVX512-BF16 (vdpbf16ps), float32 sums: out = bf16(x) @ W.T over the last two axes of [B, H, ...] operands,
the AMX tiles' product (amx.py) for CPUs that have the instruction and no tiles (AMD Zen 4 and later, Intel
Cooper Lake), without widening W to float32 for BLAS.

x is rounded to bf16 and W padded as the tiles take them (amx.bf16_rows, amx.weight_rows: rows and columns
up to multiples of 32, zeros there). Each task packs a panel of 32 rows of one of the stacked W: per 32
columns and group of 16 rows, 16 lines of 64 bytes, line p holding columns 2p and 2p + 1 of each of the 16
rows (a transpose of the 16 rows' words in registers). A kernel call takes 8 rows of x against the panel:
per pair of columns, each row's pair of bf16 broadcast meets the two groups' lines in one vdpbf16ps each (16
float32 sums, each adding the two products), 16 accumulators of 16 lanes in all. The numpy twin is
nanoasr.backend.xp.products_xp (BLAS on the rounded operands).

LLVM takes the instruction's operands as vectors of bfloat, a type llvmlite's IR builder lacks:
_bf16_pairs names it.
"""
from __future__ import annotations

import platform
from functools import cache

import numpy as np
from llvmlite import ir
from llvmlite.ir import types as ir_types
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from nanoasr.kernels import target
from nanoasr.kernels.bf16 import amx
from nanoasr.kernels.ir.vector import (I8, I32, V16, i64, load_vector, prefetch, splat, store_rows,
                                       store_vector, transposed)
from nanoasr.kernels.jit import njit

PANEL = 32  # weight rows a task packs: two groups of 16
X_ROWS = 8  # rows of x per kernel call: 16 accumulators of the 32 AVX-512 registers
COLS = 32  # columns per packed block: a line of 64 bytes per row


@cache
def available() -> bool:
    """Whether numba's target (target.py) has AVX512-BF16 (and AVX512-BW) on x86_64, and numba's LLVM takes
    vdpbf16ps's operands as bfloat vectors, as LLVM 22 does (older releases took integer vectors; 17 is
    taken as the first with bfloat, untried here)."""
    import llvmlite.binding as llvm

    features = target.features()
    return (platform.machine() == "x86_64" and bool(features.get("avx512bf16") and features.get("avx512bw"))
            and llvm.llvm_version_info >= (17,))


@cache
def _bf16_pairs() -> ir.VectorType:
    """<32 x bfloat>, in LLVM's bfloat type, which llvmlite's IR builder lacks: made as its own float types
    are (one instance)."""
    class BFloat(ir_types._BaseFloatType):
        null = "0.0"
        intrinsic_name = "bf16"

        def __str__(self):
            return "bfloat"

    BFloat._create_instance()
    return ir.VectorType(BFloat(), 32)


def _dot_pairs(builder, acc, w, x):
    """<16 x float>: acc + each lane's two bf16 products of w and x (<16 x i32> of bf16 pairs each)."""
    pairs = _bf16_pairs()
    fnty = ir.FunctionType(V16, [V16, pairs, pairs])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512bf16.dpbf16ps.512")
    return builder.call(fn, [acc, builder.bitcast(w, pairs), builder.bitcast(x, pairs)])


@intrinsic
def _pack_panel(typingctx, w, r0, packed):
    """packed uint32 [kb, 2, 16, 16] = rows r0.. r0 + 31 of w (bf16 bits uint16 [n', 32kb], rows contiguous)
    as the kernel reads them (module docstring)."""
    def codegen(context, builder, sig, args):
        wa, pa = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 2))
        b, r0 = builder, args[1]
        stride = cgutils.unpack_tuple(b, wa.strides)[0]
        kb = b.udiv(cgutils.unpack_tuple(b, wa.shape)[1], i64(COLS))
        base, words = b.bitcast(wa.data, ir.PointerType(I8)), b.bitcast(pa.data, ir.PointerType(I32))
        rows = [b.gep(base, [b.mul(b.add(r0, i64(j)), stride)]) for j in range(PANEL)]
        with cgutils.for_range(b, kb) as loop:
            k = loop.index
            for group in range(2):
                lines = []
                for row in rows[16 * group:16 * group + 16]:
                    at = b.gep(row, [b.mul(k, i64(2 * COLS))])
                    prefetch(b, b.gep(at, [i64(1024)]))  # the row's block 16 ahead
                    lines.append(load_vector(b, at, 0, I32, 16))
                first = b.mul(b.add(b.mul(k, i64(2)), i64(group)), i64(16 * 16))
                for p, line in enumerate(transposed(b, lines)):
                    store_vector(b, b.gep(words, [first]), 16 * p, line)
        return context.get_dummy_value()
    return types.none(w, r0, packed), codegen


@intrinsic
def _rows_times_panel(typingctx, packed, xbits, x0, out, col0):
    """out[x0.. x0 + 7, col0.. col0 + 31] (the rows and columns out has) = rows x0.. of xbits (bf16 bits
    uint16 [m', 32kb], rows contiguous, m' >= x0 + 8) times the packed panel."""
    def codegen(context, builder, sig, args):
        pa, xa, oa = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 1, 3))
        b, x0, col0 = builder, args[2], args[4]
        kb = cgutils.unpack_tuple(b, pa.shape)[0]
        words = b.bitcast(pa.data, ir.PointerType(I32))
        stride = cgutils.unpack_tuple(b, xa.strides)[0]
        base = b.bitcast(xa.data, ir.PointerType(I8))
        xrows = [b.gep(base, [b.mul(b.add(x0, i64(r)), stride)]) for r in range(X_ROWS)]
        acc = [[cgutils.alloca_once_value(b, ir.Constant(V16, None)) for _ in range(2)]
               for _ in range(X_ROWS)]
        with cgutils.for_range(b, kb) as loop:
            k = loop.index
            sums = [[b.load(a) for a in row] for row in acc]
            for p in range(16):
                w = [load_vector(b, b.gep(words, [b.mul(b.add(b.mul(k, i64(2)), i64(c)), i64(256))]), 16 * p,
                                 I32, 16) for c in range(2)]
                for r, xrow in enumerate(xrows):
                    pair = b.load(b.bitcast(b.gep(xrow, [b.add(b.mul(k, i64(2 * COLS)), i64(4 * p))]),
                                            ir.PointerType(I32)))
                    pair.align = 2
                    xs = splat(b, pair)
                    sums[r] = [_dot_pairs(b, s, wc, xs) for s, wc in zip(sums[r], w)]
            for row, row_sums in zip(acc, sums):
                for a, s in zip(row, row_sums):
                    b.store(s, a)
        store_rows(b, oa, acc, x0, col0)
        return context.get_dummy_value()
    return types.none(packed, xbits, x0, out, col0), codegen


@njit(parallel=True, cache=True)
def _products(xbits, w, out):  # xbits [B, H, m', K'], w [B, H, n', K'] bf16 bits (multiples of 32, rows
    # C-contiguous) -> float32 [B, H, m, n]; a task per panel of each stacked matrix
    batch, heads = out.shape[:2]
    kb, panels = w.shape[3] // COLS, w.shape[2] // PANEL
    for task in prange(batch * heads * panels):
        b, h, t = task // (heads * panels), task // panels % heads, task % panels
        packed = np.empty((kb, 2, 16, 16), np.uint32)
        _pack_panel(w[b, h], t * PANEL, packed)
        for x0 in range(0, out.shape[2], X_ROWS):
            _rows_times_panel(packed, xbits[b, h], x0, out[b, h], t * PANEL)


def products(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[..., m, n] = bf16(x) @ W.T over the last two axes with float32 sums, for operands as amx.products
    takes them (amx.operands: W from amx.weight_rows or amx.bf16_rows); needs available()."""
    x4, w4, o4 = amx.operands(x, w, out, "bf16 GEMM products")
    if not available():
        raise RuntimeError("this CPU (or numba's target) has no AVX512-BF16")
    _products(amx.bf16_rows(x4), w4, o4)
    return out
