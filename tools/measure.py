"""What the measuring tools share: running without the OpenBLAS variables, a median timer, the size of the
last-level cache (what "far larger than the caches" must exceed).

OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are set on the project's build machines and halve numpy's GEMM
speed; users' machines do not set them, so the tools measure without them.
"""
from __future__ import annotations

import os
import pathlib
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


def last_level_cache_bytes() -> int:
    """The size of cpu0's last-level cache from sysfs (0 where it does not say). Some machines of the
    project's kind report an L3 of 480 MiB (shared with other tenants): buffers meant to stream from memory
    must be a few times that."""
    try:
        size = sorted(pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"))[-1]
        text = size.read_text().strip()
        return int(text[:-1]) << {"K": 10, "M": 20, "G": 30}[text[-1]]
    except (IndexError, KeyError, OSError, ValueError):
        return 0
