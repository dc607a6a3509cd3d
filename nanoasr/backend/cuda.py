"""The CUDA kernel table: the array-module twins of nanoasr.ops, run by CuPy (cuBLAS for the products).

Weights go to the device once, at placement: F16/BF16 matrices in their stored type (widened on the device
for each product), F32 matrices as they are, and block-quantized matrices widened to float32 on the host
first (no device decoder for their blocks yet).
"""
from __future__ import annotations

import cupy

from nanoasr import ops
from nanoasr.backend import Kernels
from nanoasr.tensor import StoredTensor, widen

KERNELS = Kernels(add_bias=ops.add_bias_xp, layer_norm=ops.layer_norm_xp, rms_norm=ops.rms_norm_xp,
                  softmax_inplace=ops.softmax_inplace_xp, swiglu=ops.swiglu_xp, apply_rope=ops.apply_rope_xp,
                  fsmn=ops.fsmn_xp, decode_attention=ops.decode_attention_xp,
                  stored_matmul=ops.stored_matmul_xp, take_rows=ops.take_rows_xp)


def place(tensors: dict, vectors: set[str]) -> dict:
    out = {}
    for name, t in tensors.items():
        if name in vectors or t.dtype not in ("f16", "bf16"):
            out[name] = cupy.asarray(widen(t))
        else:
            out[name] = StoredTensor(cupy.asarray(t.data), t.dtype, t.shape)
    return out
