"""xp-generic primitives (numpy or cupy, following the input): linear, norms, softmax, RoPE, FSMN, attention.

Everything computes in float32. Each op is a one-line dispatch to the kernel table of the device that holds
its input (nanoasr.backend), beside its array-module twin (`*_xp`): the reference the kernels are tested
against, what the CPU table runs where a kernel's guard does not hold, and what CuPy runs for now.
`linear` is the one matmul entry point: dense float32 arrays go straight to BLAS; weights kept in their
stored type go to the table's `stored_matmul`.
"""
from __future__ import annotations

import numpy as np

from nanoasr.backend import array_module, kernels_for
from nanoasr.tensor import StoredTensor


def linear(x, w, bias=None, relu=False):  # [..., in] @ W[out, in].T (+ b[out]), then max(., 0) -> [..., out]
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    kernels = kernels_for(rows)
    y = kernels.stored_matmul(rows, w) if isinstance(w, StoredTensor) else rows @ w.T
    if bias is not None or relu:
        y = kernels.add_bias(y, bias, relu)
    return y.reshape(*lead, y.shape[-1])


def add_bias_xp(y, bias, relu):  # y [n, out] (a fresh product, overwritten) -> y + bias, rectified if relu
    if bias is not None:
        y += bias
    if relu:
        array_module(y).maximum(y, 0, out=y)
    return y


def stored_matmul_xp(rows, w: StoredTensor):  # [n, in] x dense stored W[out, in] -> [n, out]
    return rows @ widen_xp(w).T


def widen_xp(t: StoredTensor):  # a dense stored tensor -> float32 of its shape, on the device holding t.data
    xp = array_module(t.data)
    if t.dtype == "bf16":  # BF16 is the top half of a float32
        return (t.data.astype(xp.uint32) << 16).view(xp.float32)
    if t.dtype in ("f16", "f32"):
        return t.data.astype(xp.float32, copy=False)
    raise ValueError(f"the array-module path widens the dense storage types (f32, f16, bf16); got {t.dtype}")


def take_rows(t: StoredTensor, ids):  # rows `ids` of a stored [rows, cols] tensor -> float32 [n, cols]
    return kernels_for(t.data).take_rows(t, ids)


def take_rows_xp(t: StoredTensor, ids):  # the array-module twin, for the dense storage types
    picked = t.data[array_module(t.data).asarray(ids)]
    return widen_xp(StoredTensor(picked, t.dtype, tuple(picked.shape)))


def layer_norm(x, weight, bias, eps):  # [..., d] -> [..., d]
    return kernels_for(x).layer_norm(x, weight, bias, eps)


def layer_norm_xp(x, weight, bias, eps):  # the array-module twin of the kernel (CuPy runs it)
    xp = array_module(x)
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    return centered / xp.sqrt(var + eps) * weight + bias


def rms_norm(x, weight, eps):  # [..., d] -> [..., d]
    return kernels_for(x).rms_norm(x, weight, eps)


def rms_norm_xp(x, weight, eps):  # the array-module twin of the kernel (CuPy runs it)
    xp = array_module(x)
    ms = (x * x).mean(axis=-1, keepdims=True)
    return x / xp.sqrt(ms + eps) * weight


def softmax_inplace(x, scale=1.0, keep=None):  # [B, ..., m] overwritten with softmax(scale * x) over the last
    # axis; keep [B, m] bool drops item b's columns marked False (probability 0)
    return kernels_for(x).softmax_inplace(x, scale, keep)


def softmax_inplace_xp(x, scale=1.0, keep=None):  # the kernel's array-module twin: no temporaries of x's size
    xp = array_module(x)
    if keep is not None:
        mask_inplace_xp(x, keep[(slice(None),) + (None,) * (x.ndim - 2)])
    x -= x.max(axis=-1, keepdims=True)
    if scale != 1.0:
        x *= np.float32(scale)
    xp.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def mask_inplace(scores, keep):  # scores [..., n, m], keep bool broadcastable to it: dropped -> -inf
    return kernels_for(scores).mask_inplace(scores, keep)


def mask_inplace_xp(scores, keep):  # the array-module twin: one masked copy, whatever keep holds
    array_module(scores).copyto(scores, np.float32(-np.inf), where=~keep)
    return scores


def swiglu(gate, up):  # silu(gate) * up; gate [..., d] is a fresh product and may be overwritten
    return kernels_for(gate).swiglu(gate, up)


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
    return kernels_for(x).apply_rope(x, cos, sin)


def apply_rope_xp(x, cos, sin):  # the array-module twin of the kernel
    xp = array_module(x)
    half = x.shape[-1] // 2
    rotated = xp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[..., None, :] + rotated * sin[..., None, :]


def attention(q, k, v, keep=None):  # q [B, h, n, d], k/v [B, h, m, d], keep [B, m] bool -> [B, h, n, d]
    # Head-split views go to BLAS as they are (each head's rows are evenly strided), all heads in one call;
    # the 1/sqrt(d) scale and the dropped keys are applied inside the softmax's passes.
    xp = array_module(q)
    scores = q @ xp.swapaxes(k, -1, -2)  # [B, h, n, m]
    return softmax_inplace(scores, q.shape[-1] ** -0.5, keep) @ v


def self_attention(h, w, prefix, heads, mask):  # [B, T, d_in], mask [B, T] -> attn [B, T, D], v [B, T, D]
    b, t, _ = h.shape
    q = linear(h, w[prefix + "q_proj.weight"], w[prefix + "q_proj.bias"])
    k = linear(h, w[prefix + "k_proj.weight"], w[prefix + "k_proj.bias"])
    v = linear(h, w[prefix + "v_proj.weight"], w[prefix + "v_proj.bias"])
    split = lambda x: x.reshape(b, t, heads, -1).transpose(0, 2, 1, 3)  # noqa: E731  [B, H, T, dh] views
    out = attention(split(q), split(k), split(v), mask)  # [B, H, T, dh]
    return out.transpose(0, 2, 1, 3).reshape(b, t, -1), v


def decode_attention(q, keys, values, lengths):  # q [B, kvh, g, hd] (scaled), keys/values [B, kvh, >= m, hd]
    # (cache views), lengths [B] (host) -> [B, kvh, g, hd]: row b attends to its first lengths[b] positions
    return kernels_for(q).decode_attention(q, keys, values, lengths)


def decode_attention_xp(q, keys, values, lengths):  # the array-module twin of the kernel
    xp = array_module(q)
    m = int(lengths.max())
    scores = q @ xp.swapaxes(keys[:, :, :m], -1, -2)  # [B, kvh, g, m]
    keep = xp.arange(m) < xp.asarray(lengths)[:, None, None, None]
    return softmax_inplace_xp(mask_inplace(scores, keep)) @ values[:, :, :m]


def fsmn(v, kernel):  # v [B, T, D] (padding zeroed), kernel [D, 1, K] -> [B, T, D]: depthwise conv + v
    return kernels_for(v).fsmn(v, kernel)


def fsmn_xp(v, kernel):  # the array-module twin of the kernel
    xp = array_module(v)
    taps = kernel.shape[-1]
    pad = (taps - 1) // 2
    padded = xp.pad(v, ((0, 0), (pad, taps - 1 - pad), (0, 0)))
    out = v.copy()
    for k in range(taps):  # one vectorised multiply-add per tap
        out += padded[:, k:k + v.shape[1]] * kernel[:, 0, k]
    return out
