"""The product's drivers, one per storage type: x float32 [n <= 8, cols] @ W.T -> out float32 [n, rows].

x is first packed as [cols/16, nx, 16] with nx = 1, 4 or 8 (16 columns of every row side by side, rows past n
zero, 64-byte aligned); the weight rows are then split into tasks of ROWS rows across numba's threads, each
task one rows_dot.

Every driver is built from one definition, its type's name a compile-time constant. numba's disk cache files
each under its own name and keys it on the closure's values: plain strings and numbers, the same in every
process (a closure over an intrinsic would compile in every process: its pickle holds a per-process id). The
key also holds the digest of the kernel sources (jit.py), so an edit to the IR they call compiles them again.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from nanoasr.kernels.ir.blocks import BLOCKS
from nanoasr.kernels.ir.rows_dot import ROWS, rows_dot
from nanoasr.kernels.jit import njit

_REASSOC = {"reassoc", "contract"}  # lets the vectoriser keep per-lane partial sums


@njit(cache=True)
def _packed(x, cols):  # x float32 [n <= 8, >= cols] -> float32 [cols/16, nx = 1, 4 or 8, 16]
    """16 columns of every row of x side by side (rows past n are zeros), starting on a 64-byte boundary so
    that no 16-column vector straddles cache lines."""
    nx = 1 if x.shape[0] == 1 else 4 if x.shape[0] <= 4 else 8
    buf = np.zeros(cols * nx + 16, np.float32)
    start = (64 - buf.ctypes.data % 64) % 64 // 4
    packed = buf[start:start + cols * nx].reshape(cols // 16, nx, 16)
    for g in range(cols // 16):
        for b in range(x.shape[0]):
            for k in range(16):
                packed[g, b, k] = x[b, 16 * g + k]
    return packed


@njit(fastmath=_REASSOC, cache=True)
def _column_sums(packed):  # float32 [16*nb, nx, 16] -> float32 [nb, nx, 16]: sums of each 32 columns, 8 zeros
    sums = np.zeros((packed.shape[0] // 16, packed.shape[1], 16), np.float32)
    for i in range(sums.shape[0]):
        for b in range(sums.shape[1]):
            for j in range(8):
                g = 2 * (8 * i + j)
                s = np.float32(0)
                for k in range(16):
                    s += packed[g, b, k] + packed[g + 1, b, k]
                sums[i, b, j] = s
    return sums


def _driver(kind: str):
    """The product for W stored as `kind`: data [rows, ...] of nb whole blocks per row."""
    size, has_mins = BLOCKS[kind].size, BLOCKS[kind].has_mins

    def matvec(x, data, nb, out):
        packed = _packed(x, nb * size)
        sums = _column_sums(packed) if has_mins else packed  # only mins meet the column sums
        for t in prange((data.shape[0] + ROWS - 1) // ROWS):
            r0, r1 = t * ROWS, min(data.shape[0], (t + 1) * ROWS)
            if packed.shape[1] == 1:
                rows_dot(kind, 1, data, packed, sums, nb, r0, r1, out)
            elif packed.shape[1] == 4:
                rows_dot(kind, 4, data, packed, sums, nb, r0, r1, out)
            else:
                rows_dot(kind, 8, data, packed, sums, nb, r0, r1, out)
    matvec.__name__ = matvec.__qualname__ = f"matvec_{kind}"
    return njit(parallel=True, cache=True)(matvec)


MATVEC = {kind: _driver(kind) for kind in BLOCKS}
