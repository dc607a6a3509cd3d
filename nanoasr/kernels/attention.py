"""Decode-step attention over the KV cache, one numba loop for every (batch row, kv head), and the step
that readies its inputs (the new position's q and k normalized per head and rotated, k and v cached) in one
call instead of a dozen array operations per layer.

Its numpy twin is the prefill path of nanoasr/model/decoder.py (a masked softmax of stacked GEMMs); for one
new position per row, those stacked products are dozens of tiny BLAS calls per layer, and this loop does the
same arithmetic in a fraction of the time. Compiled on first use and cached on disk.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from nanoasr.kernels.elementwise import rms_norm_rows, rope_rows
from nanoasr.kernels.jit import njit
from nanoasr.kernels.softmax import exp_nonpositive


@njit(parallel=True, cache=True, fastmath={"reassoc", "contract"})
def attend(q, keys, values, lengths, out):
    batch, kv_heads, group, head_dim = q.shape
    for item in prange(batch * kv_heads):
        b, h = item // kv_heads, item % kv_heads
        m = lengths[b]
        k, v, qh = keys[b, h], values[b, h], q[b, h]  # [capacity, hd], [capacity, hd], [g, hd]
        scores = np.empty((group, m), np.float32)
        for t in range(m):  # each cached key row is read once for the whole query group
            kt = k[t]
            for j in range(group):
                s = np.float32(0.0)
                for d in range(head_dim):
                    s += qh[j, d] * kt[d]
                scores[j, t] = s
        for j in range(group):
            # not scores[j].max(), whose reduction takes the first run a second to compile; NaN spreads alike
            top = scores[j, 0]
            for t in range(1, m):
                if scores[j, t] > top:
                    top = scores[j, t]
            total = np.float32(0.0)
            for t in range(m):
                scores[j, t] = exp_nonpositive(scores[j, t] - top)
                total += scores[j, t]
            for t in range(m):
                scores[j, t] /= total
        # element by element, here and below: an array assigned to a slice (out[b, h] = acc) compiles numba's
        # shape-mismatch message, seconds of the first run for each number of dimensions
        acc = out[b, h]
        for j in range(group):
            for d in range(head_dim):
                acc[j, d] = np.float32(0.0)
        for t in range(m):
            vt = v[t]
            for j in range(group):
                p = scores[j, t]
                for d in range(head_dim):
                    acc[j, d] += p * vt[d]


def decode_attention(q, keys, values, lengths):
    """q [B, kvh, g, hd] (scaled), keys/values [B, kvh, >= max(lengths), hd] (cache views), lengths [B]
    -> [B, kvh, g, hd]: row b attends to its first lengths[b] positions."""
    lengths = np.asarray(lengths, np.int64)
    if lengths.shape != q.shape[:1] or lengths.min() < 1 or lengths.max() > keys.shape[2]:
        # the loop reads the cache unchecked: a length past it would read other memory
        raise ValueError(f"decode_attention takes one length per row, each 1 to {keys.shape[2]} (the cache); "
                         f"got {lengths.tolist()} for {q.shape[0]} rows")
    out = np.empty(q.shape, np.float32)
    attend(np.ascontiguousarray(q, dtype=np.float32), keys, values, lengths, out)
    return out


@njit(cache=True)
def new_position_into(q, k, v, q_norm, k_norm, eps, cos, sin, scale, keys, values, positions, q_out):
    batch, kv_heads, capacity, head_dim = keys.shape
    group = q.shape[1] // kv_heads
    for b in range(batch):
        if positions[b] < 0 or positions[b] >= capacity:
            raise ValueError("a position is outside the cache")
    normed = np.empty((1, group, head_dim), np.float32)
    rotated = np.empty((1, group, head_dim), np.float32)
    # the key's own buffers, not views of those: a view is typed as another layout, which would compile
    # rope_rows a second time
    normed_key = np.empty((1, 1, head_dim), np.float32)
    rotated_key = np.empty((1, 1, head_dim), np.float32)
    for b in range(batch):
        c, s, p = cos[b:b + 1], sin[b:b + 1], positions[b]
        for h in range(kv_heads):
            rms_norm_rows(q[b, h * group:(h + 1) * group], q_norm, eps, normed[0])
            rope_rows(normed, c, s, rotated)
            for j in range(group):
                for d in range(head_dim):
                    q_out[b, h * group + j, d] = rotated[0, j, d] * scale
            rms_norm_rows(k[b, h:h + 1], k_norm, eps, normed_key[0])
            rope_rows(normed_key, c, s, rotated_key)
            for d in range(head_dim):  # element by element: see attend
                keys[b, h, p, d] = rotated_key[0, 0, d]
                values[b, h, p, d] = v[b, h, d]


def new_position(q, k, v, q_norm, k_norm, eps, cos, sin, scale, keys, values, positions):
    """nanoasr.ops.new_position for float32 arrays: one pass per row and kv head, each head's rows normalized
    and rotated as rms_norm and apply_rope compute them."""
    out = np.empty(q.shape, np.float32)
    new_position_into(q, k, v, q_norm, k_norm, np.float32(eps), cos, sin, np.float32(scale), keys, values,
                      np.asarray(positions, np.int64), out)
    return out
