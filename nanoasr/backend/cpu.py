"""The CPU kernel table: numba kernels, each behind the guard that says when it applies (dtype, layout);
anything else goes to the op's array-module twin (xp.py), which numpy runs."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np

from nanoasr.backend import Plan, host, xp
from nanoasr.backend.host import NUMBA_PRODUCTS
from nanoasr.backend.table import Kernels
from nanoasr.kernels import attention, blas_split, elementwise, softmax, stored
from nanoasr.kernels import decode_layer as layer_kernel
from nanoasr.kernels.bf16 import amx, avx512
from nanoasr.kernels.int8.dot import host_path
from nanoasr.kernels.ir.blocks import BLOCKS
from nanoasr.tensor import StoredTensor, take_rows, widen

# Up to this many rows (batched decode, the last prefill position) stream the stored blocks once through
# the fused kernels; more rows (encoder, prefill) go through the int8 GEMM where the weights are marked for
# it, else widen the matrix once and use BLAS.
FUSED_ROWS = 8
host.start_numba_threads()  # before any kernel's first parallel region starts numba's pool its own way
_scratch = threading.local()
# Elementwise kernels split their rows over numba's threads (while numba runs the products) from this many
# values on: below it, as for a decode step's rows, a parallel launch costs more than it saves.
SPLIT_VALUES = 1 << 15


def _split(x) -> bool:
    return NUMBA_PRODUCTS.get() and x.size >= SPLIT_VALUES


def add_bias(y, bias, relu):  # y [n, out], a fresh product (overwritten)
    if bias is not None and y.dtype == np.float32 and y.flags.c_contiguous:
        # one pass instead of two and a temporary
        return elementwise.add_bias(y, bias, relu, split=_split(y))
    return xp.add_bias_xp(y, bias, relu)


def layer_norm(x, weight, bias, eps):  # the kernel copies a strided x; float32 only (one compiled version)
    if x.dtype == np.float32:
        return elementwise.layer_norm(x, weight, bias, eps, split=_split(x))
    return xp.layer_norm_xp(x, weight, bias, eps)


def rms_norm(x, weight, eps):
    if x.dtype == np.float32:
        return elementwise.rms_norm(x, weight, eps, split=_split(x))
    return xp.rms_norm_xp(x, weight, eps)


def softmax_inplace(x, scale=1.0):  # in place: only on x's own float32 C-contiguous memory
    if x.dtype == np.float32 and x.flags.c_contiguous:
        return softmax.softmax_inplace(x, scale, split=_split(x))
    return xp.softmax_inplace_xp(x, scale)


def swiglu(gate, up):  # gate is overwritten in place: only its own float32 C-contiguous memory
    if gate.dtype == np.float32 and gate.flags.c_contiguous:
        return elementwise.swiglu(gate, up, split=_split(gate))
    return xp.swiglu_xp(gate, up)


def greedy_choice(logits):
    if logits.dtype == np.float32 and logits.flags.c_contiguous:
        return softmax.greedy_choice(logits)
    return xp.greedy_choice_xp(logits)


def apply_rope(x, cos, sin):
    if x.dtype == np.float32:
        return elementwise.apply_rope(x, cos, sin)
    return xp.apply_rope_xp(x, cos, sin)


def fsmn(v, kernel):
    if v.dtype == np.float32:
        return elementwise.fsmn(v, kernel, split=_split(v))
    return xp.fsmn_xp(v, kernel)


def new_position(q, k, v, q_norm, k_norm, eps, cos, sin, scale, keys, values, positions):
    if q.dtype == k.dtype == v.dtype == keys.dtype == values.dtype == np.float32:
        return attention.new_position(q, k, v, q_norm, k_norm, eps, cos, sin, scale, keys, values, positions)
    return xp.new_position_xp(q, k, v, q_norm, k_norm, eps, cos, sin, scale, keys, values, positions)


def decode_attention(q, keys, values, lengths):  # the kernel checks lengths against the cache it reads
    if keys.dtype == np.float32 and values.dtype == np.float32:
        return attention.decode_attention(q, keys, values, lengths)
    return xp.decode_attention_xp(q, keys, values, lengths)


def compiled_layer(matrices, norms):
    """A decode step's layer as one compiled call (kernels/decode_layer.py) where each product runs a decode
    kernel (float32 rows, rounded to bf16 or int8 ones as the weights are marked): a function of (x, eps, cos,
    sin, scale, keys, values, positions) for up to FUSED_ROWS float32 rows and a float32 cache (None for
    others). The stored matrices are checked once here, since the kernels read them unchecked; None where a
    matrix has columns past its last whole block (the decoder then runs the layer op by op)."""
    products, data = [], []
    for w in matrices:
        rows = (host_path() or "exact") if w.activations == "int8" else w.activations  # stored_matmul's rows
        if w.shape[1] % BLOCKS[w.dtype].size:
            return None
        products.append((w.dtype, rows))
        data.append(stored.stored_data(w.data, w.dtype, *w.shape))
    return CompiledLayer(tuple(products), data, norms)


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledLayer:
    """compiled_layer's call: the layer's products (layer_kernel.layer_for), their stored data and norms."""

    products: tuple
    data: list
    norms: list

    def __call__(self, x, eps, cos, sin, scale, keys, values, positions):
        if len(x) > FUSED_ROWS or x.dtype != np.float32 or keys.dtype != np.float32:
            return None
        return layer_kernel.decode_layer(x, self.products, self.data, self.norms, eps, cos, sin, scale, keys,
                                         values, positions)

    def compile_beside(self, x, eps, cos, sin, scale, keys, values, positions) -> bool:
        """Compile this layer's kernel for a call with these arguments in a child process, unless it is
        cached (layer_kernel.compile_beside); True when a child was started."""
        return layer_kernel.compile_beside(self.products, layer_kernel.layer_args(
            x, self.data, self.norms, eps, cos, sin, scale, keys, values, positions))


def mask_inplace(scores, keep):  # nothing to mask (an unpadded batch) is seen on the host at no cost
    return scores if keep.all() else xp.mask_inplace_xp(scores, keep)


def stored_matmul(rows, w: StoredTensor):  # [n, in] x stored W[out, in] -> [n, out]
    out_features, in_features = w.shape
    x = np.ascontiguousarray(rows, dtype=np.float32)
    if w.activations == "bf16":
        if len(x) > FUSED_ROWS and (kernel := bf16_kernel()) is not None:
            return kernel.products(x, amx.weight_rows(w.data), np.empty((len(x), out_features), np.float32))
        x = xp.rows_bf16_xp(x)  # the same rows for the float products below
    if w.activations == "int8" and host_path() is not None:  # few rows streamed, many through the GEMM
        product = stored.matvec_int8 if len(x) <= FUSED_ROWS else stored.gemm_int8
        return product(x, w.data, w.dtype, out_features, in_features,
                       np.empty((len(x), out_features), np.float32), host_path())
    if len(x) <= FUSED_ROWS:
        return stored.matvec(x, w.data, w.dtype, out_features, in_features,
                             np.empty((len(x), out_features), np.float32))
    if w.dtype == "f32":
        return _float_products(x, w.data)
    wide = stored.widen(w.data, w.dtype, out_features, in_features, _widen_buffer(out_features, in_features))
    return _float_products(x, wide)


def _float_products(x, w):  # float32 [n, in] @ [out, in].T: where BLAS is kept to the calling thread, runs
    # of w's rows on each of numba's threads (blas_split)
    if NUMBA_PRODUCTS.get():
        out = blas_split.matmul(x, w)
        if out is not None:
            return out
    return x @ w.T


def bf16_kernel():
    """The module whose products(x, W, out) multiply rows rounded to bf16 (amx.operands) on this CPU: the AMX
    tiles, else the bf16 GEMM (AVX512-BF16); None where it has neither."""
    return amx if amx.available() else avx512 if avx512.available() else None


def numba_products(weights: dict) -> bool:
    """Whether numba's threads run the large products: on the CPU always, whatever the weights. AMX tiles or
    the bf16 GEMM take weights placed for bf16 activations, the int8 GEMM those placed for int8 activations,
    where this CPU has them; every other large product (float32 rows: activations "exact", or BF16 weights on
    a CPU without bf16 products) is BLAS on each of numba's threads (blas_split), so that BLAS's own threads,
    which spin for a while after each call, never run."""
    return True


def plan(weights: dict, threads: int | None, huge_pages: bool):
    """The Plan of these placed weights on this CPU (backend.Plan)."""
    import numba

    from nanoasr.kernels.target import weight_prefetch

    wait = host.start_numba_threads().wait
    marks = {(t.dtype, t.activations) for t in weights.values() if isinstance(t, StoredTensor)}
    available = numba.get_num_threads()
    prefetch = weight_prefetch()
    return Plan("cpu", host_path() or "float32", tuple(sorted(marks)),
                str(min(threads, available)) if threads else f"all {available}", wait,
                "in huge pages (a private copy)" if huge_pages else "read through the file mapping",
                f"into {prefetch.cache}, {prefetch.rows_ahead} rows ahead")


def _widen_buffer(rows: int, cols: int) -> np.ndarray:
    """A float32 [rows, cols] view of this thread's reused buffer (one matrix widened at a time)."""
    size = rows * cols
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < size:
        buf = _scratch.buf = np.empty(size, np.float32)
    return buf[:size].reshape(rows, cols)


def products(a, b, activations):  # a [..., m, K] @ b[..., n, K].T; bf16 rows on bf16_kernel() if any
    kernel = bf16_kernel() if activations == "bf16" else None
    if kernel and a.dtype == b.dtype == np.float32 and a.ndim == b.ndim and a.shape[:-2] == b.shape[:-2]:
        return kernel.products(a, amx.bf16_rows(b), np.empty(a.shape[:-1] + b.shape[-2:-1], np.float32))
    if NUMBA_PRODUCTS.get():  # BLAS is kept to this thread: share out the heads
        if activations == "bf16":  # rounded here as the twin rounds them, then the same BLAS calls
            a, b, activations = xp.rows_bf16_xp(a), xp.rows_bf16_xp(b), "exact"
        out = blas_split.products(a, b)
        if out is not None:
            return out
    return xp.products_xp(a, b, activations)


KERNELS = Kernels(add_bias=add_bias, layer_norm=layer_norm, rms_norm=rms_norm,
                  softmax_inplace=softmax_inplace, greedy_choice=greedy_choice, swiglu=swiglu,
                  apply_rope=apply_rope, fsmn=fsmn,
                  new_position=new_position,
                  decode_attention=decode_attention, compiled_layer=compiled_layer, mask_inplace=mask_inplace,
                  stored_matmul=stored_matmul, take_rows=take_rows, products=products,
                  decode_rows=FUSED_ROWS)


def resolved_activations(dtype: str, activations: str) -> str:
    """The rows that products over a matrix of stored type `dtype` multiply, for the option `activations`:
    "int8" applies to Q8_0, Q4_K and Q6_K, "bf16" to BF16; "auto" is int8 against those types where this CPU
    has the int8 kernels (AVX2 or AVX512-VNNI), bf16 against BF16 where it multiplies bf16 natively (AMX or
    AVX512-BF16); every other pairing is "exact" (float32 rows)."""
    int8 = dtype in stored.MATVEC_INT8_KINDS
    if activations == "auto":
        native = int8 and host_path() is not None or dtype == "bf16" and bf16_kernel() is not None
        activations = ("int8" if int8 else "bf16") if native else "exact"
    applies = activations == "int8" and int8 or activations == "bf16" and dtype == "bf16"
    return activations if applies else "exact"


def place(tensors: dict, vectors: set[str], activations: str = "auto", huge_pages: bool = False) -> dict:
    """Matrices stay in their stored type, float32 ones too, so that decoding streams them through the same
    kernels; vectors are widened once. With huge_pages the matrices (and the float32 vectors, which widen to
    views of the file) are read into one buffer of huge pages (host.py); otherwise they stay where the
    checkpoint put them (a file mapping, shared between processes). Each matrix is marked with the rows its
    products multiply (resolved_activations)."""
    def matrix(t):
        rows = resolved_activations(t.dtype, activations)
        return t if rows == "exact" else dataclasses.replace(t, activations=rows)
    placed = {name: widen(t) if name in vectors else matrix(t) for name, t in tensors.items()}
    if not huge_pages:
        return placed
    matrices = [name for name, t in placed.items() if isinstance(t, StoredTensor)]
    # float32 vectors widen to views of the file: copied too, so that nothing reads the mapping afterwards
    # (where the file is mapped in 2 MiB pages, reading a few bytes maps a whole 2 MiB page)
    mapped = [name for name, t in placed.items() if name in vectors and host.file_span(t) is not None]
    copies = host.in_huge_pages([placed[name].data for name in matrices] + [placed[name] for name in mapped])
    return {**placed, **dict(zip(mapped, copies[len(matrices):])),
            **{name: dataclasses.replace(placed[name], data=data) for name, data in zip(matrices, copies)}}
