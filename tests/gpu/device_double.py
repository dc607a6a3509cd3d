"""A strict stand-in for CuPy: arrays "on the device" (a numpy array inside) that compute through numpy and
refuse every implicit trip to the host, as CuPy's arrays do and more strictly.

- `np.asarray(a)` raises TypeError (CuPy's `__array__` does); so do `bool(a)`, `int(a)`, `float(a)`,
  iteration, `.item()` and `.tolist()`, which CuPy answers by a hidden copy to the host: here every read on
  the host must be an explicit `.get()` or `cupy.asnumpy`, and each one is recorded.
- A numpy array (of one or more dimensions) may not meet a device array in arithmetic or as a value written
  into one (CuPy raises there too); numpy and list indices are uploaded, as CuPy's indexing uploads them.
- The module has only the names listed in FUNCTIONS, each one CuPy has with numpy's meaning: code that runs
  here calls nothing CuPy lacks.
"""
from __future__ import annotations

import importlib.machinery
import types
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

# cupy.<name> -> numpy.<name>, for the names nanoasr's device path calls
FUNCTIONS = ("arange", "argmax", "ascontiguousarray", "concatenate", "copyto", "cos", "empty", "exp",
             "isfinite", "log", "matmul", "maximum", "pad", "ravel", "sin", "sqrt", "swapaxes",
             "take_along_axis", "zeros")
DTYPES = ("bool_", "float16", "float32", "float64", "int32", "int64", "uint8", "uint16", "uint32")


@dataclass
class Transfers:
    """Device -> host copies as (shape, dtype name), in order; host -> device copies counted."""

    down: list = field(default_factory=list)
    up: int = 0


class HostRead(TypeError):
    """An implicit read of device data on the host."""


class DeviceArray(NDArrayOperatorsMixin):
    __slots__ = ("_a", "_log")

    def __init__(self, a: np.ndarray, log: Transfers):
        self._a, self._log = a, log

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    strides = property(lambda self: self._a.strides)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: self._wrap(self._a.T))

    @property
    def __cuda_array_interface__(self):  # what a device array offers a kernel launcher (never read here)
        return {"shape": self.shape, "typestr": self.dtype.str, "strides": self.strides, "version": 3,
                "data": (self._a.__array_interface__["data"][0], False)}

    def __len__(self):
        return self.shape[0]

    def __array__(self, *args, **kwargs):
        raise HostRead("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
                       "construct a NumPy array explicitly.")

    def _refuse(self, *args, **kwargs):
        raise HostRead("device array read on the host implicitly (bool/int/float/iteration/item/tolist)")

    __bool__ = __int__ = __float__ = __index__ = __iter__ = item = tolist = _refuse

    def get(self) -> np.ndarray:
        self._log.down.append((self.shape, self.dtype.name))
        return self._a.copy()

    def _wrap(self, a):
        return DeviceArray(np.asarray(a), self._log) if isinstance(a, (np.ndarray, np.generic)) else a

    def __getitem__(self, index):
        return self._wrap(self._a[_index(index, self._log)])

    def __setitem__(self, index, value):
        self._a[_index(index, self._log)] = _operand(value)

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if out is not None:
            kwargs["out"] = tuple(_operand(o) for o in out)
        result = getattr(ufunc, method)(*(_operand(x) for x in inputs), **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return self._wrap(result)

    def __array_function__(self, func, types, args, kwargs):  # np.f(device array) runs as cupy.f, as in CuPy
        if func.__name__ not in FUNCTIONS:
            raise HostRead(f"numpy.{func.__name__} on a device array")
        return _device_function(func, self._log)(*args, **kwargs)

    def reshape(self, *shape):
        return self._wrap(self._a.reshape(*shape))

    def transpose(self, *axes):
        return self._wrap(self._a.transpose(*axes))

    def astype(self, dtype, copy=True):
        return self._wrap(self._a.astype(dtype, copy=copy))

    def view(self, dtype):
        return self._wrap(self._a.view(dtype))

    def copy(self):
        return self._wrap(self._a.copy())

    def ravel(self):
        return self._wrap(self._a.ravel())

    def sum(self, axis=None, keepdims=False):
        return self._wrap(self._a.sum(axis=axis, keepdims=keepdims))

    def mean(self, axis=None, keepdims=False):
        return self._wrap(self._a.mean(axis=axis, keepdims=keepdims))

    def max(self, axis=None, keepdims=False):
        return self._wrap(self._a.max(axis=axis, keepdims=keepdims))

    def all(self, axis=None):
        return self._wrap(self._a.all(axis=axis))

    def argmax(self, axis=None):
        return self._wrap(self._a.argmax(axis=axis))


def _operand(x):
    """What numpy computes with: the array inside a device array; scalars as they are; host arrays refused."""
    if isinstance(x, DeviceArray):
        return x._a
    if isinstance(x, np.ndarray) and x.ndim > 0:
        raise HostRead(f"a host array {x.shape} {x.dtype} mixed with device arrays")
    if isinstance(x, (list, tuple)):
        return type(x)(_operand(v) for v in x)
    return x


def _index(index, log: Transfers):
    """An index with device arrays unwrapped and host index arrays uploaded (as CuPy's indexing does)."""
    if isinstance(index, tuple):
        return tuple(_index(i, log) for i in index)
    if isinstance(index, DeviceArray):
        return index._a
    if isinstance(index, (list, np.ndarray)):
        log.up += 1
        return np.asarray(index)
    return index


def _device_function(func, log: Transfers):
    def run(*args, **kwargs):
        result = func(*(_operand(a) for a in args), **{k: _operand(v) for k, v in kwargs.items()})
        if isinstance(result, (np.ndarray, np.generic)):
            return DeviceArray(np.asarray(result), log)
        return result  # copyto: None
    return run


def cupy_module(log: Transfers) -> types.ModuleType:
    """A module named cupy with one GPU, the default stream current, and the arrays above."""
    cupy = types.ModuleType("cupy")
    cupy.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    cupy.ndarray = DeviceArray
    for name in DTYPES:
        setattr(cupy, name, getattr(np, name))
    for name in FUNCTIONS:
        setattr(cupy, name, _device_function(getattr(np, name), log))

    def asarray(x, dtype=None):
        if isinstance(x, DeviceArray):
            return x if dtype is None else x.astype(dtype, copy=False)
        log.up += 1
        return DeviceArray(np.array(x, dtype=dtype), log)

    def ascontiguousarray(x, dtype=None):
        if not isinstance(x, DeviceArray):
            raise HostRead(f"cupy.ascontiguousarray of a host {type(x).__name__}")
        return DeviceArray(np.ascontiguousarray(x._a, dtype=dtype), log)

    cupy.asarray, cupy.ascontiguousarray = asarray, ascontiguousarray
    cupy.asnumpy = lambda x: x.get() if isinstance(x, DeviceArray) else np.asarray(x)
    stream = types.SimpleNamespace(ptr=0)  # the default stream
    cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1),
                                      get_current_stream=lambda: stream)
    return cupy
