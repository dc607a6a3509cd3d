"""Which array module holds an array (numpy or CuPy) and a host copy of one: what every stage that takes xp
from its inputs asks. CuPy is never imported here: a CuPy array means CuPy is loaded."""
from __future__ import annotations

import sys
from types import ModuleType

import numpy as np


def _cupy_of(x) -> ModuleType | None:
    """The CuPy module where x is a CuPy array, else None."""
    cupy = sys.modules.get("cupy")
    return cupy if cupy is not None and isinstance(x, cupy.ndarray) else None


def array_module(x) -> ModuleType:
    """numpy or cupy, following the array given."""
    return _cupy_of(x) or np


def to_numpy(x) -> np.ndarray:
    """A host copy of an array from either namespace."""
    return x.get() if _cupy_of(x) is not None else np.asarray(x)
