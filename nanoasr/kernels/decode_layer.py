"""A decoder layer's decode step (one new position in each of up to 8 rows) as one compiled call, where
every product of the layer runs the int8 decode kernels (int8_dot.py) and the cache is float32.

It calls the kernels the op-by-op path (nanoasr.model.decoder.decoder_layer through nanoasr.ops) calls, on
the same operands in the same order, so it gives the same bits; what it leaves out is the dozen Python calls
per layer between them. On two cores those cost about a fifth of a step: each product streams megabytes of
weights through the caches, and the interpreter's own data is cold again by the next call.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from nanoasr.kernels.attention import _attend, _new_position
from nanoasr.kernels.blocks import BLOCKS
from nanoasr.kernels.elementwise import _rms_norm_rows, _swiglu_rows
from nanoasr.kernels.int8_dot import KINDS, MATVEC_INT8, PATHS

KIND_CODES = {kind: code for code, kind in enumerate(KINDS)}  # a matrix's storage type, as the layer takes it
PER_BLOCK = tuple(BLOCKS[kind].size for kind in KINDS)


def _layer(path: str):
    """The layer for the int8 path `path` (int8_dot.PATHS)."""
    q8_0, q4_k, q6_k = (MATVEC_INT8[kind, path] for kind in KINDS)

    @njit(inline="always")
    def product(kind, x, data):  # x [B, cols] @ W.T -> [B, rows], W stored as KINDS[kind]
        out = np.empty((x.shape[0], data.shape[0]), np.float32)
        nb = x.shape[1] // PER_BLOCK[kind]
        if kind == 0:
            q8_0(x, data, nb, out)
        elif kind == 1:
            q4_k(x, data, nb, out)
        else:
            q6_k(x, data, nb, out)
        return out

    def layer(x, kinds, w_q, w_k, w_v, w_o, w_gate, w_up, w_down, input_norm, q_norm, k_norm, post_norm, eps,
              cos, sin, scale, keys, values, positions):
        b, heads_dim = x.shape[0], w_q.shape[0]
        kv_heads, head_dim = keys.shape[1], keys.shape[3]
        heads = heads_dim // head_dim
        h = np.empty_like(x)
        _rms_norm_rows(x, input_norm, eps, h)
        q, k, v = product(kinds[0], h, w_q), product(kinds[1], h, w_k), product(kinds[2], h, w_v)
        rotated = np.empty((b, heads, head_dim), np.float32)
        _new_position(q.reshape(b, heads, head_dim), k.reshape(b, kv_heads, head_dim),
                      v.reshape(b, kv_heads, head_dim), q_norm, k_norm, eps, cos, sin, scale, keys, values,
                      positions, rotated)
        attended = np.empty((b, kv_heads, heads // kv_heads, head_dim), np.float32)
        _attend(rotated.reshape(b, kv_heads, heads // kv_heads, head_dim), keys, values, positions + 1,
                attended)
        x = x + product(kinds[3], attended.reshape(b, heads_dim), w_o)
        _rms_norm_rows(x, post_norm, eps, h)
        gate, up = product(kinds[4], h, w_gate), product(kinds[5], h, w_up)
        _swiglu_rows(gate, up)
        return x + product(kinds[6], gate, w_down)
    layer.__name__ = layer.__qualname__ = f"decode_layer_int8_{path}"
    return njit(cache=True)(layer)


LAYERS = {path: _layer(path) for path in PATHS}


def decode_layer(x, matrices, norms, eps, cos, sin, scale, keys, values, positions, path):
    """x float32 [B <= 8, H] (each row's new position) -> [B, H] through one decoder layer: `matrices` q, k,
    v, o, gate, up and down, stored as KINDS (StoredTensors, data checked by the caller); `norms` the input,
    q, k and post-attention RMSNorm weights; cos/sin [B, head_dim] at each row's position; keys/values [B,
    kvh, capacity, hd] the layer's float32 cache, written at positions [B] (checked against it); `path` the
    int8 path this CPU runs."""
    kinds = np.array([KIND_CODES[w.dtype] for w in matrices], np.int64)
    return LAYERS[path](x, kinds, *(w.data for w in matrices), *norms, np.float32(eps), cos, sin,
                        np.float32(scale), keys, values, np.asarray(positions, np.int64))
