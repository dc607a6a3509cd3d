"""The primitives each stage uses, on numpy or CuPy arrays alike: linear, norms, softmax, RoPE, FSMN and
attention.

Everything computes in float32. Each op is a one-line dispatch to the kernel table of the device that holds
its input (nanoasr.backend), whose array-module twin (`*_xp`, nanoasr.backend.xp) is the reference the
kernels are tested against; the compositions (attention, self-attention, RoPE tables) are built of ops.
`linear` is the one matmul entry point: dense float32 arrays go straight to BLAS; weights kept in their
stored type go to the table's `stored_matmul`.
"""
from __future__ import annotations

import numpy as np

from nanoasr.backend import kernels_for
from nanoasr.backend.xp import rows_bf16_xp
from nanoasr.tensor import StoredTensor
from nanoasr.xp import array_module


def linear(x, w, bias=None, relu=False):  # [..., in] @ W[out, in].T (+ b[out]), then max(., 0) -> [..., out]
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    kernels = kernels_for(rows)
    y = kernels.stored_matmul(rows, w) if isinstance(w, StoredTensor) else rows @ w.T
    if bias is not None or relu:
        y = kernels.add_bias(y, bias, relu)
    return y.reshape(*lead, y.shape[-1])


def products(a, b, activations="exact"):  # a [..., m, K], b [..., n, K] -> a @ b.T over the last two axes
    # [..., m, n]: attention's products, rows treated as the layer's weights say (nanoasr.backend.ACTIVATIONS)
    return kernels_for(a).products(a, b, activations)


def decode_rows(x) -> int:  # products of up to this many rows on x's device give each row a decode step's
    # bits for it alone (0: the device does not promise it)
    return kernels_for(x).decode_rows


def take_rows(t: StoredTensor, ids):  # rows `ids` of a stored [rows, cols] tensor -> float32 [n, cols]
    return kernels_for(t.data).take_rows(t, ids)


def layer_norm(x, weight, bias, eps):  # [..., d] -> [..., d]
    return kernels_for(x).layer_norm(x, weight, bias, eps)


def rms_norm(x, weight, eps):  # [..., d] -> [..., d]
    return kernels_for(x).rms_norm(x, weight, eps)


def softmax_inplace(x, scale=1.0):  # [..., m] overwritten with softmax(scale * x) over the last axis
    return kernels_for(x).softmax_inplace(x, scale)


def greedy_choice(logits):  # [B, vocab] float32 -> (ids [B]: each row's argmax, first of ties; the
    # log-probability of each choice under the row's softmax [B]), on logits' device
    return kernels_for(logits).greedy_choice(logits)


def mask_inplace(scores, keep):  # scores [..., n, m], keep bool broadcastable to it: dropped -> -inf
    return kernels_for(scores).mask_inplace(scores, keep)


def swiglu(gate, up):  # silu(gate) * up; gate [..., d] is a fresh product and may be overwritten
    return kernels_for(gate).swiglu(gate, up)


def rope_inv_freq(head_dim: int, theta: float, bf16: bool = False):  # -> [head_dim/2] float64
    """Rotary frequencies theta^(-2i/head_dim). `bf16` rounds their float32 values to bfloat16 (to nearest,
    ties to even) as FunASR leaves Qwen3's inv_freq buffer: its model.to(bfloat16) rounds it once and the
    later float32 cast cannot restore it (the funasr profile, DESIGN §2)."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if not bf16:
        return inv_freq
    return rows_bf16_xp(inv_freq.astype(np.float32)).astype(np.float64)


def rope_tables(positions, inv_freq):  # [n], [head_dim/2] -> cos, sin [n, head_dim]
    xp = array_module(positions)
    angles = positions.astype(xp.float64)[:, None] * xp.asarray(inv_freq)[None, :]  # [n, head_dim/2]
    angles = xp.concatenate([angles, angles], axis=-1)
    return xp.cos(angles).astype(xp.float32), xp.sin(angles).astype(xp.float32)


def apply_rope(x, cos, sin):  # [..., n, heads, d] with cos/sin [..., n, d] -> same; rotate-half (NeoX) layout
    return kernels_for(x).apply_rope(x, cos, sin)


def attention(q, k, v, activations="exact"):  # q [h, n, d], k/v [h, m, d] -> [h, n, d]
    # Head-split views go to the products as they are (each head's rows are evenly strided), all heads in one
    # call; the 1/sqrt(d) scale is applied inside the softmax's passes.
    xp = array_module(q)
    scores = products(q, k, activations)  # [h, n, m]
    return products(softmax_inplace(scores, q.shape[-1] ** -0.5), xp.swapaxes(v, -1, -2), activations)


def self_attention(h, w, prefix, heads):  # [T, d_in] -> attn [T, D], v [T, D]
    t = h.shape[0]
    q = linear(h, w[prefix + "q_proj.weight"], w[prefix + "q_proj.bias"])
    k = linear(h, w[prefix + "k_proj.weight"], w[prefix + "k_proj.bias"])
    v = linear(h, w[prefix + "v_proj.weight"], w[prefix + "v_proj.bias"])
    split = lambda x: x.reshape(t, heads, -1).transpose(1, 0, 2)  # noqa: E731  [H, T, dh] views
    activations = getattr(w[prefix + "q_proj.weight"], "activations", "exact")  # the layer's products alike
    out = attention(split(q), split(k), split(v), activations)  # [H, T, dh]
    return out.transpose(1, 0, 2).reshape(t, -1), v


def new_position(q, k, v, q_norm, k_norm, eps, cos, sin, scale, keys, values, positions):
    """One new position per row, at positions[b] ([B], on q's device): q [B, heads, hd], k and v [B, kvh, hd];
    q_norm and k_norm [hd]; cos, sin [B, hd]; keys/values [B, kvh, capacity, hd] (cache views) -> q [B, heads,
    hd]: q and k RMS-normalized per head and rotated, k and v written into the cache, q times `scale`."""
    return kernels_for(q).new_position(q, k, v, q_norm, k_norm, eps, cos, sin, scale, keys, values, positions)


def compiled_layer(matrices, norms):  # a decoder layer's stored matrices and norm weights -> its decode
    # step as one call, layer(x [B, H], eps, cos, sin, scale, keys, values, positions) -> [B, H], made once
    # per decoding session (the weights checked then): the CPU's, for products over whole blocks
    # (nanoasr.kernels.decode_layer). None where the device has none; the call itself answers None for rows
    # or a cache it does not take (past 8 rows, not float32). Either None: the decoder runs the layer op by op
    return kernels_for(norms[0]).compiled_layer(matrices, norms)


def decode_attention(q, keys, values, lengths):  # q [B, kvh, g, hd] (scaled), keys/values [B, kvh, >= m, hd]
    # (cache views), lengths [B] (host) -> [B, kvh, g, hd]: row b attends to its first lengths[b] positions
    return kernels_for(q).decode_attention(q, keys, values, lengths)


def fsmn(v, kernel):  # v [T, D], kernel [D, 1, K] -> [T, D]: depthwise conv over the frames + v
    return kernels_for(v).fsmn(v, kernel)
