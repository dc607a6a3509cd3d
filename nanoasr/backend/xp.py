"""The array-module twins of the ops (`*_xp`): each op written once against numpy's API, on whichever array
module holds its input. They are the reference every kernel is tested against, what the CPU table runs where
a kernel's guard does not hold, and what the CUDA table runs on CuPy.
"""
from __future__ import annotations

import numpy as np

from nanoasr.quant.reference import f16_field, q4_k_scales
from nanoasr.tensor import StoredTensor
from nanoasr.xp import array_module


def products_xp(a, b, activations):  # the array-module twin: BLAS on the operands as they are (bf16: rounded)
    xp = array_module(a)
    if activations == "bf16":
        a, b = rows_bf16_xp(a), rows_bf16_xp(b)
    return a @ xp.swapaxes(b, -1, -2)


def add_bias_xp(y, bias, relu):  # y [n, out] (a fresh product, overwritten) -> y + bias, rectified if relu
    if bias is not None:
        y += bias
    if relu:
        array_module(y).maximum(y, 0, out=y)
    return y


def stored_matmul_xp(rows, w: StoredTensor):  # [n, in] x dense stored W[out, in] -> [n, out]
    return rows @ widen_xp(w).T


def rows_bf16_xp(x):  # float32 [..., k] -> float32 [..., k]: each value rounded to bf16 (to nearest, ties to
    # even; finite values), as the AMX products round their operands and FunASR its rotary frequencies
    bits = array_module(x).ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def quantize_rows_xp(x):  # float32 [n, 32k] -> int8 [n, k, 32], float32 scales [n, k]: per 32-column block
    # d = amax/127 and x/d rounded to nearest (ties to even), as the int8-activation kernel quantizes
    xp = array_module(x)
    blocks = x.reshape(x.shape[0], -1, 32)
    scales = xp.abs(blocks).max(axis=-1) / np.float32(127)
    inverse = xp.where(scales > 0, np.float32(1) / xp.where(scales > 0, scales, np.float32(1)), np.float32(0))
    return xp.rint(blocks * inverse[..., None]).astype(xp.int8), scales


def int8_weight_blocks_xp(w: StoredTensor):  # Q8_0, Q4_K or Q6_K W[out, 32k] -> quants int32
    # [out, 2k, 16] and scales float32 [out, 2k] per 16 values, mins float32 [out, k] per 32 (times the
    # block's sum of x, subtracted; zeros but for Q4_K)
    xp, rows = array_module(w.data), w.shape[0]
    if w.dtype == "q8_0":
        blocks = w.data.reshape(-1, 34)
        dw = f16_field(blocks, 0).reshape(rows, -1)
        quants = blocks[:, 2:].view(xp.int8).astype(xp.int32).reshape(rows, -1, 16)
        return quants, xp.repeat(dw, 2, axis=1), xp.zeros_like(dw)
    if w.dtype == "q6_k":  # sub-blocks of 16, value = (d * scale_i) * (q - 32)
        blocks = w.data.reshape(-1, 210)
        ql, qh = blocks[:, :128].reshape(-1, 2, 1, 64), blocks[:, 128:192].reshape(-1, 2, 1, 32)
        low = xp.concatenate([ql & 15, ql >> 4], axis=2).reshape(-1, 2, 128)
        high = xp.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=2).reshape(-1, 2, 128)
        quants = (low | (high << 4)).astype(xp.int32).reshape(rows, -1, 16) - 32
        scales = f16_field(blocks, 208) * blocks[:, 192:208].view(xp.int8).astype(xp.float32)
        return quants, scales.reshape(rows, -1), xp.zeros((rows, quants.shape[1] // 2), xp.float32)
    blocks = w.data.reshape(-1, 144)  # Q4_K: sub-blocks of 32, value = (d * sc_j) * q - dmin * m_j
    sc, mn = q4_k_scales(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32)
    quants = xp.concatenate([qs & 15, qs >> 4], axis=2).reshape(rows, -1, 16).astype(xp.int32)
    scales = (f16_field(blocks, 0) * sc.astype(xp.float32)).reshape(rows, -1)
    mins = (f16_field(blocks, 2) * mn.astype(xp.float32)).reshape(rows, -1)
    return quants, xp.repeat(scales, 2, axis=1), mins


def int8_block_sums_xp(x, w: StoredTensor):  # x float32 [n, 32k] x W[out, 32k] (Q8_0, Q4_K or Q6_K) ->
    # int32 [n, out, 2k] (the integer dot products of each 16 values), int8_weight_blocks_xp's scales and
    # mins, row scales float32 [n, k], rows' block sums float32 [n, k] (scale times the sum of the int8)
    xp = array_module(x)
    q, dx = quantize_rows_xp(x)
    wq, scales, mins = int8_weight_blocks_xp(w)
    sums = xp.einsum("nkc,okc->nok", q.astype(xp.int32).reshape(len(x), -1, 16), wq)
    return sums, scales, mins, dx, dx * q.astype(xp.int32).sum(axis=-1).astype(xp.float32)


def int8_matmul_xp(x, w: StoredTensor):  # the int8-activation product's twin: [n, 32k] -> float64 [n, out]
    # sum over 16 values of their int32 sum times float32(scale * dx), less min * (row's block sum)
    sums, scales, mins, dx, xs = int8_block_sums_xp(x, w)
    scaled = (sums * (scales[None] * array_module(x).repeat(dx, 2, axis=1)[:, None])).sum(axis=-1)
    return scaled - (mins[None] * xs[:, None]).sum(axis=-1, dtype=np.float64)


def widen_xp(t: StoredTensor):  # a dense stored tensor -> float32 of its shape, on the device holding t.data
    xp = array_module(t.data)
    if t.dtype == "bf16":  # BF16 is the top half of a float32
        return (t.data.astype(xp.uint32) << 16).view(xp.float32)
    if t.dtype in ("f16", "f32"):
        return t.data.astype(xp.float32, copy=False)
    raise ValueError(f"the array-module path widens the dense storage types (f32, f16, bf16); got {t.dtype}")


def take_rows_xp(t: StoredTensor, ids):  # the array-module twin, for the dense storage types
    picked = t.data[array_module(t.data).asarray(ids)]
    return widen_xp(StoredTensor(picked, t.dtype, tuple(picked.shape)))


def layer_norm_xp(x, weight, bias, eps):  # the array-module twin of the kernel (CuPy runs it)
    xp = array_module(x)
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    return centered / xp.sqrt(var + eps) * weight + bias


def rms_norm_xp(x, weight, eps):  # the array-module twin of the kernel (CuPy runs it)
    xp = array_module(x)
    ms = (x * x).mean(axis=-1, keepdims=True)
    return x / xp.sqrt(ms + eps) * weight


def softmax_inplace_xp(x, scale=1.0):  # the kernel's array-module twin: no temporaries of x's size
    xp = array_module(x)
    x -= x.max(axis=-1, keepdims=True)
    if scale != 1.0:
        x *= np.float32(scale)
    xp.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def greedy_choice_xp(logits):  # the array-module twin of the kernel
    xp = array_module(logits)
    ids = xp.argmax(logits, axis=-1)
    top = xp.take_along_axis(logits, ids[:, None], axis=-1)
    return ids, -xp.log(xp.exp(logits - top).sum(axis=-1))


def mask_inplace_xp(scores, keep):  # the array-module twin: one masked copy, whatever keep holds
    array_module(scores).copyto(scores, np.float32(-np.inf), where=~keep)
    return scores


def swiglu_xp(gate, up):  # the array-module twin of the kernel
    xp = array_module(gate)
    return gate / (1 + xp.exp(-gate)) * up


def apply_rope_xp(x, cos, sin):  # the array-module twin of the kernel
    xp = array_module(x)
    half = x.shape[-1] // 2
    rotated = xp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[..., None, :] + rotated * sin[..., None, :]


def new_position_xp(q, k, v, q_norm, k_norm, eps, cos, sin, scale, keys, values, positions):  # the twin
    xp = array_module(q)
    q, k = (apply_rope_xp(rms_norm_xp(x[:, None], w, eps), cos[:, None], sin[:, None])[:, 0]
            for x, w in ((q, q_norm), (k, k_norm)))
    rows = xp.arange(len(q))
    keys[rows, :, positions] = k
    values[rows, :, positions] = v
    return q * xp.float32(scale)


def decode_attention_xp(q, keys, values, lengths):  # the array-module twin of the kernel
    xp = array_module(q)
    m = int(lengths.max())
    scores = q @ xp.swapaxes(keys[:, :, :m], -1, -2)  # [B, kvh, g, m]
    keep = xp.arange(m) < xp.asarray(lengths)[:, None, None, None]
    return softmax_inplace_xp(mask_inplace_xp(scores, keep)) @ values[:, :, :m]


def fsmn_xp(v, kernel):  # the array-module twin of the kernel
    xp = array_module(v)
    taps = kernel.shape[-1]
    pad = (taps - 1) // 2
    padded = xp.pad(v, ((pad, taps - 1 - pad), (0, 0)))
    out = v.copy()
    for k in range(taps):  # one vectorised multiply-add per tap
        out += padded[k:k + v.shape[0]] * kernel[:, 0, k]
    return out
