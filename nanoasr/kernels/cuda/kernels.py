"""The two CUDA kernels over stored weights, built once per storage type around that type's decoder.

matvec: out[r, o] = sum_i x[r, i] * W[o, i] for up to MAX_X_ROWS rows of x, float32 accumulation. One thread
block per output row (grid-stride over rows); its threads stride over the row, then sum their partial
products through shared memory. Each row of x is summed in the same order whatever the others are, so a
row gets the same bits alone or in a batch.
widen: out[o, i] = W[o, i] as float32, one element per thread (grid-stride).
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from nanoasr.kernels.cuda.decoders import VALUE

THREADS = 64  # threads per block: a power of two, for the tree sum
MAX_X_ROWS = 8  # rows of x per matvec launch


@cuda.jit(device=True)
def tree_sum(partial, n, t):
    """partial[r, 0] = sum over threads of partial[r, :THREADS] for r < n; every thread of the block calls it.
    Shared memory and barriers, so that the simulator runs it too; on a device the last 32 steps could be
    warp shuffles instead."""
    stride = THREADS // 2
    while stride > 0:
        if t < stride:
            for r in range(n):
                partial[r, t] += partial[r, t + stride]
        cuda.syncthreads()
        stride //= 2


def _matvec_kernel(value):
    @cuda.jit
    def matvec(x, w, h, out):  # x [n <= MAX_X_ROWS, cols] float32, out [n, rows] float32
        n, cols = x.shape
        t = cuda.threadIdx.x
        partial = cuda.shared.array((MAX_X_ROWS, THREADS), np.float32)
        acc = cuda.local.array(MAX_X_ROWS, np.float32)
        for o in range(cuda.blockIdx.x, out.shape[1], cuda.gridDim.x):
            for r in range(n):
                acc[r] = np.float32(0)
            for i in range(t, cols, THREADS):
                v = value(w, h, o, i)
                for r in range(n):
                    acc[r] += v * x[r, i]
            for r in range(n):
                partial[r, t] = acc[r]
            cuda.syncthreads()
            tree_sum(partial, n, t)
            if t < n:
                out[t, o] = partial[t, 0]
            cuda.syncthreads()  # partial is written again for the next row
    return matvec


def _widen_kernel(value):
    @cuda.jit
    def widen(w, h, out):  # out [rows, cols] float32
        cols = out.shape[1]
        for k in range(cuda.grid(1), out.shape[0] * cols, cuda.gridsize(1)):
            o = k // cols
            out[o, k - o * cols] = value(w, h, o, k - o * cols)
    return widen


MATVEC = {kind: _matvec_kernel(value) for kind, value in VALUE.items()}
WIDEN = {kind: _widen_kernel(value) for kind, value in VALUE.items()}
