"""AArch64's integer dot-product instructions for the int8 products (llvmlite IR, emitted inside numba
intrinsics): sdot (the dotprod feature, Armv8.2-A and later) and smmla (i8mm, Armv8.6-A). Both multiply
signed bytes by signed bytes into int32 sums, exactly; the callers lay their operands out so that the int32
lanes are the x86 paths' (int8/dot.py's sums of each four, int8/gemm.py's sums per weight row).
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from nanoasr.kernels.ir.vector import I8, I32, concatenated, lanes

I8X16 = ir.VectorType(I8, 16)
I32X4 = ir.VectorType(I32, 4)


def _declared(builder, name):
    fnty = ir.FunctionType(I32X4, [I32X4, I8X16, I8X16])
    return cgutils.get_or_insert_function(builder.module, fnty, name)


def sdot(builder, start, a, b):
    """<4n x i32>: start + the sums of each four a * b (<16n x i8> each, signed), one sdot per 16 bytes."""
    fn = _declared(builder, "llvm.aarch64.neon.sdot.v4i32.v16i8")
    n = a.type.count // 16
    parts = [builder.call(fn, [lanes(builder, start, range(4 * i, 4 * i + 4)),
                               lanes(builder, a, range(16 * i, 16 * i + 16)),
                               lanes(builder, b, range(16 * i, 16 * i + 16))]) for i in range(n)]
    return concatenated(builder, parts)


def smmla(builder, acc, rows, cols):
    """<4 x i32>: acc + the 2 x 2 products of two rows of 8 signed bytes (rows, <16 x i8>: the first row's 8
    then the second's) with two other such rows (cols): lanes (row 0, col 0), (0, 1), (1, 0), (1, 1)."""
    return builder.call(_declared(builder, "llvm.aarch64.neon.smmla.v4i32.v16i8"), [acc, rows, cols])
