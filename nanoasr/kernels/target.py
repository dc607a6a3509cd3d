"""The CPU features compiled kernels may use. Numba compiles for the host unless its own settings,
NUMBA_CPU_NAME and NUMBA_CPU_FEATURES, name another target (a kernel cache shared between machines, or the
AVX2 paths tried on an AVX-512 machine); the kernels that emit a feature's instructions, and the choice of
product paths, ask here, so that they never emit what the compiled code's target lacks. The architecture is
the process's (numba compiles for it): the x86 paths are chosen on x86_64 alone, and on aarch64 the features
are LLVM's ARM names ("neon", "dotprod", "i8mm", "bf16"), which no x86 path asks for.
"""
from __future__ import annotations

from functools import cache
from typing import NamedTuple


@cache
def features() -> dict[str, bool]:
    """LLVM's feature name ("avx2", "avx512vnni", "amx-tile", ...) -> whether compiled kernels may use it: the
    host's features, or, where NUMBA_CPU_FEATURES is set ("+avx2,+fma,..."), those it turns on that the host
    has (a feature a CPU name implies but the list leaves out counts as absent: the kernels err on the side
    of the float32 paths)."""
    import llvmlite.binding as llvm
    from numba.core import config

    host = {name: bool(on) for name, on in llvm.get_host_cpu_features().items()}
    if config.CPU_FEATURES is None:
        return host
    asked = {flag.strip()[1:] for flag in config.CPU_FEATURES.split(",") if flag.strip().startswith("+")}
    return {name: on and name in asked for name, on in host.items()}


@cache
def architecture() -> str:
    """The architecture numba compiles for: the first field of the process's LLVM triple, "x86_64" or
    "aarch64" (macOS's "arm64" named as Linux names it)."""
    import llvmlite.binding as llvm

    arch = llvm.get_process_triple().split("-")[0]
    return "aarch64" if arch == "arm64" else arch


class WeightPrefetch(NamedTuple):
    locality: int  # llvm.prefetch's: 3 into L1 (x86 prefetcht0), 1 into L2 (prefetcht2)
    rows_ahead: int  # how far ahead of the weight row being read, in rows

    @property
    def cache(self) -> str:
        return "L1" if self.locality == 3 else "L2"


@cache
def weight_prefetch() -> WeightPrefetch:
    """The software prefetches the stored-weight products issue for their weight rows (decode products and
    the int8 GEMM), chosen by the host's cache hierarchy (not the compile target: it is the memory that
    differs). On AMD's Zen cores a prefetch into L1 two row pairs ahead held the streamed decode products to
    about half the read bandwidth; into L2 eight rows ahead a decoder step's products ran 1.4-2.0x faster,
    except float32 rows over Q4_K, which their arithmetic holds (tools/bench/kernel_bench.py on a Zen 4).
    Elsewhere the prefetch into L1 two row pairs ahead that the Intel Xeon was tuned with."""
    import llvmlite.binding as llvm

    zen = llvm.get_host_cpu_name().startswith("znver")
    return WeightPrefetch(locality=1, rows_ahead=8) if zen else WeightPrefetch(locality=3, rows_ahead=4)
