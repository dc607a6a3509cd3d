"""Products of many rows rounded to bf16 on AMX tiles, float32 sums (tdpbf16ps): out = bf16(x) @ W.T over the
last two axes of [B, H, ...] operands (a stored BF16 matrix, or attention's keys and values).

x (float32, any strides) is rounded to bf16 (to nearest, ties to even) and packed as the tile unit wants
its second operand: per 32 columns and 16 rows, 16 lines of 64 bytes, line i holding columns 2i and 2i+1 of
each row ([B, H, kb, row groups, 16, 16] pairs of bf16; _pack_tile transposes a whole tile in registers). W
comes as bf16 bits with rows and columns padded to multiples of 32 (weight_rows: a stored matrix as it is
where it fits; bf16_rows: float32 rounded), so a tile of 16 of its rows and 32 columns is one strided load.
A step of 32 columns meets 32 rows of W with 32 rows of x in 2 x 2 accumulator tiles; a tile holds out.T,
transposed in registers on its way out. The numpy twin is nanoasr.backend.xp.products_xp (BLAS on the rounded
operands).

AMX needs the CPU (amx-tile, amx-bf16) and, on Linux, the process's permission for the tile state, which
available() asks for once; products() refuses to run without it. The kernels compile on first use only: LLVM
cannot build them for a CPU without AMX.
"""
from __future__ import annotations

import ctypes
import platform
import sys
from functools import cache

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from nanoasr.kernels import target
from nanoasr.kernels.ir.vector import (F32, I8, I32, i64, lanes, load_vector, store_first, store_vector,
                                       transposed)
from nanoasr.kernels.jit import njit

ROWS = 32  # rows of W per panel: two tiles of 16
COLS = 32  # columns per tile step: 64 bytes of bf16
# A task takes a block of pairs of 16-row groups of x and a block of panels of W, each of at most BLOCK_BYTES
# and 16 pairs or panels, so that both stay in the core's cache while they meet (each operand is read from
# memory once per block of the other), and small enough that there are two tasks per thread. It goes through
# its rows of x in the outer loop, so that the output rows it writes stay in cache.
BLOCK_BYTES = 512 << 10
_ARCH_PRCTL, _REQ_XCOMP_PERM, _XTILEDATA = 158, 0x1023, 18  # x86_64 syscall number and its arguments


@cache
def available() -> bool:
    """Whether this process can run the tiles: an x86_64 Linux CPU with AMX-BF16, and the kernel's
    permission for the tile state (asked for here, once; it holds for every thread of the process), where
    numba's target has them too (target.py)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    features = target.features()
    if not (features.get("amx-tile") and features.get("amx-bf16")):
        return False
    return ctypes.CDLL(None, use_errno=True).syscall(_ARCH_PRCTL, _REQ_XCOMP_PERM, _XTILEDATA) == 0


def _tile_call(builder, name, *args):
    fnty = ir.FunctionType(ir.VoidType(), [a.type for a in args])
    fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.x86.{name}")
    builder.call(fn, list(args))


def _tile(number: int) -> ir.Constant:
    return ir.Constant(I8, number)


@intrinsic
def _configure(typingctx, config):
    """Load the tile configuration (64 bytes: palette 1, eight tiles of 16 lines of 64 bytes)."""
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        _tile_call(builder, "ldtilecfg", builder.bitcast(data, ir.PointerType(I8)))
        return context.get_dummy_value()
    return types.none(config), codegen


@intrinsic
def _release(typingctx):
    def codegen(context, builder, sig, args):
        _tile_call(builder, "tilerelease")
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def _panel(typingctx, w, n0, packed, group, kb, sums, out):
    """out[rows 32*group.. (those out has), columns n0..n0+31 (those out has)] = bf16 rows of x times weight
    rows n0..n0+31, over kb steps of 32 columns: tiles 0-3 accumulate (weight rows n0.. / n0+16.. by x rows
    32*group.. / +16..), 4-5 hold weights, 6-7 rows of x; the sums go through sums[4, 16, 16] to be
    transposed into out."""
    def codegen(context, builder, sig, args):
        wa, xa, sa, oa = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 2, 5, 6))
        n0, group, kb = args[1], args[3], args[4]
        byte = ir.PointerType(I8)
        stride = cgutils.unpack_tuple(builder, wa.strides)[0]  # bytes per weight row
        step_bytes, group_bytes = cgutils.unpack_tuple(builder, xa.strides)[:2]
        wbase, xbase = builder.bitcast(wa.data, byte), builder.bitcast(xa.data, byte)
        rows = [builder.gep(wbase, [builder.mul(builder.add(n0, i64(h)), stride)]) for h in (0, 16)]
        first = builder.mul(group, i64(2))
        groups = [builder.gep(xbase, [builder.mul(builder.add(first, i64(h)), group_bytes)]) for h in (0, 1)]
        for c in range(4):
            _tile_call(builder, "tilezero", _tile(c))
        with cgutils.for_range(builder, kb) as step:
            for h, row in enumerate(rows):
                at = builder.gep(row, [builder.mul(step.index, i64(2 * COLS))])
                _tile_call(builder, "tileloadd64", _tile(4 + h), at, stride)
            for h, grp in enumerate(groups):
                at = builder.gep(grp, [builder.mul(step.index, step_bytes)])
                _tile_call(builder, "tileloadd64", _tile(6 + h), at, i64(64))
            for a in range(2):
                for b in range(2):
                    _tile_call(builder, "tdpbf16ps", _tile(2 * a + b), _tile(4 + a), _tile(6 + b))
        scratch = builder.bitcast(sa.data, byte)
        for c in range(4):
            _tile_call(builder, "tilestored64", _tile(c), builder.gep(scratch, [i64(1024 * c)]), i64(64))
        m, n = cgutils.unpack_tuple(builder, oa.shape)
        for a in range(2):
            col = builder.add(n0, i64(16 * a))
            for b in range(2):
                tile = 256 * (2 * a + b)
                lines = [load_vector(builder, sa.data, tile + 16 * i, F32, 16) for i in range(16)]
                r0 = builder.add(builder.mul(group, i64(32)), i64(16 * b))
                for j, line in enumerate(transposed(builder, lines)):
                    r = builder.add(r0, i64(j))
                    with builder.if_then(builder.icmp_signed("<", r, m)):
                        at = builder.gep(oa.data, [builder.add(builder.mul(r, n), col)])
                        store_first(builder, at, line, builder.sub(n, col))
        return context.get_dummy_value()
    return types.none(w, n0, packed, group, kb, sums, out), codegen


def _config() -> np.ndarray:
    config = np.zeros(64, np.uint8)
    config[0] = 1  # palette 1
    config[16:32].view(np.uint16)[:8] = 64  # bytes per line of tiles 0-7
    config[48:56] = 16  # lines of tiles 0-7
    return config


_CONFIG = _config()


@njit(inline="always")
def bf16_bits(bits):  # float32 bits -> bf16 bits, rounded to nearest, ties to even (finite values)
    return (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)


@intrinsic
def _pack_tile(typingctx, bits, r0, c0, tile):
    """tile[16, 16] (uint32) = line i, row j: the bf16 pair of columns c0+2i, c0+2i+1 of row r0+j of bits
    [m, K] (float32 bits, columns contiguous; the 16 rows and 32 columns all inside)."""
    def codegen(context, builder, sig, args):
        ba, ta = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 3))
        r0, c0 = args[1], args[2]
        i32x32 = ir.VectorType(I32, 32)
        row_bytes = cgutils.unpack_tuple(builder, ba.strides)[0]
        base = builder.bitcast(ba.data, ir.PointerType(I8))
        splat = lambda v: ir.Constant(i32x32, [v] * 32)  # noqa: E731
        lines = []
        for j in range(16):
            row = builder.gep(base, [builder.mul(builder.add(r0, i64(j)), row_bytes)])
            v = _load_i32(builder, builder.gep(builder.bitcast(row, ir.PointerType(I32)), [c0]))
            odd = builder.and_(builder.lshr(v, splat(16)), splat(1))
            rounded = builder.add(builder.add(v, splat(0x7FFF)), odd)
            low = builder.lshr(rounded, splat(16))
            high = builder.and_(rounded, splat(0xFFFF0000 - (1 << 32)))
            pairs = builder.or_(lanes(builder, low, range(0, 32, 2)), lanes(builder, high, range(1, 32, 2)))
            lines.append(pairs)
        out = builder.bitcast(ta.data, ir.PointerType(I32))
        for i, line in enumerate(transposed(builder, lines)):
            store_vector(builder, out, 16 * i, line)
        return context.get_dummy_value()
    return types.none(bits, r0, c0, tile), codegen


def _load_i32(builder, ptr):
    v = builder.load(builder.bitcast(ptr, ir.PointerType(ir.VectorType(I32, 32))))
    v.align = 4
    return v


@njit(parallel=True, cache=True)
def _packed(bits, kb):  # float32 bits uint32 [B, H, m, K] (any strides) -> uint32 [B, H, kb, groups (even),
    # 16, 16]: line i of row j of a group holds the bf16 of columns 2i (low half) and 2i+1 of that row; zeros
    # past row m and column K
    batch, heads, m, cols = bits.shape
    groups = 2 * ((m + 31) // 32)
    packed = np.empty((batch, heads, kb, groups, 16, 16), np.uint32)
    for task in prange(batch * heads * kb):
        b, h, k = task // (heads * kb), task // kb % heads, task % kb
        rows = bits[b, h]
        for g in range(groups):
            if 16 * g + 16 <= m and COLS * k + COLS <= cols and rows.strides[1] == 4:
                _pack_tile(rows, 16 * g, COLS * k, packed[b, h, k, g])
                continue
            for j in range(16):  # a tile at the edges
                r = 16 * g + j
                for i in range(16):
                    c = COLS * k + 2 * i
                    low = bf16_bits(rows[r, c]) if r < m and c < cols else np.uint32(0)
                    high = bf16_bits(rows[r, c + 1]) if r < m and c + 1 < cols else np.uint32(0)
                    packed[b, h, k, g, i, j] = low | (high << np.uint32(16))
    return packed


@njit(parallel=True, cache=True)
def _padded(bits, rows, cols):  # float32 bits uint32 [B, H, n, K] (any strides) -> bf16 uint16
    # [B, H, rows, cols] (rows >= n, cols >= K), zeros past n and K
    # (each row written once, through 1-D views of it: the loop over a row's values is vectorised)
    batch, heads, n, k = bits.shape
    out = np.empty((batch, heads, rows, cols), np.uint16)
    for task in prange(batch * heads * rows):
        b, h, r = task // (heads * rows), task // rows % heads, task % rows
        line = out[b, h, r]
        if r < n:
            values = bits[b, h, r]
            for c in range(k):
                line[c] = np.uint16(bf16_bits(values[c]))
        for c in range(k if r < n else 0, cols):
            line[c] = 0
    return out


@njit(parallel=True, cache=True)
def _products(bits, w, config, block, out):  # x's float32 bits [B, H, m, K] (any strides), w bf16 uint16
    # [B, H, n', 32*kb] (n' >= n a multiple of 32, 32*kb >= K; rows C-contiguous) -> out float32 [B, H, m, n]
    batch, heads = out.shape[:2]
    kb = w.shape[3] // COLS
    packed = _packed(bits, kb)
    pairs, panels = packed.shape[3] // 2, w.shape[2] // ROWS
    row_blocks, panel_blocks = (pairs + block - 1) // block, (panels + block - 1) // block
    for task in prange(batch * heads * row_blocks * panel_blocks):
        b, h = task // (heads * row_blocks * panel_blocks), task // (row_blocks * panel_blocks) % heads
        p0, t0 = block * (task // panel_blocks % row_blocks), block * (task % panel_blocks)
        sums = np.empty((4, 16, 16), np.float32)
        _configure(config)
        for pair in range(p0, min(pairs, p0 + block)):
            for t in range(t0, min(panels, t0 + block)):
                _panel(w[b, h], t * ROWS, packed[b, h], pair, kb, sums, out[b, h])
        _release()


def _four(a: np.ndarray) -> np.ndarray:
    """a [..., r, c] with 2 to 4 axes as [B, H, r, c] (a view)."""
    if not 2 <= a.ndim <= 4:
        raise ValueError(f"AMX products take [..., rows, cols] operands of 2 to 4 axes; got {list(a.shape)}")
    return a.reshape((1,) * (4 - a.ndim) + a.shape)


def _ceil(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def bf16_rows(a: np.ndarray) -> np.ndarray:
    """float32 [..., n, K] (any strides) -> bf16 bits uint16 [B, H, n', K'] (n', K' the multiples of 32 at or
    above n and K; zeros there): the second operand of products()."""
    if a.dtype != np.float32:
        raise ValueError(f"bf16_rows takes float32; got {a.dtype}")
    bits = _four(a).view(np.uint32)
    return _padded(bits, _ceil(bits.shape[2], ROWS), _ceil(bits.shape[3], COLS))


def weight_rows(bits: np.ndarray) -> np.ndarray:
    """A stored BF16 matrix (uint16 [n, K], rows C-contiguous) as products() takes it: itself where n and K
    are multiples of 32, else a copy with zeros up to them."""
    n, k = bits.shape
    if n % ROWS == 0 and k % COLS == 0 and bits.flags.c_contiguous:
        return bits
    padded = np.zeros((_ceil(n, ROWS), _ceil(k, COLS)), np.uint16)
    padded[:n, :k] = bits
    return padded


def operands(x: np.ndarray, w: np.ndarray, out: np.ndarray, kind: str) -> tuple:
    """x, W and out of products() (here or in avx512.py: `kind` names it in the error) as [B, H, r, c]
    views, checked: x float32 [..., m, K] (any strides), W bf16 bits uint16 [..., n', K'] as bf16_rows or
    weight_rows give them (n' - 32 < n <= n', K' - 32 < K <= K'), out float32 C-contiguous [..., m, n]."""
    x4, w4, o4 = _four(x), _four(w), _four(out)
    batch, heads, m, k = x4.shape
    fits = (x.dtype == np.float32 and w.dtype == np.uint16 and out.dtype == np.float32
            and out.flags.c_contiguous and w4.flags.c_contiguous and w4.shape[:2] == (batch, heads)
            and o4.shape[:3] == (batch, heads, m) and w4.shape[2] % ROWS == 0 and w4.shape[3] % COLS == 0
            and w4.shape[2] - ROWS < o4.shape[3] <= w4.shape[2]
            and w4.shape[3] - COLS < k <= w4.shape[3])
    if not fits:
        raise ValueError(f"{kind} take float32 x [..., m, K], bf16 bits W [..., n', K'] (multiples of 32 "
                         f"just above n and K) and C-contiguous float32 out [..., m, n]; got x {x.dtype} "
                         f"{list(x.shape)}, W {w.dtype} {list(w.shape)}, out {out.dtype} {list(out.shape)}")
    return x4, w4, o4


def products(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[..., m, n] = bf16(x) @ W.T over the last two axes with float32 sums, for the operands() above;
    needs available()."""
    x4, w4, o4 = operands(x, w, out, "AMX products")
    if not available():  # also asks for the tile state: without it the first tile instruction faults
        raise RuntimeError("this CPU or process cannot run AMX tiles (amx-tile, amx-bf16 and the kernel's "
                           "permission for the tile state are needed)")
    batch, heads, m = x4.shape[:3]
    _products(x4.view(np.uint32), w4, _CONFIG, _block(batch * heads, -(-m // ROWS), w4.shape[2] // ROWS,
                                                      w4.shape[3]), o4)
    return out


def _block(items: int, pairs: int, panels: int, cols: int) -> int:
    """Pairs of row groups (and panels) per task: see BLOCK_BYTES."""
    import numba

    block = max(1, min(16, BLOCK_BYTES // (2 * ROWS * cols)))  # a pair or panel: 32 rows of `cols` bf16
    while block > 1 and items * -(-pairs // block) * -(-panels // block) < 2 * numba.get_num_threads():
        block //= 2
    return block
