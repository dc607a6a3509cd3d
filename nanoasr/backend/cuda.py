"""The CUDA kernel table: CuPy runs the array-module twins of xp.py (cuBLAS for the products), and the
numba.cuda kernels of nanoasr.kernels.cuda read the weights in their stored type.

Weights go to the device once, at placement, as they are stored: F32/F16 arrays, BF16 bits, Q8_0/Q4_K/Q6_K
blocks (vectors are widened to float32 on the host first; they are small). Up to FUSED_ROWS rows of x (decode,
batched decode, the last prefill position) stream the stored matrix through the fused dequantize-GEMV kernel;
more rows (encoder, prefill) widen it into a reused float32 scratch buffer on the device and call cuBLAS. The
kernels launch on CuPy's current stream, in order with CuPy's own work, so nothing waits for the GPU.
"""
from __future__ import annotations

import threading

import cupy
from numba import cuda

from nanoasr.backend import Plan, xp
from nanoasr.backend.table import Kernels
from nanoasr.kernels import cuda as gk
from nanoasr.tensor import StoredTensor, widen

FUSED_ROWS = gk.MAX_X_ROWS
_scratch = threading.local()
_streams: dict[int, object] = {}  # CuPy stream pointer -> numba's handle on it


def current_stream():
    """numba's handle on CuPy's current stream (0 for the default stream, which both name so)."""
    ptr = cupy.cuda.get_current_stream().ptr
    if not ptr:
        return 0
    if ptr not in _streams:
        _streams[ptr] = cuda.external_stream(ptr)
    return _streams[ptr]


def stored_matmul(rows, w: StoredTensor):  # [n, in] x stored W[out, in] -> [n, out], on the device
    x = cupy.ascontiguousarray(rows, dtype=cupy.float32)
    if len(x) <= FUSED_ROWS:
        out = cupy.empty((len(x), w.shape[0]), cupy.float32)
        return gk.matvec(x, w.data, w.dtype, w.shape, out, current_stream())
    if w.dtype == "f32":
        return x @ w.data.T
    return x @ gk.widen(w.data, w.dtype, w.shape, _widen_buffer(*w.shape), current_stream()).T


def compiled_layer(matrices, norms):  # no compiled layer here: the decoder runs it op by op
    return None


def _widen_buffer(rows: int, cols: int):
    """A float32 [rows, cols] view of this thread's reused device buffer (one matrix widened at a time: the
    product that reads it is queued on the same stream before the next widening)."""
    size = rows * cols
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < size:
        buf = _scratch.buf = cupy.empty(size, cupy.float32)
    return buf[:size].reshape(rows, cols)


def take_rows(t: StoredTensor, ids):  # rows `ids` of a stored [rows, cols] tensor -> float32 [n, cols]
    picked = t.data[cupy.asarray(ids)]  # [n, stored row], gathered on the device
    n, cols = picked.shape[0], t.shape[1]
    return gk.widen(picked, t.dtype, (n, cols), cupy.empty((n, cols), cupy.float32), current_stream())


KERNELS = Kernels(add_bias=xp.add_bias_xp, layer_norm=xp.layer_norm_xp, rms_norm=xp.rms_norm_xp,
                  softmax_inplace=xp.softmax_inplace_xp, greedy_choice=xp.greedy_choice_xp,
                  swiglu=xp.swiglu_xp, apply_rope=xp.apply_rope_xp,
                  fsmn=xp.fsmn_xp, new_position=xp.new_position_xp,
                  decode_attention=xp.decode_attention_xp, compiled_layer=compiled_layer,
                  mask_inplace=xp.mask_inplace_xp, stored_matmul=stored_matmul, take_rows=take_rows,
                  products=xp.products_xp, decode_rows=0)


def plan(weights: dict, threads: int | None, huge_pages: bool):
    """The Plan of these weights on the GPU: float32 rows in every product."""
    kinds = sorted({t.dtype for t in weights.values() if isinstance(t, StoredTensor)})
    return Plan("cuda", "cuda", tuple((kind, "exact") for kind in kinds), "the GPU's", "-",
                "in the GPU's memory", "-")


def numba_products(weights: dict) -> bool:
    """The GPU runs the products."""
    return False


def place(tensors: dict, vectors: set[str], activations: str = "auto", huge_pages: bool = False) -> dict:
    """Each tensor copied to the device once: vectors as float32, matrices in their stored type (products
    keep float32 rows here whatever `activations` says; huge_pages concerns the host's copy)."""
    return {name: cupy.asarray(widen(t)) if name in vectors
            else StoredTensor(cupy.ascontiguousarray(cupy.asarray(t.data)), t.dtype, t.shape)
            for name, t in tensors.items()}
