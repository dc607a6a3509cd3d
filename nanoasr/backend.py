"""The one place that knows about CuPy: resolves device={"auto","cpu","cuda"} into a Backend(name, xp)."""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from nanoasr.errors import OptionError

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Backend:
    name: str  # "cpu" | "cuda"
    xp: ModuleType  # numpy or cupy

    def asnumpy(self, x) -> np.ndarray:
        return x.get() if self.name == "cuda" else np.asarray(x)


CPU = Backend("cpu", np)


def cuda_status() -> tuple[bool, str]:
    """(usable, reason): whether CuPy imports and sees a GPU, and why not when it does not."""
    if importlib.util.find_spec("cupy") is None:
        return False, "CuPy is not installed (pip install 'nanoasr[cuda]')"
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CuPy raises several driver/runtime error types
        return False, f"CuPy is installed but cannot use a GPU: {exc}"
    if count < 1:
        return False, "CuPy found no NVIDIA GPU"
    return True, f"{count} GPU(s)"


def resolve(device: str = "auto") -> Backend:
    if device not in DEVICES:
        raise OptionError(f"device must be one of {', '.join(DEVICES)}; got {device!r}")
    if device == "cpu":
        return CPU
    usable, reason = cuda_status()
    if usable:
        import cupy

        return Backend("cuda", cupy)
    if device == "cuda":
        raise OptionError(f"device='cuda' is not available: {reason}")
    print(f"nanoasr: no usable GPU ({reason}); running on the CPU", file=sys.stderr)
    return CPU


def array_module(x) -> ModuleType:
    """numpy or cupy, following the array given (CuPy is never imported here unless it already is)."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return cupy
    return np


def to_numpy(x) -> np.ndarray:
    """A host copy of an array from either namespace."""
    return x.get() if array_module(x) is not np else np.asarray(x)
