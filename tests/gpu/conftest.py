"""The GPU tier runs everywhere: the kernels on the device where CuPy finds a GPU, and elsewhere (CI, laptops)
under numba's CUDA simulator, which runs every GPU thread as a Python thread on the CPU; the CUDA backend's
Python path against a strict stand-in for CuPy (test_cuda_backend.py). None of that is marked `cuda` and none
of it may skip. Only test_cuda_device.py, the same path on a real GPU against the CPU, is marked `cuda` and
skips without one.

numba.cuda picks real or simulated once, when it is first imported, from NUMBA_ENABLE_CUDASIM. pytest loads
this file before it imports the test modules that sort after tests/gpu (and nothing before imports
numba.cuda), so the variable is set here, for the whole session: numba's CPU target does not read it, and
numba.cuda reads it again whenever it reloads its configuration.
"""
import os
import sys

import numpy as np
import pytest


def _cupy_with_a_gpu():
    try:
        import cupy

        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # no CuPy, no driver or no device: simulate
        return None


CUPY = _cupy_with_a_gpu()
if CUPY is None and "numba.cuda" not in sys.modules:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

from numba.cuda.core import config  # noqa: E402  (imports numba.cuda, which reads the variable now)

SIMULATED = bool(config.ENABLE_CUDASIM)
if CUPY is None and not SIMULATED:
    raise pytest.UsageError("numba.cuda was imported for a real GPU before tests/gpu/conftest.py, and "
                            "CuPy finds no GPU: run tests/gpu in a process of its own, or set "
                            "NUMBA_ENABLE_CUDASIM=1")

if SIMULATED:
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    class DeviceOnly(FakeCUDAArray):
        """A simulated device array that, like a CuPy array, refuses to become a host array: the launchers
        must never read device data back. Tests read results through `_ary`, the simulator's own storage."""

        def __getattr__(self, name):
            if name in ("dtype", "strides", "ndim", "size", "itemsize", "nbytes"):
                return getattr(self._ary, name)
            raise AttributeError(f"device array: {name!r} would reach its host copy")

        def __array__(self, *args, **kwargs):
            raise TypeError("device array: implicit conversion to a host array")

        def __iter__(self):
            raise TypeError("device array: iteration on the host")

        def copy_to_host(self, *args, **kwargs):
            raise AssertionError("device array copied to the host")

        def __getitem__(self, index):  # slices and views stay device arrays
            part = self._ary[index]
            return DeviceOnly(part) if isinstance(part, np.ndarray) else part

        def view(self, dtype):
            return DeviceOnly(self._ary.view(dtype))


class Device:
    """Where the kernels run: `put` places a host array there, `get` brings one back (tests only)."""

    def put(self, a: np.ndarray):
        a = np.ascontiguousarray(a)
        return DeviceOnly(a.copy()) if SIMULATED else CUPY.asarray(a)

    def get(self, d) -> np.ndarray:
        return d._ary.copy() if SIMULATED else CUPY.asnumpy(d)


@pytest.fixture(scope="session")
def device() -> Device:
    return Device()
