"""CUDA kernels over weights in their stored type: x @ W.T for a few rows of x, and widening to float32.

The entry points take device arrays (CuPy's or numba's; under numba's CUDA simulator, its device arrays),
check them, and launch one kernel per call (per MAX_X_ROWS rows of x for matvec) on the stream given (numba's
handle; 0: the default stream) without reading anything back to the host or waiting for the device: an array
of another library (CuPy) is taken as it is, without synchronising the stream it names, so the caller launches
on the stream that produced it (or after it). Stored layouts are
nanoasr.tensor.StoredTensor's: f32 / f16 arrays of the logical shape, bf16 as its uint16 bits, q8_0 / q4_k /
q6_k as uint8 blocks [rows, row_bytes]. The numpy twins are nanoasr.quant.reference.dequantize and a matmul.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from nanoasr.kernels.cuda.kernels import MATVEC, MAX_X_ROWS, THREADS, WIDEN
from nanoasr.storage import BLOCK_TYPES, STORED_NUMPY as STORED

MAX_BLOCKS = 4096  # grid size limit: the kernels stride over the rest


def matvec(x, w, dtype: str, shape: tuple[int, int], out, stream=0):
    """out[B, rows] = x[B, cols] @ W.T for W of logical `shape` (rows, cols) stored as `w` in `dtype`, read in
    place; one pass over W per MAX_X_ROWS rows of x. Returns out."""
    rows, cols = shape
    w, scales = _stored(w, dtype, rows, cols)
    _f32_rows(x, "x", cols)
    _f32_rows(out, "out", rows)
    if out.shape[0] != x.shape[0]:
        raise ValueError(f"out must have {x.shape[0]} rows like x; got {out.shape[0]}")
    launch = MATVEC[dtype][min(rows, MAX_BLOCKS), THREADS, stream]
    w, scales = _unsynced(w), _unsynced(scales)
    for b in range(0, x.shape[0], MAX_X_ROWS):
        launch(_unsynced(x[b:b + MAX_X_ROWS]), w, scales, _unsynced(out[b:b + MAX_X_ROWS]))
    return out


def widen(w, dtype: str, shape: tuple[int, int], out, stream=0):
    """out[rows, cols] = W as float32, bit for bit as nanoasr.quant.reference.dequantize gives it (NaN stays
    NaN). Returns out."""
    rows, cols = shape
    w, scales = _stored(w, dtype, rows, cols)
    _f32_rows(out, "out", cols)
    if out.shape[0] != rows:
        raise ValueError(f"out must have {rows} rows; got {out.shape[0]}")
    blocks = min(-(-rows * cols // THREADS), MAX_BLOCKS)
    WIDEN[dtype][blocks, THREADS, stream](_unsynced(w), _unsynced(scales), _unsynced(out))
    return out


def _stored(w, dtype: str, rows: int, cols: int):
    """(w, its bytes as float16: the block scales) checked against (dtype, rows, cols)."""
    if dtype not in STORED:
        raise ValueError(f"storage type must be one of {', '.join(STORED)}; got {dtype!r}")
    if rows < 1 or cols < 1:
        raise ValueError(f"a stored matrix needs at least one row and column; got shape {[rows, cols]}")
    shape = (rows, cols)
    if dtype in BLOCK_TYPES:
        per, nbytes = BLOCK_TYPES[dtype]
        if cols % per:
            raise ValueError(f"{dtype} row length must be a multiple of {per}; got {cols}")
        shape = (rows, cols // per * nbytes)
    _on_device(w, f"{dtype} data")
    if np.dtype(w.dtype) != STORED[dtype] or tuple(w.shape) != shape or not _c_contiguous(w):
        raise ValueError(f"{dtype} data of a [{rows}, {cols}] tensor must be C-contiguous "
                         f"{np.dtype(STORED[dtype])} {list(shape)}; got {np.dtype(w.dtype)} {list(w.shape)} "
                         f"with strides {tuple(w.strides)}")
    return w, (w.view(np.float16) if dtype in BLOCK_TYPES else w)


def _f32_rows(a, what: str, cols: int) -> None:
    _on_device(a, what)
    if np.dtype(a.dtype) != np.float32 or len(a.shape) != 2 or a.shape[1] != cols or not _c_contiguous(a):
        raise ValueError(f"{what} must be C-contiguous float32 [n, {cols}]; got {np.dtype(a.dtype)} "
                         f"{list(a.shape)} with strides {tuple(a.strides)}")


def _on_device(a, what: str) -> None:
    """Device arrays only: numba would copy a host array over and back at every launch."""
    if not (hasattr(a, "__cuda_array_interface__") or getattr(a, "__cuda_ndarray__", False)):
        raise TypeError(f"{what} must be a device array (CuPy or numba.cuda); got {type(a).__name__}")


def _unsynced(a):
    """numba's view of a device array. numba's own pass as they are; another library's array becomes a view
    that does not synchronise the stream it names (numba would, at every launch, by default), since the
    kernel is launched in order on the caller's stream."""
    if getattr(a, "__cuda_ndarray__", False) or getattr(a, "__cuda_memory__", False):
        return a
    return cuda.as_cuda_array(a, sync=False)


def _c_contiguous(a) -> bool:
    return tuple(a.strides) == (a.shape[1] * np.dtype(a.dtype).itemsize, np.dtype(a.dtype).itemsize)
