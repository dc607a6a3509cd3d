"""A decoder layer's decode step (one new position in each of up to 8 rows) as one compiled call over a
float32 cache, where each of the layer's seven products runs a decode kernel: the int8 kernels (int8/dot.py)
for weights marked for int8 activations, the float32-row kernels (stored/float_rows.py) for the others (on
rows rounded to bf16 first for weights marked for bf16 activations).

It calls the kernels the op-by-op path (nanoasr.model.decoder.decoder_layer through nanoasr.ops) calls, on
the same operands in the same order, so it gives the same bits; what it leaves out is the dozen Python calls
per layer between them, which on two cores cost a good part of a step: each product streams megabytes of
weights through the caches, and the interpreter's own data is cold again by the next call. One function
is compiled for each set of seven products a model has (one or two per model), and cached on disk.

The layer is the slowest kernel to compile (it carries the seven products' code), so a first run may compile
it in a child process beside its own work (compile_beside), from the argument types of a call; a process
that calls a layer being compiled so waits for the child, then loads the layer from the disk cache.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
from numba import types
from numba.extending import overload

from nanoasr.kernels.attention import attend, new_position_into
from nanoasr.kernels.bf16.amx import bf16_bits
from nanoasr.kernels.elementwise import rms_norm_rows, swiglu_rows
from nanoasr.kernels.int8.dot import MATVEC_INT8, PATHS
from nanoasr.kernels.ir.blocks import BLOCKS
from nanoasr.kernels.jit import is_cached, njit, on_disk
from nanoasr.kernels.stored.float_rows import MATVEC


def _product(kind, rows, x, data):  # x [B <= 8, cols] @ W.T -> [B, rows of W]: compiled code only
    raise NotImplementedError("compiled code only: numba picks the kernel when the layer compiles")


@njit(cache=True)
def _bf16_rows(x):  # float32 [n, k] (C-contiguous) -> each value rounded to bf16 as xp.rows_bf16_xp does
    bits = x.view(np.uint32)
    out = np.empty_like(bits)
    for r in range(x.shape[0]):
        for c in range(x.shape[1]):
            out[r, c] = np.uint32(bf16_bits(bits[r, c])) << np.uint32(16)
    return out.view(np.float32)


@overload(_product, prefer_literal=True)
def _product_kernel(kind, rows, x, data):
    """The decode kernel for W stored as `kind` with rows as `rows` says: "exact" (float32 rows,
    stored/float_rows.py), "bf16" (the rows rounded to bf16 first, then stored/float_rows.py) or an int8
    path (int8.dot.PATHS); both literal strings, so the layer's cache key holds no kernel object."""
    if not isinstance(kind, types.StringLiteral) or not isinstance(rows, types.StringLiteral):
        return None
    stored, path = kind.literal_value, rows.literal_value
    driver = MATVEC_INT8[stored, path] if path in PATHS else MATVEC[stored]
    size, rounded = BLOCKS[stored].size, path == "bf16"

    def product(kind, rows, x, data):
        out = np.empty((x.shape[0], data.shape[0]), np.float32)
        driver(_bf16_rows(x) if rounded else x, data, x.shape[1] // size, out)
        return out
    return product


@cache
def layer_for(products: tuple):
    """The compiled layer whose q, k, v, o, gate, up and down products are `products` ((storage type, rows:
    "exact", "bf16" or an int8 path) each)."""
    # strings only in the closure: numba keys a cached function by its closure's pickled contents
    (k_q, r_q), (k_k, r_k), (k_v, r_v), (k_o, r_o), (k_gate, r_gate), (k_up, r_up), (k_down, r_down) = \
        products

    def layer(x, w_q, w_k, w_v, w_o, w_gate, w_up, w_down, input_norm, q_norm, k_norm, post_norm, eps, cos,
              sin, scale, keys, values, positions):
        b, heads_dim = x.shape[0], w_q.shape[0]
        kv_heads, head_dim = keys.shape[1], keys.shape[3]
        heads = heads_dim // head_dim
        h = np.empty_like(x)
        rms_norm_rows(x, input_norm, eps, h)
        q, k, v = _product(k_q, r_q, h, w_q), _product(k_k, r_k, h, w_k), _product(k_v, r_v, h, w_v)
        rotated = np.empty((b, heads, head_dim), np.float32)
        new_position_into(q.reshape(b, heads, head_dim), k.reshape(b, kv_heads, head_dim),
                          v.reshape(b, kv_heads, head_dim), q_norm, k_norm, eps, cos, sin, scale, keys,
                          values, positions, rotated)
        attended = np.empty((b, kv_heads, heads // kv_heads, head_dim), np.float32)
        attend(rotated.reshape(b, kv_heads, heads // kv_heads, head_dim), keys, values, positions + 1,
               attended)
        x = x + _product(k_o, r_o, attended.reshape(b, heads_dim), w_o)
        rms_norm_rows(x, post_norm, eps, h)
        gate, up = _product(k_gate, r_gate, h, w_gate), _product(k_up, r_up, h, w_up)
        swiglu_rows(gate, up)
        return x + _product(k_down, r_down, gate, w_down)
    layer.__name__ = layer.__qualname__ = "decode_layer_" + "_".join(f"{k}_{r}" for k, r in products)
    return njit(cache=True)(layer)


def layer_args(x, matrices, norms, eps, cos, sin, scale, keys, values, positions) -> tuple:
    """decode_layer's arguments as the compiled layer takes them."""
    return (x, *matrices, *norms, np.float32(eps), cos, sin, np.float32(scale), keys, values,
            np.asarray(positions, np.int64))


def decode_layer(x, products, matrices, norms, eps, cos, sin, scale, keys, values, positions):
    """x float32 [B <= 8, H] (each row's new position) -> [B, H] through one decoder layer: `matrices` the
    stored data of q, k, v, o, gate, up and down (as the kernels read it, checked by the caller; whole blocks
    only), multiplied as `products` says (layer_for); `norms` the input, q, k and post-attention RMSNorm
    weights; cos/sin [B, head_dim] at each row's position; keys/values [B, kvh, capacity, hd] the layer's
    float32 cache, written at positions [B] (checked against it)."""
    child = _beside.pop(products, None)
    if child is not None:
        child.wait()
    return layer_for(products)(*layer_args(x, matrices, norms, eps, cos, sin, scale, keys, values, positions))


PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory the child imports this nanoasr from
_beside: dict[tuple, subprocess.Popen] = {}  # products -> the child compiling their layer (compile_beside)
CHILD = ("import pickle, sys; from nanoasr.kernels.decode_layer import layer_for; "
         "products, types = pickle.loads(sys.stdin.buffer.read()); layer_for(products).compile(types)")


def compile_beside(products: tuple, args: tuple) -> bool:
    """Compile layer_for(products) for the types of `args` (layer_args) in a child process, unless the disk
    cache holds it (or there is no disk cache to hand it over in): True when a child was started. This
    process's next decode_layer call of `products` waits for it and loads the layer from the cache (or
    compiles it, where the child failed)."""
    layer = layer_for(products)
    if products in _beside or not on_disk(layer):
        return False
    types = tuple(layer.typeof_pyval(a) for a in args)
    if is_cached(layer, types):
        return False
    path = os.pathsep.join([str(PACKAGE_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    try:
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env=dict(os.environ, PYTHONPATH=path))
        with child.stdin:
            child.stdin.write(pickle.dumps((products, types)))
    except OSError:  # no interpreter to start (an embedded Python), or it died at once: compile here
        return False
    _beside[products] = child
    return True
