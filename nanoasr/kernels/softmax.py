"""Softmax over the last axis in place, one row at a time, with an exp that LLVM vectorises.

Its numpy twin is `nanoasr.backend.xp.softmax_inplace_xp` (max, subtract, exp, sum, divide: five passes over
the scores); here a row is read for its maximum and then stays in L1 for its two remaining passes. numba calls
libm's scalar `expf`, which the loop vectoriser cannot widen, so `exp_nonpositive` is written out:
x = n ln2 + r with |r| <= ln2/2, e^r from a degree-7 polynomial (Cephes' expf coefficients), and 2^n built
from its exponent bits. The scale of attention scores is applied in the same passes (no pass of its own).
The decode-attention kernel uses `exp_nonpositive` too. Compiled on first use and cached on disk.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from nanoasr.kernels.jit import njit

_LOG2E = np.float32(1.44269504088896341)
_LN2_HI = np.float32(0.693359375)  # ln 2 = _LN2_HI + _LN2_LO; n * _LN2_HI is exact for |n| < 2^9
_LN2_LO = np.float32(-2.12194440e-4)
_EXP_POLY = tuple(np.float32(c) for c in (
    1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))
_UNDERFLOW = np.float32(-87.3)  # below this e^x is under float32's smallest normal: 0 (also for -inf)


@intrinsic
def _float_from_bits(typingctx, bits):
    """The low 32 bits of an int64 reinterpreted as float32."""
    if bits != types.int64:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.trunc(args[0], ir.IntType(32)), ir.FloatType())
    return types.float32(bits), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c for float32, rounded once."""
    if not all(t == types.float32 for t in (a, b, c)):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType()] * 3)
        return builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.fma.f32"), args)
    return types.float32(a, b, c), codegen


@njit(cache=True, inline="always")
def exp_nonpositive(x):  # float32 x <= 0 (a score minus its row max) -> e^x within 1.02 ulp; 0 below -87.3
    # Every multiply-add is an explicit FMA, so a caller compiled with fastmath "contract" gets the same bits.
    n = np.floor(_fma(x, _LOG2E, np.float32(0.5)))
    r = _fma(-n, _LN2_LO, _fma(-n, _LN2_HI, x))
    p = _EXP_POLY[0]
    for c in _EXP_POLY[1:]:
        p = _fma(p, r, c)
    p = _fma(p * r, r, r) + np.float32(1.0)
    scale = _float_from_bits((np.int64(max(n, np.float32(-126.0))) + 127) << 23)
    return p * scale if x >= _UNDERFLOW else np.float32(0.0)


@njit(cache=True, inline="always")
def _row_max(row):  # float32 [m] -> its maximum, NaN where it holds a NaN (as numpy's max)
    # in integers, which LLVM reduces in vector steps (a float maximum keeps NaN's rules: a serial chain): the
    # bits of a negative float with the sign-magnitude order flipped sort as the floats do; a NaN is flagged
    # apart (a negative NaN would sort below -inf)
    words = row.view(np.int32)
    top = np.int32(-2147483648)
    nan = np.int32(0)
    for j in range(words.shape[0]):
        bits = words[j]
        nan |= np.int32((bits & np.int32(0x7FFFFFFF)) > np.int32(0x7F800000))
        top = max(top, bits ^ ((bits >> np.int32(31)) & np.int32(0x7FFFFFFF)))
    if nan:
        return np.float32(np.nan)
    return _float_from_bits(np.int64(top ^ ((top >> np.int32(31)) & np.int32(0x7FFFFFFF))))


# numpy's error model: a row without a finite maximum (all masked or dropped, NaN, +inf) sums to 0 and comes
# out NaN, as in the numpy twin and torch, instead of raising ZeroDivisionError. Serial like the elementwise
# kernels: they run between BLAS GEMMs, and waking numba's threads there cost more than it saved (measured).
@njit(cache=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def _softmax_rows(x, scale):  # x [n, m] float32, overwritten row by row
    m = x.shape[1]
    for i in range(x.shape[0]):
        row = x[i]
        top = _row_max(row)
        total = np.float32(0.0)
        for j in range(m):
            e = exp_nonpositive((row[j] - top) * scale)
            row[j] = e
            total += e
        inverse = np.float32(1.0) / total
        for j in range(m):
            row[j] *= inverse


@njit(cache=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def _log_normalizers(x, tops, out):  # x [n, m], tops [n] the row maxima -> out[i] = log sum_j e^(x[i, j]-top)
    for i in range(x.shape[0]):
        row, top = x[i], tops[i]
        # float64: a float32 sum of 151936 terms in a few vector lanes loses digits numpy's pairwise sum keeps
        total = 0.0
        for j in range(x.shape[1]):
            total += np.float64(exp_nonpositive(row[j] - top))
        # a NaN or infinite maximum: NaN, as the numpy twin's row (exp_nonpositive would count its NaN as 0)
        out[i] = np.log(total) if np.isfinite(top) else np.nan


def greedy_choice(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [B, vocab], C-contiguous -> (ids [B]: each row's argmax, the log-probabilities of those choices
    [B]): nanoasr.backend.xp.greedy_choice_xp in one pass of a vectorised exp over each row after
    numpy's argmax, instead of four passes and two temporaries of the row's size (a decode step's row
    is 151936 wide)."""
    ids = logits.argmax(axis=1)  # numpy's argmax is vectorised; numba's a serial chain
    tops = logits[np.arange(len(logits)), ids]
    normalizers = np.empty(len(logits), np.float32)
    _log_normalizers(logits, tops, normalizers)
    return ids, -normalizers


@njit(parallel=True, cache=True)
def _softmax_split(x, scale, blocks):  # _softmax_rows, `blocks` blocks of rows
    step = (x.shape[0] + blocks - 1) // blocks
    for i in prange(blocks):
        _softmax_rows(x[i * step:(i + 1) * step], scale)


def softmax_inplace(x: np.ndarray, scale=1.0, split=False) -> np.ndarray:
    """float32 [..., m], C-contiguous -> x overwritten with softmax(scale * x) over its last axis. `split`:
    the rows go to numba's threads a block each (see elementwise.py)."""
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        raise ValueError(f"softmax_inplace takes C-contiguous float32; got {x.dtype}, "
                         f"contiguous={x.flags.c_contiguous}")
    rows, scale = x.reshape(-1, x.shape[-1]), np.float32(scale)
    if split:  # a block of rows per numba thread
        _softmax_split(rows, scale, numba.get_num_threads())
    else:
        _softmax_rows(rows, scale)
    return x
