"""Stored weights widened to float32, one driver per storage type, exactly as gguf.quants.dequantize does.

The block decoders are the product's (ir/blocks.py): a value is q * s, less the block's min where it has mins
(multiply, then subtract: as gguf). Serial on purpose: widening feeds a BLAS GEMM right after, and a numba
parallel region between GEMMs leaves its threads spinning on the cores BLAS needs (measured: the encoder took
4x as long). One thread widens a layer's matrix in well under a millisecond. The drivers are built and cached
as float_rows.py's are.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from nanoasr.kernels.ir.blocks import BLOCKS
from nanoasr.kernels.ir.vector import I8, i64, lanes, store_vector
from nanoasr.kernels.jit import njit


@intrinsic(prefer_literal=True)
def _widen_block(typingctx, kind, data, row, index, out):
    """out[row, index*size:(index+1)*size] = block `index` of stored row `row` as float32 (W stored as `kind`,
    a compile-time constant)."""
    if not isinstance(kind, types.StringLiteral):
        return None
    block = BLOCKS[kind.literal_value]

    def codegen(context, builder, sig, args):
        da, oa = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (1, 4))
        row, index = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (2, 3))
        stride = cgutils.unpack_tuple(builder, da.strides)[0]
        cols = cgutils.unpack_tuple(builder, oa.shape)[1]
        blk = builder.gep(builder.bitcast(da.data, ir.PointerType(I8)),
                          [builder.add(builder.mul(row, stride), builder.mul(index, i64(block.nbytes)))])
        dst = builder.gep(oa.data, [builder.add(builder.mul(row, cols), builder.mul(index, i64(block.size)))])
        groups, mins = block.decode(builder, blk)
        for scale, qs in groups:
            for q, off in qs:
                v = q if scale is None else builder.fmul(q, scale)
                if mins is not None:  # one min per 32 values
                    v = builder.fsub(v, lanes(builder, mins, [off // 32] * 16))
                store_vector(builder, dst, off, v)
        return context.get_dummy_value()
    return types.none(kind, data, row, index, out), codegen


def _driver(kind: str):
    """Widening for `kind`: data [rows, ...] of nb whole blocks per row -> out float32 C-contiguous [rows, >=
    nb*size], its first nb*size columns written."""
    def widen(data, nb, out):
        for r in range(data.shape[0]):
            for b in range(nb):
                _widen_block(kind, data, r, b, out)
    widen.__name__ = widen.__qualname__ = f"widen_{kind}"
    return njit(cache=True)(widen)


WIDEN = {kind: _driver(kind) for kind in BLOCKS}
