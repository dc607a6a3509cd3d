"""What the measuring tools share: running without the OpenBLAS variables, and a median timer.

OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are set on the project's build machines and halve numpy's GEMM
speed; users' machines do not set them, so the tools measure without them.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

BLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def environ_without_blas_vars() -> dict:
    return {k: v for k, v in os.environ.items() if k not in BLAS_VARS}


def rerun_without_blas_vars() -> None:
    """Re-execute this script without the variables if they are set (call it before numpy is imported)."""
    if any(v in os.environ for v in BLAS_VARS):
        os.execve(sys.executable, [sys.executable, *sys.argv], environ_without_blas_vars())


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
