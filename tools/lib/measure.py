"""What the measuring tools share: running without the OpenBLAS variables, or held to an instruction set, a
median timer, the size of the last-level cache (what "far larger than the caches" must exceed).

OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are set on the project's build machines and halve numpy's GEMM speed;
users' machines do not set them, so the tools measure without them. `--isa avx2` (tools/bench/bench.py,
tools/bench/gemm_bench.py) holds a run to an AVX2-only x86 CPU's instructions (AVX2, FMA, F16C, as AMD's Zen
3): nanoasr's numba target (its kernels' paths follow it: nanoasr/kernels/target.py), OpenBLAS's Haswell
kernels, and Transformers' ATen, oneDNN and MKL dispatch; llama.cpp is held by its build.
"""
from __future__ import annotations

import os
import pathlib
import statistics
import sys
import time

BLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
ISA_ENVIRON = {"native": {}, "avx2": {
    "NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx2,+fma,+f16c,+bmi2",
    "OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}


def environ_without_blas_vars(isa: str = "native") -> dict:
    """This environment without the OpenBLAS variables, with ISA_ENVIRON[isa]'s."""
    return {**{k: v for k, v in os.environ.items() if k not in BLAS_VARS}, **ISA_ENVIRON[isa]}


def rerun_without_blas_vars() -> None:
    """Re-execute this script without the variables if they are set, or under ISA_ENVIRON[X] where its
    arguments hold `--isa X` (call it before numpy is imported)."""
    args = sys.argv[1:]
    isa = next((a.split("=", 1)[1] for a in args if a.startswith("--isa=")), None)
    isa = args[args.index("--isa") + 1] if isa is None and "--isa" in args[:-1] else isa or "native"
    wanted = environ_without_blas_vars(isa if isa in ISA_ENVIRON else "native")
    if wanted != dict(os.environ):
        os.execve(sys.executable, [sys.executable, *sys.argv], wanted)


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
