"""Quantizers for GGUF's Q8_0, Q4_K and Q6_K blocks, and the storage-type mix of the q8_0 / q4_k_m targets.

Q8_0 matches ggml's quantize_row_q8_0_ref bit for bit. Q4_K and Q6_K follow the search of llama.cpp's
reference k-quantizers (quantize_row_q4_K_ref with make_qkx2_quants, quantize_row_q6_K_ref with
make_qx_quants), vectorised over every sub-block of a batch of rows at once; the per-candidate weighted
error is evaluated from its sums in closed form, so a candidate may win a near-tie that ggml's float32
loop would give to its neighbour.
"""
from __future__ import annotations

import re

import numpy as np

from nanoasr.storage import BLOCK_TYPES

BATCH = 1 << 16  # elements quantized together: bounds the float32 temporaries of the scale search
GROUP_MAX_EPS = np.float32(1e-15)  # ggml's threshold below which a group counts as all zero
MIXES = ("q8_0", "q4_k_m")  # the block-quantized conversion targets: storage_type's mixes of stored types
DECODER_LAYER = re.compile(r"model\.language_model\.layers\.(\d+)\.(.+)$")
MORE_BITS = ("self_attn.v_proj.weight", "mlp.down_proj.weight")
OUTPUT = ("model.language_model.embed_tokens.weight", "lm_head.weight")


def quantize(x: np.ndarray, dtype: str) -> np.ndarray:  # [rows, cols] float32 -> uint8 [rows, row_bytes]
    """Rows of `x` as GGUF blocks of `dtype`; cols must be a whole number of blocks."""
    if dtype not in BLOCK_TYPES:
        raise ValueError(f"cannot quantize to {dtype!r} (expected one of {', '.join(BLOCK_TYPES)})")
    x = np.ascontiguousarray(x, dtype=np.float32)
    block, block_bytes = BLOCK_TYPES[dtype]
    if x.ndim != 2 or x.shape[1] % block:
        raise ValueError(f"{dtype} needs a 2-D array with rows of whole {block}-element blocks, "
                         f"got shape {list(x.shape)}")
    blocks = x.reshape(-1, block)
    out = np.empty((len(blocks), block_bytes), np.uint8)
    step = max(1, BATCH // block)
    for start in range(0, len(blocks), step):
        batch = blocks[start:start + step]
        if not np.isfinite(batch).all():
            row = start * block // x.shape[1]
            raise ValueError(f"cannot quantize non-finite values to {dtype} (found near row {row})")
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # f16_bytes refuses overflow
            out[start:start + step] = QUANTIZERS[dtype](batch)
    return out.reshape(x.shape[0], -1)


def round_half_away(v: np.ndarray) -> np.ndarray:
    """C's roundf: halves round away from zero (np.rint rounds them to even)."""
    a = np.abs(v)
    whole = np.floor(a)
    return np.copysign(whole + (a - whole >= 0.5), v)


def f16_bytes(v: np.ndarray, dtype: str) -> np.ndarray:
    """[n] float32 -> [n, 2] little-endian float16 bytes; refuses scales beyond the f16 range."""
    h = v.astype(np.float16)
    if not np.isfinite(h).all():
        raise ValueError(f"values too large for {dtype}: a block scale of {np.abs(v).max():.4g} exceeds the "
                         f"float16 range")
    return h.astype("<f2").view(np.uint8).reshape(-1, 2)


def q8_0(blocks: np.ndarray) -> np.ndarray:  # [n, 32] -> [n, 34]
    """d = max|x| / 127 (f16), q = roundf(x / d) as int8."""
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = round_half_away(blocks * inv[:, None]).astype(np.int8)
    return np.concatenate([f16_bytes(d, "q8_0"), q.view(np.uint8)], axis=1)


# --- Q4_K -----------------------------------------------------------------------------------------------

def fit_scale_min(x: np.ndarray, w: np.ndarray, nmax: int = 15, rmin: float = -1.0, rdelta: float = 0.1,
                  nstep: int = 20) -> tuple[np.ndarray, np.ndarray]:  # [m, k] x2 -> [m], [m]
    """Per group, (scale, offset) with x ~ scale * l - offset, l in 0..nmax, minimising sum w (.)^2.

    make_qkx2_quants: start from the min/max grid, then try nstep + 1 stretched grids and keep the one
    whose weighted least-squares fit of scale and (non-positive) minimum has the smallest error.
    """
    lo = np.minimum(x.min(axis=1), 0)
    span = x.max(axis=1) - lo
    flat = span == 0
    span = np.where(flat, np.float32(1), span)
    shifted = x - lo[:, None]
    sum_w, sum_x, sum_x2 = (w.sum(axis=1, dtype=np.float64), (w * x).sum(axis=1, dtype=np.float64),
                            (w * x * x).sum(axis=1, dtype=np.float64))

    levels, wl = np.empty_like(x), np.empty_like(x)

    def sums(iscale):  # in place and by einsum: this loop is most of the quantizer's time
        np.minimum(np.rint(np.multiply(shifted, iscale[:, None], out=levels), out=levels), np.float32(nmax),
                   out=levels)
        np.multiply(w, levels, out=wl)
        return (wl.sum(axis=1).astype(np.float64), np.einsum("ij,ij->i", wl, levels).astype(np.float64),
                np.einsum("ij,ij->i", wl, x).astype(np.float64), levels.max(axis=1) > levels.min(axis=1))

    def error(s, m, sl, sl2, sxl):  # sum w (s l + m - x)^2, expanded
        return s * s * sl2 + 2 * s * m * sl - 2 * s * sxl + m * m * sum_w - 2 * m * sum_x + sum_x2

    iscale = np.float32(nmax) / span
    scale, mn = (np.float32(1) / iscale).astype(np.float64), lo.astype(np.float64)
    best = error(scale, mn, *sums(iscale)[:3])
    for step in range(nstep + 1):
        sl, sl2, sxl, varied = sums((np.float32(rmin) + np.float32(rdelta) * np.float32(step) + nmax) / span)
        det = sum_w * sl2 - sl * sl
        # one level throughout makes det zero in exact arithmetic; its rounding residue would pick an
        # arbitrary (scale, min) pair on the line scale * l + min = x, far too large for the 6-bit grid
        ok = varied & (det > 0)
        det = np.where(ok, det, 1)
        s = (sum_w * sxl - sum_x * sl) / det
        m = (sl2 * sum_x - sl * sxl) / det
        s = np.where(m > 0, sxl / np.where(sl2 > 0, sl2, 1), s)
        m = np.minimum(m, 0)
        e = error(s, m, sl, sl2, sxl)
        better = ok & (e < best)
        scale, mn, best = np.where(better, s, scale), np.where(better, m, mn), np.where(better, e, best)
    scale = np.where(flat, 0, scale).astype(np.float32)
    return scale, np.where(flat, -lo, -mn).astype(np.float32)


def pack_q4_k_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:  # [n, 8] x2 of 6 bits -> [n, 12]
    """Inverse of reference.q4_k_scales."""
    low = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    mid = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    high = (ls[:, 4:] & 15) | ((lm[:, 4:] & 15) << 4)
    return np.concatenate([low, mid, high], axis=1)


def six_bit(v: np.ndarray, top: np.ndarray) -> np.ndarray:
    """[n, 8] non-negative values on the grid top / 63 -> uint8 levels 0..63."""
    inv = np.divide(np.float32(63), top, out=np.zeros_like(top), where=top > 0)
    return np.clip(np.rint(v * inv[:, None]), 0, 63).astype(np.uint8)


def q4_k(blocks: np.ndarray) -> np.ndarray:  # [n, 256] -> [n, 144]
    """Eight sub-blocks of 32 with 6-bit scales and mins on f16 super-scales d and dmin; 4-bit quants.

    Weights favour large values: w = rms(sub-block) + |x| (quantize_row_q4_K_ref).
    """
    n = len(blocks)
    x = blocks.reshape(n, 8, 32)
    w = np.sqrt(np.mean(x * x, axis=2, keepdims=True)) + np.abs(x)
    scale, offset = (v.reshape(n, 8) for v in fit_scale_min(x.reshape(-1, 32), w.reshape(-1, 32)))
    max_scale, max_offset = np.maximum(scale.max(axis=1), 0), np.maximum(offset.max(axis=1), 0)
    ls, lm = six_bit(scale, max_scale), six_bit(offset, max_offset)
    d16 = f16_bytes(max_scale / np.float32(63), "q4_k")
    dmin16 = f16_bytes(max_offset / np.float32(63), "q4_k")
    d = (d16.view("<f2").astype(np.float32) * ls)[:, :, None]
    m = (dmin16.view("<f2").astype(np.float32) * lm)[:, :, None]
    levels = np.clip(np.rint((x + m) / np.where(d == 0, np.float32(1), d)), 0, 15)
    levels = np.where(d == 0, 0, levels).astype(np.uint8).reshape(n, 4, 2, 32)
    qs = (levels[:, :, 0] | (levels[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([d16, dmin16, pack_q4_k_scales(ls, lm), qs], axis=1)


# --- Q6_K -----------------------------------------------------------------------------------------------

def fit_symmetric_scale(x: np.ndarray, nmax: int = 32) -> np.ndarray:  # [m, k] -> [m]
    """Per group, scale with x ~ scale * l, l in -nmax..nmax-1, minimising sum x^2 (x - scale l)^2.

    make_qx_quants (rmse_type 1): the grid puts the largest-magnitude value at -nmax; 18 stretched grids
    around it are tried and the best least-squares scale kept. The sign of the scale follows that value.
    """
    rows = np.arange(len(x))
    peak = x[rows, np.argmax(np.abs(x), axis=1)]
    tiny = np.abs(peak) < GROUP_MAX_EPS
    peak = np.where(tiny, np.float32(1), peak)
    w = x * x
    wx = w * x

    levels, wl = np.empty_like(x), np.empty_like(x)

    def sums(iscale):
        np.clip(np.rint(np.multiply(x, iscale[:, None], out=levels), out=levels), -nmax, nmax - 1, out=levels)
        np.multiply(w, levels, out=wl)
        return (np.einsum("ij,ij->i", wx, levels).astype(np.float64),
                np.einsum("ij,ij->i", wl, levels).astype(np.float64))

    sumlx, suml2 = sums(np.float32(-nmax) / peak)
    scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, 1), 0)
    best = scale * sumlx
    for step in (*range(-9, 0), *range(1, 10)):
        sumlx, suml2 = sums(-(np.float32(nmax) + np.float32(0.1) * np.float32(step)) / peak)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        s = sumlx / np.where(suml2 > 0, suml2, 1)
        scale, best = np.where(better, s, scale), np.where(better, s * sumlx, best)
    return np.where(tiny, 0, scale).astype(np.float32)


def q6_k(blocks: np.ndarray) -> np.ndarray:  # [n, 256] -> [n, 210]
    """Sixteen sub-blocks of 16 with int8 scales on one f16 super-scale d; 6-bit quants stored as q + 32."""
    n = len(blocks)
    x = blocks.reshape(n, 16, 16)
    scale = fit_symmetric_scale(x.reshape(-1, 16)).reshape(n, 16)
    top = scale[np.arange(n), np.argmax(np.abs(scale), axis=1)]
    zero = np.abs(top) < GROUP_MAX_EPS
    iscale = np.float32(-128) / np.where(zero, np.float32(1), top)
    d16 = f16_bytes(np.where(zero, np.float32(0), np.float32(1) / iscale), "q6_k")
    sc = np.clip(np.rint(iscale[:, None] * scale), -128, 127)
    sc = np.where(zero[:, None], 0, sc).astype(np.int8)
    d = (d16.view("<f2").astype(np.float32) * sc.astype(np.float32))[:, :, None]
    q = np.clip(np.rint(x / np.where(d == 0, np.float32(1), d)), -32, 31) + 32
    q = np.where(d == 0, 0, q).astype(np.uint8).reshape(n, 2, 4, 32)  # a zero block is all zero bytes
    ql = ((q[:, :, 0:2] & 15) | (q[:, :, 2:4] << 4)).reshape(n, 128)
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6))
    return np.concatenate([ql, qh.reshape(n, 64), sc.view(np.uint8), d16], axis=1)


QUANTIZERS = {"q8_0": q8_0, "q4_k": q4_k, "q6_k": q6_k}


# --- storage mix and error report ---------------------------------------------------------------------

def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's rule: the first and last eighth of the layers, and every third layer in between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def storage_type(name: str, shape: tuple[int, ...], target: str, n_layers: int) -> str:
    """Stored type of matrix `name` (a logical Transformers name) under `target`.

    q8_0: Q8_0 where rows are whole 32-element blocks, else F16.
    q4_k_m (llama.cpp's Q4_K_M mix): Q6_K for the token embedding (the output matrix, tied) and for
    self_attn.v_proj / mlp.down_proj of the decoder layers use_more_bits picks; Q4_K for the rest.
    Encoder and adaptor matrices (model.audio_tower.*, model.multi_modal_projector.*) follow the base
    rule only. Rows that are not whole 256-element blocks fall back to Q8_0, or F16 if not whole 32s.
    """
    if target not in MIXES:
        raise ValueError(f"quantization target {target!r} is not supported "
                         f"(expected one of {', '.join(MIXES)})")
    cols = shape[-1] if len(shape) == 2 else 1
    q8 = "q8_0" if cols % 32 == 0 else "f16"
    if target == "q8_0" or cols % 256:
        return q8
    layer = DECODER_LAYER.match(name)
    if name in OUTPUT or (layer and layer[2] in MORE_BITS and use_more_bits(int(layer[1]), n_layers)):
        return "q6_k"
    return "q4_k"


class ErrorSums:
    """The sums behind error_report, added a piece at a time, so a tensor too large to widen whole is
    measured in pieces."""

    def __init__(self):
        self.count, self.err2, self.norm2, self.max_abs = 0, 0.0, 0.0, 0.0

    def add(self, x: np.ndarray, restored: np.ndarray) -> None:
        a = np.asarray(x, dtype=np.float32).reshape(-1).astype(np.float64)
        b = np.asarray(restored, dtype=np.float32).reshape(-1).astype(np.float64)
        self.count += len(a)
        self.err2 += float(np.square(b - a).sum())
        self.norm2 += float(np.square(a).sum())
        self.max_abs = max(self.max_abs, float(np.abs(b - a).max(initial=0.0)))

    def report(self) -> dict:
        """RMS of the error over the RMS of x (the plain RMS where x is all zero), and the largest error."""
        rms = np.sqrt(self.err2 / max(self.count, 1))
        norm = np.sqrt(self.norm2 / max(self.count, 1))
        return {"rel_rms": float(rms / norm if norm else rms), "max_abs": self.max_abs}


def error_report(x: np.ndarray, restored: np.ndarray) -> dict:
    """RMS of the error over the RMS of x (the plain RMS where x is all zero), and the largest error."""
    x, restored = np.asarray(x).reshape(-1), np.asarray(restored).reshape(-1)
    sums = ErrorSums()
    for start in range(0, len(x), BATCH):
        sums.add(x[start:start + BATCH], restored[start:start + BATCH])
    return sums.report()
