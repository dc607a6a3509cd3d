"""Numba CPU kernels over weights in their stored type: x @ W.T for a few rows of x, x quantized to int8
against block-quantized W for any number of rows, and widening to float32.

The entry points here check their arguments and call one driver per storage type: float_rows.py (float32
rows, the inner loop in ir/rows_dot.py), nanoasr.kernels.int8 (int8 rows: dot.py, gemm.py) and widening.py,
over the block layouts of ir/blocks.py, written as LLVM vector code with ir/vector.py. Importing this package
compiles nothing; each driver compiles on its first call and is cached on disk (cache=True).
"""
from __future__ import annotations

import numpy as np

from nanoasr.kernels.int8.dot import KINDS as MATVEC_INT8_KINDS
from nanoasr.kernels.int8.dot import MATVEC_INT8
from nanoasr.kernels.int8.gemm import GEMM_INT8
from nanoasr.kernels.ir.blocks import BLOCKS
from nanoasr.kernels.stored.float_rows import MATVEC
from nanoasr.kernels.stored.widening import WIDEN
from nanoasr.storage import STORED_NUMPY

QK = {kind: (BLOCKS[kind].size, BLOCKS[kind].nbytes) for kind in ("q8_0", "q4_k", "q6_k")}  # values, bytes
_STORED = STORED_NUMPY  # the data each storage type's kernels read


def stored_data(data: np.ndarray, dtype: str, rows: int, cols: int) -> np.ndarray:
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


def _product_operands(x, data, dtype, rows, cols, out) -> np.ndarray:
    """The stored blocks as [rows, row bytes], once x [B, cols] and out [B, rows] are checked."""
    data = stored_data(data, dtype, rows, cols)
    _f32_rows(x, "x", cols)
    _f32_rows(out, "out", rows)
    if out.shape[0] != x.shape[0]:
        raise ValueError(f"out must have {x.shape[0]} rows like x; got {out.shape[0]}")
    return data


def matvec(x: np.ndarray, data: np.ndarray, dtype: str, rows: int, cols: int, out: np.ndarray) -> np.ndarray:
    """out[B, rows] = x[B, cols] @ W.T for W stored as `data` in `dtype`, read in place (one pass over W
    for every 8 rows of x; B is meant to be small, as in batched decoding)."""
    data = _product_operands(x, data, dtype, rows, cols, out)
    for b in range(0, x.shape[0], 8):
        _product(x[b:b + 8], data, dtype, out[b:b + 8])
    return out


def matvec_int8(x: np.ndarray, data: np.ndarray, dtype: str, rows: int, cols: int, out: np.ndarray,
                path: str) -> np.ndarray:
    """out[B, rows] = x[B, cols] @ W.T for W stored as `data` in `dtype` (q8_0, q4_k, q6_k), x quantized per
    32-column block to int8 (int8/dot.py; path one of int8.dot.PATHS, see int8.dot.host_path)."""
    if dtype not in MATVEC_INT8_KINDS:
        raise ValueError(f"int8 activations need q8_0, q4_k or q6_k weights; got {dtype!r}")
    data = _product_operands(x, data, dtype, rows, cols, out)
    for b in range(0, x.shape[0], 8):
        MATVEC_INT8[dtype, path](x[b:b + 8], data, cols // BLOCKS[dtype].size, out[b:b + 8])
    return out


def gemm_int8(x: np.ndarray, data: np.ndarray, dtype: str, rows: int, cols: int, out: np.ndarray,
              path: str) -> np.ndarray:
    """out[B, rows] = x[B, cols] @ W.T for W in `dtype` (q8_0, q4_k, q6_k), x quantized per 32-column block to
    int8 as matvec_int8 quantizes it, for many rows of x: the weights packed once for all of them
    (int8/gemm.py; path one of int8.dot.PATHS: the same bits on each)."""
    if dtype not in MATVEC_INT8_KINDS:
        raise ValueError(f"int8 activations need q8_0, q4_k or q6_k weights; got {dtype!r}")
    data = _product_operands(x, data, dtype, rows, cols, out)
    GEMM_INT8[dtype, path](x, data, cols // BLOCKS[dtype].size, out)
    return out


def _product(x, data, dtype, out):  # x [n <= 8, cols] -> out [n, rows]
    nb = x.shape[1] // BLOCKS[dtype].size
    MATVEC[dtype](x, data, nb, out)
    done = nb * BLOCKS[dtype].size
    if done < x.shape[1]:  # dense rows: the columns past the last whole block of 32, one row at a time, so
        # that each row has the bits it has alone (BLAS sums a many-row product in another order)
        tail = _dense_float(data[:, done:], dtype).T
        for r in range(x.shape[0]):
            out[r:r + 1] += x[r:r + 1, done:] @ tail


def _dense_float(data: np.ndarray, dtype: str) -> np.ndarray:
    """Dense stored values (f16 as uint16 bits) as float32, exactly."""
    if dtype == "f16":
        return data.view(np.float16).astype(np.float32)
    if dtype == "bf16":
        return (data.astype(np.uint32) << 16).view(np.float32)
    return data


def widen(data: np.ndarray, dtype: str, rows: int, cols: int, out: np.ndarray) -> np.ndarray:
    """out[rows, cols] = W as float32, exactly as gguf.quants.dequantize (or an exact cast) gives it."""
    data = stored_data(data, dtype, rows, cols)
    _f32_rows(out, "out", cols)
    if out.shape[0] != rows:
        raise ValueError(f"out must have {rows} rows; got {out.shape[0]}")
    nb = cols // BLOCKS[dtype].size
    WIDEN[dtype](data, nb, out)
    done = nb * BLOCKS[dtype].size
    if done < cols:  # dense rows: the columns past the last whole block of 32
        out[:, done:] = _dense_float(data[:, done:], dtype)
    return out
