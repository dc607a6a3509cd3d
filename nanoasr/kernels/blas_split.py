"""Large float32 products on numba's threads, each calling BLAS on its share: attention's (a @ b.T over
stacks of heads) by heads, a weight matrix's (x @ W.T, as the float32 path's encoder and prefill run them) by
runs of W's rows.

Where numba's threads run the large products (backend.host.threads with numba_products), BLAS is kept to
the calling thread: its own threads would spin on the cores numba's threads need, and numba's idle threads
spin on the cores BLAS's would need (Python threads calling BLAS between numba's products ran no faster than
one). Here the threads that run are numba's: a parallel region hands each a run of heads, and each leaves
compiled code (numba's object mode) to run that run's GEMMs with numpy's matmul, which lets the GIL go
around BLAS. The region itself runs without the GIL, so the thread that starts it never holds it while
another waits for it. Every head's product is the same BLAS call as in one stacked call on one thread: the
same bits as BLAS kept to the calling thread (BLAS's own threads may sum a product in another order). A
weight product's runs of rows are BLAS calls of their own, whose sums OpenBLAS may order otherwise than one
call's (its kernels for a matrix's edges differ): the same float32 products within rounding. Handing the GIL
between the threads has a cost of its own, so small products stay whole. Compiled on first use and cached on
disk.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import objmode, prange

from nanoasr.kernels.jit import njit

# Below this many multiply-adds a product stays one call on the calling thread: handing it out would cost
# about as much as it saves.
SPLIT_MACS = 1 << 24
ROW_RUN = 64  # a weight product's runs of W's rows are whole multiples of this (the last takes the rest)


@njit(cache=True)
def _heads_matmul(a, b, out, lo, hi):  # out[:, lo:hi] = a[:, lo:hi] @ b[:, lo:hi], BLAS on the calling thread
    # (its own function: numba's disk cache loses an object-mode block written inside a parallel loop)
    with objmode():
        np.matmul(a[:, lo:hi], b[:, lo:hi], out=out[:, lo:hi])


@njit(parallel=True, nogil=True, cache=True)
def _split_matmul(a, b, out, parts):  # a [B, h, m, K] @ b [B, h, K, n] -> out [B, h, m, n], in `parts` runs
    # of heads
    heads = a.shape[1]
    for i in prange(parts):
        _heads_matmul(a, b, out, i * heads // parts, (i + 1) * heads // parts)


def products(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """float32 a [B, h, m, K] @ b[B, h, n, K].T -> [B, h, m, n], or [h, m, K] @ [h, n, K].T -> [h, m, n] (one
    item's heads, as the encoder's), the heads shared among numba's threads; None where that does not apply
    (other shapes or types, one head or thread, a product below SPLIT_MACS)."""
    if a.ndim == b.ndim == 3:
        out = products(a[None], b[None])
        return None if out is None else out[0]
    parts = min(numba.get_num_threads(), a.shape[1]) if a.ndim == 4 else 1
    if (parts < 2 or a.dtype != np.float32 or b.dtype != np.float32 or b.ndim != 4
            or a.shape[:2] != b.shape[:2] or a.shape[3] != b.shape[3]
            or a.size * b.shape[2] < SPLIT_MACS):
        return None
    out = np.empty(a.shape[:3] + b.shape[2:3], np.float32)
    _split_matmul(a, np.swapaxes(b, -1, -2), out, parts)
    return out


@njit(cache=True)
def _rows_matmul(x, w, out, lo, hi):  # out[:, lo:hi] = x @ w[lo:hi].T, BLAS on the calling thread
    with objmode():
        np.matmul(x, w[lo:hi].T, out=out[:, lo:hi])


@njit(parallel=True, nogil=True, cache=True)
def _split_rows_matmul(x, w, out, parts):  # x [n, K] @ w [N, K].T -> out [n, N], in `parts` runs of w's rows
    runs = -(-w.shape[0] // ROW_RUN)
    for i in prange(parts):
        _rows_matmul(x, w, out, min(i * runs // parts * ROW_RUN, w.shape[0]),
                     min((i + 1) * runs // parts * ROW_RUN, w.shape[0]))


def matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray | None:
    """float32 x [n, K] @ w [N, K].T -> [n, N], runs of w's rows (ROW_RUN of them each, but for the last)
    shared among numba's threads; None where that does not apply (other shapes or types, one thread or one
    run, a product below SPLIT_MACS)."""
    parts = min(numba.get_num_threads(), -(-w.shape[0] // ROW_RUN)) if w.ndim == 2 else 1
    if (parts < 2 or x.dtype != np.float32 or w.dtype != np.float32 or x.ndim != 2
            or x.shape[1] != w.shape[1] or x.size * w.shape[0] < SPLIT_MACS):
        return None
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    _split_rows_matmul(x, w, out, parts)
    return out
