"""The kernel table: the type of one device's implementation of each op (cpu.py and cuda.py each fill one)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(slots=True)
class Kernels:
    """One device's implementation of each op in nanoasr.ops (same names, same arguments)."""

    add_bias: Callable
    layer_norm: Callable
    rms_norm: Callable
    softmax_inplace: Callable
    greedy_choice: Callable
    swiglu: Callable
    apply_rope: Callable
    fsmn: Callable
    new_position: Callable
    decode_attention: Callable
    compiled_layer: Callable  # a decode step's whole layer as one call, or None where the device has none
    mask_inplace: Callable
    stored_matmul: Callable
    take_rows: Callable
    products: Callable
    decode_rows: int  # products of up to this many rows compute each row as they compute it alone (the decode
    # kernels: a decode step's bits for each row); 0 where the device does not promise it
