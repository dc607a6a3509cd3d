"""xp-generic primitives (numpy or cupy, following the input): linear, norms, softmax, RoPE, attention.

Everything computes in float32. `linear` is the one matmul entry point: dense float32 arrays go straight to
BLAS; weights kept in their stored type go through the fused kernels for a few rows (decode) or are widened,
one matrix at a time, into a reused buffer for many rows (encoder, prefill).
"""
from __future__ import annotations

import threading

import numpy as np

from nanoasr.backend import array_module
from nanoasr.tensor import StoredTensor, widen


def linear(x, w, bias=None, relu=False):  # [..., in] @ W[out, in].T (+ b[out]), then max(., 0) -> [..., out]
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    if isinstance(w, StoredTensor):
        y = _stored_matmul(rows, w)
    else:
        y = rows @ w.T
    if bias is not None or relu:
        y = _add_bias(y, bias, relu)
    return y.reshape(*lead, y.shape[-1])


def _add_bias(y, bias, relu):  # y [n, out] (a fresh product, overwritten) -> y + bias, rectified if relu
    if bias is not None and array_module(y) is np and y.dtype == np.float32 and y.flags.c_contiguous:
        from nanoasr.kernels.elementwise import add_bias

        return add_bias(y, bias, relu)  # one pass instead of two and a temporary
    return add_bias_xp(y, bias, relu)


def add_bias_xp(y, bias, relu):  # the array-module twin of the kernel
    if bias is not None:
        y += bias
    if relu:
        array_module(y).maximum(y, 0, out=y)
    return y


# Up to this many rows (batched decode, the last prefill position) stream the stored blocks once through
# the fused kernels; more rows (encoder, prefill) widen the matrix once and use BLAS.
FUSED_ROWS = 8
_scratch = threading.local()


def _stored_matmul(rows, w: StoredTensor):  # [n, in] x stored W[out, in] -> [n, out]
    xp = array_module(rows)
    if xp is not np:
        return rows @ xp.asarray(widen(w)).T
    from nanoasr.kernels import cpu

    out_features, in_features = w.shape
    x = np.ascontiguousarray(rows, dtype=np.float32)
    if len(x) <= FUSED_ROWS:
        return cpu.matvec(x, w.data, w.dtype, out_features, in_features,
                          np.empty((len(x), out_features), np.float32))
    if w.dtype == "f32":
        return x @ w.data.T
    wide = cpu.widen(w.data, w.dtype, out_features, in_features, _widen_buffer(out_features, in_features))
    return x @ wide.T


def _widen_buffer(rows: int, cols: int) -> np.ndarray:
    """A float32 [rows, cols] view of this thread's reused buffer (one matrix widened at a time)."""
    size = rows * cols
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < size:
        buf = _scratch.buf = np.empty(size, np.float32)
    return buf[:size].reshape(rows, cols)


def layer_norm(x, weight, bias, eps):  # [..., d] -> [..., d]
    if array_module(x) is np:
        from nanoasr.kernels.elementwise import layer_norm as one_pass

        return one_pass(x, weight, bias, eps)
    return layer_norm_xp(x, weight, bias, eps)


def layer_norm_xp(x, weight, bias, eps):  # the array-module twin of the kernel (CuPy runs it)
    xp = array_module(x)
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    return centered / xp.sqrt(var + eps) * weight + bias


def rms_norm(x, weight, eps):  # [..., d] -> [..., d]
    if array_module(x) is np:
        from nanoasr.kernels.elementwise import rms_norm as one_pass

        return one_pass(x, weight, eps)
    return rms_norm_xp(x, weight, eps)


def rms_norm_xp(x, weight, eps):  # the array-module twin of the kernel (CuPy runs it)
    xp = array_module(x)
    ms = (x * x).mean(axis=-1, keepdims=True)
    return x / xp.sqrt(ms + eps) * weight


def softmax_inplace(x):  # [..., m] overwritten with its softmax over the last axis
    if array_module(x) is np and x.dtype == np.float32 and x.flags.c_contiguous:
        from nanoasr.kernels.softmax import softmax_inplace as one_row_at_a_time

        return one_row_at_a_time(x)
    return softmax_inplace_xp(x)


def softmax_inplace_xp(x):  # the array-module twin of the kernel: no temporaries the size of x
    xp = array_module(x)
    x -= x.max(axis=-1, keepdims=True)
    xp.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def mask_inplace(scores, keep):  # scores [..., n, m], keep bool broadcastable to it: dropped -> -inf
    if not keep.all():
        array_module(scores).copyto(scores, np.float32(-np.inf), where=~keep)
    return scores


def swiglu(gate, up):  # silu(gate) * up; gate [..., d] is a fresh product and may be overwritten
    if array_module(gate) is np and gate.dtype == np.float32 and gate.flags.c_contiguous:
        from nanoasr.kernels.elementwise import swiglu as one_pass

        return one_pass(gate, up)
    return swiglu_xp(gate, up)


def swiglu_xp(gate, up):  # the array-module twin of the kernel
    xp = array_module(gate)
    return gate / (1 + xp.exp(-gate)) * up


def rope_tables(positions, head_dim: int, theta: float):  # [n] -> cos, sin [n, head_dim]
    xp = array_module(positions)
    inv_freq = 1.0 / (theta ** (xp.arange(0, head_dim, 2, dtype=xp.float64) / head_dim))
    angles = positions.astype(xp.float64)[:, None] * inv_freq[None, :]  # [n, head_dim/2]
    angles = xp.concatenate([angles, angles], axis=-1)
    return xp.cos(angles).astype(xp.float32), xp.sin(angles).astype(xp.float32)


def apply_rope(x, cos, sin):  # [..., n, heads, d] with cos/sin [..., n, d] -> same; rotate-half (NeoX) layout
    if array_module(x) is np and x.dtype == np.float32:
        from nanoasr.kernels.elementwise import apply_rope as one_pass

        return one_pass(x, cos, sin)
    return apply_rope_xp(x, cos, sin)


def apply_rope_xp(x, cos, sin):  # the array-module twin of the kernel
    xp = array_module(x)
    half = x.shape[-1] // 2
    rotated = xp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[..., None, :] + rotated * sin[..., None, :]


def attention(q, k, v, mask=None):  # q [..., h, n, d], k/v [..., h, m, d], mask [..., n|1, m] bool
    # -> [..., h, n, d]
    xp = array_module(q)
    # Stacked matmuls reach BLAS only on contiguous operands (head-split views take a slow loop).
    q = xp.ascontiguousarray(q * np.float32(q.shape[-1] ** -0.5))
    k, v = xp.ascontiguousarray(k), xp.ascontiguousarray(v)
    scores = q @ xp.swapaxes(k, -1, -2)  # [..., h, n, m]
    if mask is not None:
        mask_inplace(scores, mask[..., None, :, :])
    return softmax_inplace(scores) @ v
