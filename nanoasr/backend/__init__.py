"""The one place that knows which device runs: resolves device={"auto","cpu","cuda"} once into a Backend
(array namespace + kernel table + weight placement) and finds the backend of an array.

The tables (table.Kernels) live in cpu.py (numba kernels, each behind the guard that says when it applies,
else the op's array-module twin) and cuda.py (the array-module twins of xp.py, run by CuPy, and the
numba.cuda kernels); host.py holds the host's threads and huge pages. A table is imported on first use, so
importing nanoasr imports neither numba kernels nor CuPy; this package holds the only CuPy imports.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
import warnings
from dataclasses import dataclass
from functools import cached_property
from types import ModuleType

import numpy as np

from nanoasr.backend.table import Kernels
from nanoasr.errors import OptionError

DEVICES = ("auto", "cpu", "cuda")
# How a product treats the rows it multiplies into block-quantized weights: "auto" (the default) takes, per
# stored type, what that type's reference runtime uses where this CPU runs it natively
# (cpu.resolved_activations: int8 rows against Q8_0/Q4_K/Q6_K, bf16 rows against BF16, float32 elsewhere);
# "exact" keeps them float32 (the parity reference); "int8" quantizes them per 32-column block and sums int8
# products in int32, as ggml does (CPU, Q8_0/Q4_K/Q6_K weights, few rows and many, where the CPU has AVX2 or
# AVX512-VNNI; elsewhere the float path); "bf16" rounds them to bf16 against BF16 weights, as Transformers'
# bf16 profile does, with float32 sums (CPU; many rows run on AMX tiles, or with AVX512-BF16, where the CPU
# has them).
ACTIVATIONS = ("auto", "exact", "int8", "bf16")


@dataclass(frozen=True)
class Plan:
    """Which path the products of a loaded model take on this machine, resolved once when it loads
    (Model.plan; `nanoasr doctor --model M` and `nanoasr -v` print it)."""
    device: str  # "cpu" | "cuda"
    isa: str  # the kernels' instruction path: "vnni", "avx2", "float32" (CPU without AVX2), "cuda"
    activations: tuple[tuple[str, str], ...]  # (stored type, the rows its products multiply), per matrix type
    threads: str  # how many threads compute
    wait: str  # how numba's idle threads wait (host.start_numba_threads)
    pages: str  # where the weight matrices are read from
    prefetch: str  # how the decode products prefetch their weight rows

    def __str__(self) -> str:
        rows = ", ".join(f"{kind} {rows}" for kind, rows in self.activations)
        return (f"{self.device} ({self.isa}); activations {rows}; {self.threads} threads, idle: {self.wait}; "
                f"weights {self.pages}; prefetch {self.prefetch}")


@dataclass(frozen=True)
class Backend:
    name: str  # "cpu" | "cuda"
    xp: ModuleType  # numpy or cupy
    activations: str = "auto"  # one of ACTIVATIONS, carried by the weights place() returns
    huge_pages: bool = False  # CPU: matrices read into a private copy in huge pages (host.py)

    @cached_property
    def _table(self) -> ModuleType:
        """The module defining this device's KERNELS and place(), imported on first use."""
        if self.name == "cuda":
            from nanoasr.backend import cuda
            return cuda
        from nanoasr.backend import cpu
        return cpu

    @property
    def kernels(self) -> Kernels:
        return self._table.KERNELS

    def place(self, tensors: dict, vectors: set[str]) -> dict:
        """The weights as this device computes with them: `vectors` (norms, biases, FSMN kernels) widened to
        float32 once, matrices in their stored type where the kernels read it (marked with the activations
        their products use; on the CPU read into huge pages if huge_pages)."""
        return self._table.place(tensors, vectors, self.activations, self.huge_pages)

    def plan(self, weights: dict, threads: int | None) -> Plan:
        """The Plan of a model whose weights this backend placed, computing on `threads` (None: all)."""
        return self._table.plan(weights, threads, self.huge_pages)

    def numba_products(self, weights: dict) -> bool:
        """Whether numba's threads run every large product over these placed weights (their own kernels, or
        BLAS on each of them), so that a forward over them runs best inside threads(..., numba_products=True):
        always on the CPU (cpu.numba_products), never on CUDA."""
        return self._table.numba_products(weights)


CPU = Backend("cpu", np)
_cuda: Backend | None = None  # set when CUDA is resolved
# array type -> the kernel table of the device holding such arrays: the lookup every op makes
_TABLES: dict[type, Kernels] = {}


def cuda_status() -> tuple[bool, str]:
    """(usable, reason): whether CuPy imports, sees a GPU and passes a self-check there, and why not."""
    if importlib.util.find_spec("cupy") is None:
        return False, "CuPy is not installed (pip install '.[cuda]' in the nanoasr checkout)"
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CuPy raises several driver/runtime error types
        return False, f"CuPy is installed but cannot use a GPU: {exc}"
    if count < 1:
        return False, "CuPy found no NVIDIA GPU"
    problem = self_check(cupy)
    if problem is not None:
        return False, f"the GPU failed a self-check: {problem}"
    return True, f"{count} GPU(s)"


def self_check(cupy) -> str | None:
    """What went wrong in a tiny round trip on the GPU (upload, a compiled elementwise kernel, a reduction,
    one of nanoasr's numba.cuda kernels, download), or None when it gives the host's answers. A broken driver,
    toolkit or numba-cuda shows here, not mid-run."""
    host = np.arange(64, dtype=np.float32)
    try:
        x = cupy.asarray(host)
        got = cupy.asnumpy(x * x + x.sum())
        widened = cupy.asnumpy(kernel_round_trip(cupy))
    except Exception as exc:  # CUDA, NVRTC, NVVM, driver and import errors all end the check
        return f"{type(exc).__name__}: {exc}"
    if not (np.array_equal(got, host * host + host.sum()) and np.array_equal(widened, BF16_CHECK[1])):
        return "a test computation gave wrong numbers"
    return None


BF16_CHECK = (np.array([[0x3F80, 0xC000, 0x0000, 0x4040]], np.uint16), np.array([[1, -2, 0, 3]], np.float32))


def kernel_round_trip(cupy):
    """BF16_CHECK's bits widened on the GPU by nanoasr's own kernel (compiled there by numba-cuda)."""
    from nanoasr.kernels import cuda as gk

    bits = BF16_CHECK[0]
    return gk.widen(cupy.asarray(bits), "bf16", bits.shape, cupy.empty(bits.shape, cupy.float32))


def resolve(device: str = "auto") -> Backend:
    global _cuda
    if device not in DEVICES:
        raise OptionError(f"device must be one of {', '.join(DEVICES)}; got {device!r}")
    if device == "cpu":
        return CPU
    usable, reason = cuda_status()
    if usable:
        import cupy

        _cuda = Backend("cuda", cupy)
        return _cuda
    if device == "cuda":
        raise OptionError(f"device='cuda' is not available: {reason}")
    warnings.warn(f"nanoasr: no usable GPU ({reason}); running on the CPU", stacklevel=2)
    return CPU


def with_activations(backend: Backend, activations: str, huge_pages: bool = False) -> Backend:
    """The backend whose placed weights multiply rows as `activations` says (one of ACTIVATIONS), its CPU
    matrices read into huge pages if huge_pages."""
    if activations not in ACTIVATIONS:
        raise OptionError(f"activations must be one of {', '.join(ACTIVATIONS)}; got {activations!r}",
                          "activations")
    if not isinstance(huge_pages, bool):
        raise OptionError(f"huge_pages must be True or False; got {huge_pages!r}", "huge_pages")
    return dataclasses.replace(backend, activations=activations, huge_pages=huge_pages)


def of(x) -> Backend:
    """The backend whose device holds array x."""
    if isinstance(x, np.ndarray):
        return CPU
    cupy = sys.modules.get("cupy")  # never imported here: a CuPy array means CuPy is loaded
    if cupy is not None and isinstance(x, cupy.ndarray):
        return _cuda or resolve("cuda")
    raise TypeError(f"no backend computes on {type(x).__name__}; expected a numpy or CuPy array")


def kernels_for(x) -> Kernels:
    """The kernel table of the device that holds array x (a dict lookup by type once seen)."""
    try:
        return _TABLES[type(x)]
    except KeyError:
        table = _TABLES[type(x)] = of(x).kernels
        return table
