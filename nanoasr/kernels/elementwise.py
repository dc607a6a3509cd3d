"""Serial numba loops for the elementwise stages between GEMMs: LayerNorm and RMSNorm, the FSMN depthwise
convolution, a linear layer's bias (with its ReLU), SwiGLU's silu(gate) * up, and rotate-half RoPE.

Their numpy twins are `nanoasr.backend.xp.layer_norm_xp`, `rms_norm_xp`, `add_bias_xp`, `swiglu_xp`,
`apply_rope_xp` and `nanoasr.backend.xp.fsmn_xp`, which make a pass over the activations (and a
temporary) per operation or per tap; these make one, and in decoding, where a row is short, they also save
numpy's per-call overhead.
They are serial: between BLAS GEMMs a numba parallel region leaves its threads spinning on the cores BLAS
needs. Where numba's threads run the products too (AMX tiles, int8 GEMMs), `split=True` shares the rows of
a norm, a bias, SwiGLU or the FSMN out among them, each row computed as the serial loop computes it.
Compiled on first use and cached on disk.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from nanoasr.kernels.jit import njit
from nanoasr.kernels.softmax import exp_nonpositive


# The row sums may be reassociated, so that LLVM vectorises them; the output loops may not: there LLVM would
# turn x / norm * w into x * w / norm, which overflows to inf / inf = NaN where the twin gives 0.
@njit(cache=True, fastmath={"reassoc"})
def _sum(row):
    total = np.float32(0.0)
    for c in range(row.shape[0]):
        total += row[c]
    return total


@njit(cache=True, fastmath={"reassoc"})
def _sum_of_squares(row, mean):  # sum (row - mean)^2
    total = np.float32(0.0)
    for c in range(row.shape[0]):
        centered = row[c] - mean
        total += centered * centered
    return total


# numpy's error model: 1 / 0 is inf, as in the twins, never ZeroDivisionError; a division stays vectorisable
@njit(cache=True, error_model="numpy")
def _layer_norm_rows(x, weight, bias, eps, out):  # x, out [n, d]
    d = np.float32(x.shape[1])
    for r in range(x.shape[0]):
        row = x[r]
        mean = _sum(row) / d
        scale = np.float32(1.0) / np.sqrt(_sum_of_squares(row, mean) / d + eps)
        for c in range(x.shape[1]):
            out[r, c] = (row[c] - mean) * scale * weight[c] + bias[c]


@njit(parallel=True, cache=True)
def _layer_norm_split(x, weight, bias, eps, out, blocks):  # _layer_norm_rows, `blocks` blocks of rows
    step = (x.shape[0] + blocks - 1) // blocks
    for i in prange(blocks):
        rows = slice(i * step, (i + 1) * step)
        _layer_norm_rows(x[rows], weight, bias, eps, out[rows])


def layer_norm(x, weight, bias, eps, split=False):  # float32 [..., d] -> [..., d]
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    out = np.empty_like(rows)
    if split:  # a block of rows per numba thread
        _layer_norm_split(rows, weight, bias, np.float32(eps), out, numba.get_num_threads())
    else:
        _layer_norm_rows(rows, weight, bias, np.float32(eps), out)
    return out.reshape(x.shape)


@njit(cache=True, error_model="numpy")
def rms_norm_rows(x, weight, eps, out):  # x, out [n, d]
    d = np.float32(x.shape[1])
    for r in range(x.shape[0]):
        row = x[r]
        denominator = np.sqrt(_sum_of_squares(row, np.float32(0.0)) / d + eps)
        for c in range(x.shape[1]):
            out[r, c] = row[c] / denominator * weight[c]


@njit(parallel=True, cache=True)
def _rms_norm_split(x, weight, eps, out, blocks):  # rms_norm_rows, `blocks` blocks of rows
    step = (x.shape[0] + blocks - 1) // blocks
    for i in prange(blocks):
        rows = slice(i * step, (i + 1) * step)
        rms_norm_rows(x[rows], weight, eps, out[rows])


def rms_norm(x, weight, eps, split=False):  # float32 [..., d] -> [..., d]
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    out = np.empty_like(rows)
    weight = np.ascontiguousarray(weight, dtype=np.float32)
    if split:  # a block of rows per numba thread
        _rms_norm_split(rows, weight, np.float32(eps), out, numba.get_num_threads())
    else:
        rms_norm_rows(rows, weight, np.float32(eps), out)
    return out.reshape(x.shape)


@njit(cache=True, error_model="numpy")
def swiglu_rows(gate, up):  # gate, up [n, d]: gate <- silu(gate) * up
    for r in range(gate.shape[0]):
        g, u = gate[r], up[r]
        for c in range(g.shape[0]):
            v = g[c]
            # silu(v) = v / (1 + e^-v), with the exponential of -|v| only (it cannot overflow)
            e = exp_nonpositive(-abs(v))
            g[c] = (v * e if v < np.float32(0.0) else v) / (np.float32(1.0) + e) * u[c]


@njit(cache=True)
def rope_rows(x, cos, sin, out):  # x, out [n, heads, d]; cos, sin [n, d]
    half = x.shape[2] // 2
    for p in range(x.shape[0]):
        c, s = cos[p], sin[p]
        for h in range(x.shape[1]):
            row, o = x[p, h], out[p, h]
            for i in range(half):  # x * cos + rotate_half(x) * sin: two products and a sum, each rounded
                o[i] = row[i] * c[i] + -row[i + half] * s[i]
            for i in range(half, 2 * half):
                o[i] = row[i] * c[i] + row[i - half] * s[i]


def apply_rope(x, cos, sin):  # float32 x [..., n, heads, d], cos/sin [..., n, d] -> [..., n, heads, d]
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-2], x.shape[-1])
    out = np.empty_like(rows)
    rope_rows(rows, np.ascontiguousarray(cos).reshape(-1, cos.shape[-1]),
              np.ascontiguousarray(sin).reshape(-1, sin.shape[-1]), out)
    return out.reshape(x.shape)


@njit(parallel=True, cache=True)
def _swiglu_split(gate, up, blocks):  # swiglu_rows, `blocks` blocks of rows
    step = (gate.shape[0] + blocks - 1) // blocks
    for i in prange(blocks):
        rows = slice(i * step, (i + 1) * step)
        swiglu_rows(gate[rows], up[rows])


def swiglu(gate, up, split=False):  # float32 [..., d] each, gate a fresh C-contiguous product (overwritten)
    # -> gate
    rows, ups = gate.reshape(-1, gate.shape[-1]), np.ascontiguousarray(up).reshape(-1, up.shape[-1])
    if split:  # a block of rows per numba thread
        _swiglu_split(rows, ups, numba.get_num_threads())
    else:
        swiglu_rows(rows, ups)
    return gate


@njit(cache=True)
def _fsmn(v, taps, out, first, last):  # v, out [T, D]; taps [K, D]: for the frames first <= t < last,
    # out = v + sum_k v[t + k - pad] * taps[k]
    frames, depth = v.shape
    width = taps.shape[0]
    pad = (width - 1) // 2
    for t in range(first, last):
        acc, here = out[t], v[t]
        for d in range(depth):  # not acc[:] = v[t]: see attention.attend
            acc[d] = here[d]
        for k in range(width):  # taps in order, one multiply and one add each (as the numpy twin)
            src = t + k - pad
            if 0 <= src < frames:
                row, tap = v[src], taps[k]
                for d in range(depth):
                    acc[d] += row[d] * tap[d]


@njit(parallel=True, cache=True)
def _fsmn_split(v, taps, out, blocks):  # _fsmn, `blocks` runs of frames
    step = (v.shape[0] + blocks - 1) // blocks
    for i in prange(blocks):
        _fsmn(v, taps, out, min(i * step, v.shape[0]), min((i + 1) * step, v.shape[0]))


def fsmn(v, kernel, split=False):  # v [T, D] float32, kernel [D, 1, K] -> [T, D]
    out = np.empty_like(v)
    v, taps = np.ascontiguousarray(v), np.ascontiguousarray(kernel[:, 0, :].T)
    if split:  # a run of frames per numba thread
        _fsmn_split(v, taps, out, numba.get_num_threads())
    else:
        _fsmn(v, taps, out, 0, v.shape[0])
    return out


@njit(cache=True)
def _add_bias_rows(y, bias, relu):  # y [n, d] += bias [d], then max(., 0) if relu
    for r in range(y.shape[0]):
        row = y[r]
        if relu:
            for c in range(row.shape[0]):
                v = row[c] + bias[c]
                row[c] = np.float32(0.0) if v <= np.float32(0.0) else v  # NaN stays NaN; -0 -> 0: as numpy
        else:
            for c in range(row.shape[0]):
                row[c] += bias[c]


@njit(parallel=True, cache=True)
def _add_bias_split(y, bias, relu, blocks):  # _add_bias_rows, `blocks` blocks of rows
    step = (y.shape[0] + blocks - 1) // blocks
    for i in prange(blocks):
        _add_bias_rows(y[i * step:(i + 1) * step], bias, relu)


def add_bias(y, bias, relu, split=False):  # y float32 [n, d] C-contiguous, overwritten -> y
    bias = np.ascontiguousarray(bias, dtype=np.float32)
    if split:  # a block of rows per numba thread
        _add_bias_split(y, bias, relu, numba.get_num_threads())
    else:
        _add_bias_rows(y, bias, relu)
    return y
