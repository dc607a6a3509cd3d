"""Many rows of x times Q8_0, Q4_K or Q6_K weights in int8: the encoder's and the prefill's products with int8
activations, ggml's numerics for the block types, without widening the weights to float32.

x [n, K] is quantized per 32-column block as the decode products quantize it (int8_dot: d = amax/127, q = x/d
rounded to nearest, ties to even). Each task packs 32 rows of W once, for all rows of x: per 32 values, 8
lines of 64 bytes, line g holding quants 4g..4g+3 of each of 16 weight rows as unsigned bytes (Q8_0's plus
128, Q4_K's 0..15, Q6_K's stored 0..63), so that one vpdpbusd multiplies four int8 of one row of x,
broadcast, into 16 weight rows at once; and the rows' scales (and Q4_K's mins) as float32. A kernel call takes
4 rows of x against the 32 weight rows: per 32 values (per 16 for Q6_K's scales), 8 (4) vpdpbusd steps into
int32 accumulators that start at minus the offset times the sum of x's int8 they meet (128 for Q8_0, 32 for
Q6_K; nothing for Q4_K), then one multiply-add each into float32 by dw * dx; Q4_K then subtracts
dmin * m times dx times the sum of the block's int8. Out[r, j] sums these terms over the blocks in order: the
decode kernel's terms, summed in another order. The numpy twin is nanoasr.backend.xp.int8_matmul_xp.

Two paths, as for decoding (int8_dot.PATHS): "vnni" as above, and "avx2", where for Q4_K and Q6_K the
vpdpbusd steps are vpmaddubsw on the same packed lines (each pair of unsigned quants times x into int16),
whose int16 sums are added over a run of fours (INT16_RUN) before one vpmaddwd widens them into the int32
sums. Q8_0's quants are signed, and vpmaddubsw needs one operand unsigned (|w| against x with w's sign
costs a sign step per product); its AVX2 panel is packed in pairs instead: per 32 values, 16 lines of 64
bytes, line p holding quants 2p, 2p+1 of each of 16 weight rows sign-extended to int16, which one vpmaddwd
multiplies by a pair of x's int8 (as int16, broadcast) into int32 sums, with no offset to take back; a call
takes two rows of x, which share each pair's weight lines in registers (call_rows). The integer sums are the
same, so both paths give the same bits.

On AArch64 the weights' quants are packed signed (Q8_0's as stored, with no offset to take back). "dotprod"
reads the fours' lines as "vnni" does, each vpdpbusd an sdot (16 bytes a call, four calls a line). "i8mm"
packs the same 8 lines per 32 values in eights: line 2e (2e + 1) holds quants 8e..8e+7 of weight rows 0-7
(8-15), row after row, so that 16 bytes are two weight rows' eight, and one smmla multiplies them by two
rows of x's eight into the 2 x 2 int32 sums of those rows; a call's rows of x are taken in pairs, and the
tiles' lanes are put back in the fours' order (a row of x, 16 weight rows) before the scaling. Every path
sums the same integers and scales them in the same order, so all four give the same bits.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from nanoasr.kernels.int8.dot import (ARM_PATHS, KINDS, PATHS, pair_products, pair_sums, q4_k_quants,
                                      q4_k_scales, q6_k_quants, q6_k_scales, quantize_block, vpdpbusd)
from nanoasr.kernels.ir.blocks import BLOCKS
from nanoasr.kernels.ir.neon import sdot, smmla
from nanoasr.kernels.ir.quant_blocks import f16x8
from nanoasr.kernels.ir.vector import (F32, I8, I16, I32, V16, bytes_of, concatenated, i64, lanes,
                                       load_vector, mac, pick, prefetch, splat, store_rows,
                                       store_vector, transposed)
from nanoasr.kernels.jit import njit

PANEL = 32  # weight rows a task packs: two groups of 16, one int32 lane each
X_ROWS = 4  # rows of x per kernel call: 8 int32 and 8 float32 accumulators of 16 lanes
# 32-value blocks of a row that all rows of x meet before the next ones. AVX2: 16, 512 values: 16 KiB of
# packed fours, which stay in the core's first-level cache while every row reads them (twice that overflowed
# it), and 32 KiB of Q8_0's pairs, which a call's two rows share (half that split the encoder's products of
# 512 columns in two; tools/bench/gemm_bench.py --isa avx2). VNNI, four rows a call: the whole panel
K_CHUNK_BLOCKS = {"vnni": 1 << 40, "avx2": 16, "dotprod": 1 << 40, "i8mm": 1 << 40}
# Values of a row a panel is packed by at a time, a group of 16 rows after the other, block by block across
# the group's rows: the chunk of each row is read in a run of 1024 values, and the run after it is prefetched
# (the hardware prefetcher does not follow 16 rows' streams)
CHUNK = 1024
SCALES = {"q8_0": 1, "q4_k": 1, "q6_k": 2}  # weight scales per 32 values


def lines(kind: str, path: str) -> int:
    """Packed lines of 64 bytes per 32 values of a group of 16 weight rows: 8 fours of bytes, or for Q8_0 on
    AVX2 16 pairs of int16 (module docstring)."""
    return 16 if kind == "q8_0" and path == "avx2" else 8


def call_rows(kind: str, path: str) -> int:
    """Rows of x a kernel call takes. VNNI and the AArch64 paths: X_ROWS. AVX2's 16 registers of 256 bits hold
    fewer: Q8_0's pairs, two rows (8 int32 accumulators and the 4 registers of a pair's weight lines, loaded
    once for both rows); the fours' runs of int16 sums, one."""
    if path != "avx2":
        return X_ROWS
    return 2 if lines(kind, path) == 16 else 1


def _block_scales(b, kind, blk):
    """A block of `kind` at blk: (<n x float> its scales, one per 32 / SCALES[kind] values; <m x float> its
    negated mins, one per 32 values, or None)."""
    if kind == "q8_0":
        return lanes(b, f16x8(b, blk, 0), [0]), None
    return (q4_k_scales if kind == "q4_k" else q6_k_scales)(b, [blk])


def _runs(b, kind, path, blk, c):
    """[<32 x i8>]: the quants of step c's 32-value sub-blocks of a block of `kind` at blk as `path` reads
    them (Q8_0: its one, plus 128 on x86, as stored on AArch64; Q4_K and Q6_K: sub-blocks 2c and 2c + 1)."""
    if kind == "q8_0":
        quants = load_vector(b, blk, 2, I8, 32)
        return [quants if path in ARM_PATHS else b.xor(quants, bytes_of(-128))]
    quants = (q4_k_quants if kind == "q4_k" else q6_k_quants)(b, blk, c)
    return [lanes(b, quants, range(32 * h, 32 * h + 32)) for h in range(2)]


def _scatter(b, v, base, stride):
    """Lane i of the float vector v to base[i * stride]."""
    for i in range(v.type.count):
        b.store(b.extract_element(v, ir.Constant(I32, i)), b.gep(base, [i64(i * stride)]))


@intrinsic(prefer_literal=True)
def _pack_panel(typingctx, kind, path, data, r0, nb, packed, scales, mins):
    """packed [32nb', 2, lines(kind, path), 64] uint8 = weight rows r0.. r0+31 of `kind` data with nb blocks
    a row (the last row repeated past the end) as the kernel on `path` reads them (module docstring); scales
    [SCALES * nb', 32] and mins [nb', 32] float32 (nb' = nb * values per block / 32): their scales and negated
    mins, per row. A group of 16 rows' 32 values become its lines in registers: fours, each pair of rows
    i, i + 8 one vector of 16 words, the 8 vectors transposed as two 8 x 8 blocks of words side by side;
    pairs, each row one vector of 16 words (its int16 pairs), the 16 vectors transposed; i8mm's eights,
    the fours' lines interleaved by twos (_eights)."""
    if not isinstance(kind, types.StringLiteral) or not isinstance(path, types.StringLiteral):
        return None
    name, on = kind.literal_value, path.literal_value

    def codegen(context, builder, sig, args):
        da, pa, sa, ma = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (2, 5, 6, 7))
        r0, nb = args[3], args[4]
        b = builder
        size, nbytes = BLOCKS[name].size, BLOCKS[name].nbytes
        rows = cgutils.unpack_tuple(b, da.shape)[0]
        stride = cgutils.unpack_tuple(b, da.strides)[0]
        base = b.bitcast(da.data, ir.PointerType(I8))
        words = b.bitcast(pa.data, ir.PointerType(I32))
        last = b.sub(rows, i64(1))
        per_chunk = max(1, CHUNK // size)
        chunks = b.udiv(b.add(nb, i64(per_chunk - 1)), i64(per_chunk))
        with cgutils.for_range(b, chunks) as chunk:
            first_block = b.mul(chunk.index, i64(per_chunk))
            end = b.add(first_block, i64(per_chunk))
            end = b.select(b.icmp_signed("<", end, nb), end, nb)
            for group in range(2):
                row_ptrs = []
                for j in range(16):
                    r = b.add(r0, i64(16 * group + j))
                    r = b.select(b.icmp_signed("<", r, rows), r, last)
                    row_ptrs.append(b.gep(base, [b.mul(r, stride)]))
                with cgutils.for_range_slice(b, first_block, end, i64(1)) as (k, _):
                    blks = [b.gep(row, [b.mul(k, i64(nbytes))]) for row in row_ptrs]
                    for blk in blks:
                        prefetch(b, b.gep(blk, [i64(per_chunk * nbytes)]))  # the row's next chunk
                    _pack_group_block(b, name, on, blks, k, group, words, sa.data, ma.data)
        return context.get_dummy_value()
    return types.none(kind, path, data, r0, nb, packed, scales, mins), codegen


def _pack_group_block(b, name, path, blks, k, group, words, scales, mins):
    """Block k of the 16 rows of a group (at blks) into its packed lines for `path` (lines(name, path) a 32
    values), their scales and negated mins."""
    count = lines(name, path)
    first_sub = b.mul(k, i64(BLOCKS[name].size // 32))
    for j, blk in enumerate(blks):
        scale, negmins = _block_scales(b, name, blk)
        at = b.add(b.mul(first_sub, i64(SCALES[name] * PANEL)), i64(16 * group + j))
        _scatter(b, scale, b.gep(scales, [at]), PANEL)
        if negmins is not None:
            _scatter(b, negmins, b.gep(mins, [b.add(b.mul(first_sub, i64(PANEL)), i64(16 * group + j))]),
                     PANEL)
    if count == 16:  # Q8_0's pairs
        rows = [b.bitcast(b.sext(load_vector(b, blk, 2, I8, 32), I16X32), I32X16) for blk in blks]
        first = b.mul(b.add(b.mul(first_sub, i64(2)), i64(group)), i64(16 * 16))
        for p, line in enumerate(transposed(b, rows)):
            store_vector(b, b.gep(words, [first]), 16 * p, line)
        return
    for c in range(BLOCKS[name].size // 64 or 1):
        runs = [_runs(b, name, path, blk, c) for blk in blks]
        for h in range(len(runs[0])):
            pairs = [b.bitcast(concatenated(b, [runs[i][h], runs[i + 8][h]]), ir.VectorType(I32, 16))
                     for i in range(8)]
            sub = b.add(first_sub, i64(2 * c + h))
            first = b.mul(b.add(b.mul(sub, i64(2)), i64(group)), i64(8 * 16))
            fours = transposed(b, pairs)
            for g, line in enumerate(_eights(b, fours) if path == "i8mm" else fours):
                store_vector(b, b.gep(words, [first]), 16 * g, line)


def _eights(b, fours):
    """The 8 lines of fours (<16 x i32>, line g: word j is weight row j's quants 4g..4g+3) as lines of eights:
    line 2e, 2e + 1 the words of fours 2e and 2e + 1 interleaved, of rows 0-7 and 8-15."""
    return [pick(b, fours[2 * e], fours[2 * e + 1], [j // 2 + 16 * (j % 2) + 8 * h for j in range(16)])
            for e in range(4) for h in range(2)]


def _parts(b, name, path, halves, k):
    """Block k's parts, each (the int32 sums' start per row of x, the steps of its packed lines it spans, its
    scale's index): the offset of the unsigned quants times x's sums (halves: each row's two sums of 16 q)."""
    if name == "q8_0" and lines(name, path) == 16:  # signed pairs: no offset
        return [([ir.Constant(I32, 0)] * len(halves), range(16), k)]
    if name == "q8_0" and path in ARM_PATHS:  # signed fours: no offset
        return [([ir.Constant(I32, 0)] * len(halves), range(8), k)]
    if name == "q8_0":
        return [([b.mul(b.add(*hv), ir.Constant(I32, -128)) for hv in halves], range(8), k)]
    if name == "q4_k":
        return [([ir.Constant(I32, 0)] * len(halves), range(8), k)]
    return [([b.mul(hv[h], ir.Constant(I32, -32)) for hv in halves], range(4 * h, 4 * h + 4),
             b.add(b.mul(k, i64(2)), i64(h))) for h in range(2)]


# AVX2: fours whose int16 pair sums are added before vpmaddwd widens them. Each pair of products is at most
# 2 * 15 * 127 for Q4_K (eight such sums stay below 2^15) and 2 * 63 * 127 for Q6_K (two do).
INT16_RUN = {"q4_k": 8, "q6_k": 2}
I16X32, I32X16 = ir.VectorType(I16, 32), ir.VectorType(I32, 16)


def _integer_sums(b, name, path, words, qrows, k, starts, steps):
    """[row of x][group of 16 weight rows] <16 x i32>: starts + the products over the steps (fours or pairs)
    of block k."""
    sums = [[splat(b, start)] * 2 for start in starts]
    if lines(name, path) == 16:
        # a loop over the pairs, which LLVM unrolls by two: the 16 pairs written out, it summed each row's
        # products in a tree and kept all 16 pairs' weight lines for the next row, spilling them
        acc = [[cgutils.alloca_once_value(b, s) for s in row] for row in sums]
        with cgutils.for_range(b, i64(len(steps))) as loop:
            w = [b.bitcast(line, I16X32) for line in _weight_lines(b, words, 16, k, loop.index)]
            for row, xp in zip(acc, _x_pairs(b, qrows, k, loop.index)):
                for c in range(2):
                    b.store(b.add(b.load(row[c]), _word_products(b, w[c], xp)), row[c])
        return [[b.load(a) for a in row] for row in acc]
    if path == "i8mm":
        return _tile_sums(b, words, qrows, k, starts, steps)
    run = INT16_RUN[name] if path == "avx2" else 1
    for first in range(0, len(steps), run):
        pairs = None  # AVX2: [row of x][group] the run's int16 pair sums, two halves
        for g in steps[first:first + run]:
            w = [b.bitcast(line, ir.VectorType(I8, 64)) for line in _weight_lines(b, words, 8, k, i64(g))]
            xbs = _x_fours(b, qrows, k, g)
            if path != "avx2":
                dot = vpdpbusd if path == "vnni" else sdot
                sums = [[dot(b, sums[r][c], w[c], xb) for c in range(2)] for r, xb in enumerate(xbs)]
                continue
            step = [[pair_products(b, w[c], xb) for c in range(2)] for xb in xbs]
            pairs = step if pairs is None else [[[b.add(p, q) for p, q in zip(ps, qs)]
                                                 for ps, qs in zip(rp, rq)] for rp, rq in zip(pairs, step)]
        if pairs is not None:
            sums = [[b.add(s, pair_sums(b, p)) for s, p in zip(row_sums, row_pairs)]
                    for row_sums, row_pairs in zip(sums, pairs)]
    return sums


def _tile_sums(b, words, qrows, k, starts, steps):
    """_integer_sums on the i8mm path: per pair of rows of x and group of 16 weight rows, 8 tiles of 2 x 2
    int32 sums (weight rows 2p, 2p + 1), smmla over the eights the steps (fours) span; then each row's lanes
    in weight row order."""
    sums = []
    for pair in range(0, len(qrows), 2):
        start = pick(b, splat(b, starts[pair], 2), splat(b, starts[pair + 1], 2), [0, 1, 2, 3])
        tiles = [[start] * 8 for _ in range(2)]
        for e in range(steps[0] // 2, (steps[-1] + 1) // 2):
            rows = concatenated(b, [_x_eight(b, qrow, k, e) for qrow in qrows[pair:pair + 2]])
            halves = [_weight_lines(b, words, 8, k, i64(2 * e + h)) for h in range(2)]  # [h][group]
            for c in range(2):
                w = [b.bitcast(half[c], ir.VectorType(I8, 64)) for half in halves]
                cols = [lanes(b, w[p // 4], range(16 * (p % 4), 16 * (p % 4) + 16)) for p in range(8)]
                tiles[c] = [smmla(b, tile, rows, col) for tile, col in zip(tiles[c], cols)]
        for r in range(2):
            order = [4 * (j // 2) + 2 * r + j % 2 for j in range(16)]
            sums.append([lanes(b, concatenated(b, tiles[c]), order) for c in range(2)])
    return sums


def _x_eight(b, qrow, k, e):
    """<8 x i8>: x's quants 8e..8e+7 of block k, in the row at qrow."""
    return load_vector(b, b.gep(qrow, [b.add(b.mul(k, i64(32)), i64(8 * e))]), 0, I8, 8)


def _weight_lines(b, words, count, k, g):
    """The two groups' lines g (an i64) of block k (of `count` a block), <16 x i32> each."""
    line0 = b.add(b.mul(k, i64(2 * count * 16)), b.mul(g, i64(16)))
    return [load_vector(b, b.gep(words, [b.add(line0, i64(16 * count * c))]), 0, I32, 16) for c in range(2)]


def _x_pairs(b, qrows, k, p):
    """Each row's pair p (an i64) of x's int16 at block k, broadcast to <32 x i16>."""
    out = []
    for qrow in qrows:
        at = b.gep(qrow, [b.add(b.mul(k, i64(32)), b.mul(p, i64(2)))])
        pair = b.load(b.bitcast(at, ir.PointerType(I32)))
        pair.align = 2
        out.append(b.bitcast(splat(b, pair), I16X32))
    return out


def _word_products(b, w, x):
    """<16 x i32>: vpmaddwd on each 256-bit half of two <32 x i16>: each pair of int16 products summed."""
    v16 = ir.VectorType(I16, 16)
    madd = cgutils.get_or_insert_function(b.module, ir.FunctionType(ir.VectorType(I32, 8), [v16] * 2),
                                          "llvm.x86.avx2.pmadd.wd")
    return concatenated(b, [b.call(madd, [lanes(b, v, range(16 * h, 16 * h + 16)) for v in (w, x)])
                            for h in range(2)])


def _x_fours(b, qrows, k, g):
    """Each row's four int8 of x at four g of block k, broadcast to <64 x i8>."""
    out = []
    for qrow in qrows:
        at = b.gep(qrow, [b.add(b.mul(k, i64(32)), i64(4 * g))])
        four = b.load(b.bitcast(at, ir.PointerType(I32)))
        four.align = 1
        out.append(b.bitcast(splat(b, four), ir.VectorType(I8, 64)))
    return out


def _panel_lines(b, base, index):
    """The two <16 x float> at row `index` of a [.., 32] float32 array of the panel (scales or mins)."""
    return [load_vector(b, b.gep(base, [b.add(b.mul(index, i64(PANEL)), i64(16 * c))]), 0, F32, 16)
            for c in range(2)]


@intrinsic(prefer_literal=True)
def _rows_times_panel(typingctx, kind, path, packed, scales, mins, q, d, sums, x0, k0, k1, partial, out,
                      col0):
    """Rows x0.. x0 + call_rows(kind, path) - 1 of x (q int8 [n', 32nb], int16 for the pairs layout; d float32
    [n', nb]; sums int32 [n', 2nb]: each 16 values' sum of q) times the packed panel of `kind` over its
    32-value blocks k0.. k1 - 1, on `path` ("vnni" or "avx2"), term by term in block order: added to their
    sums over the blocks before k0, kept in partial [n', 32] float32, and where k1 is the last block, written
    to out[x0.., col0.. col0+31] (the rows and columns out has), else to partial."""
    if not isinstance(kind, types.StringLiteral) or not isinstance(path, types.StringLiteral):
        return None
    name, on = kind.literal_value, path.literal_value

    def codegen(context, builder, sig, args):
        pa, sa, ma, qa, da, ta, ua, oa = (context.make_array(sig.args[i])(context, builder, args[i])
                                          for i in (2, 3, 4, 5, 6, 7, 11, 12))
        x0, k0, k1, col0 = args[8], args[9], args[10], args[13]
        b = builder
        nb = cgutils.unpack_tuple(b, da.shape)[1]
        n = call_rows(name, on)
        qrows = [b.gep(qa.data, [b.mul(b.add(x0, i64(r)), b.mul(nb, i64(32)))]) for r in range(n)]
        drows = [b.mul(b.add(x0, i64(r)), nb) for r in range(n)]
        words = b.bitcast(pa.data, ir.PointerType(I32))
        sums_at = [[b.gep(ua.data, [b.add(b.mul(b.add(x0, i64(r)), i64(PANEL)), i64(16 * c))])
                    for c in range(2)] for r in range(n)]
        acc = [[cgutils.alloca_once_value(b, ir.Constant(V16, None)) for _ in row] for row in sums_at]
        with b.if_then(b.icmp_signed(">", k0, i64(0))):
            for row, row_at in zip(acc, sums_at):
                for a, at in zip(row, row_at):
                    b.store(load_vector(b, at, 0, F32, 16), a)
        with cgutils.for_range_slice(b, k0, k1, i64(1)) as (k, _):
            halves = [[b.load(b.gep(ta.data, [b.add(b.mul(b.add(drows[r], k), i64(2)), i64(h))]))
                       for h in range(2)] for r in range(n)]
            dx = [splat(b, b.load(b.gep(da.data, [b.add(drows[r], k)]))) for r in range(n)]
            for starts, steps, index in _parts(b, name, on, halves, k):
                sums = _integer_sums(b, name, on, words, qrows, k, starts, steps)
                dw = _panel_lines(b, sa.data, index)
                for r in range(n):
                    for c in range(2):
                        mac(b, acc[r][c], b.sitofp(sums[r][c], V16), b.fmul(dw[c], dx[r]))
            if name == "q4_k":  # less min * the block's sum of x
                mn = _panel_lines(b, ma.data, k)
                for r in range(n):
                    xs = b.fmul(dx[r], splat(b, b.sitofp(b.add(*halves[r]), F32)))
                    for c in range(2):
                        mac(b, acc[r][c], mn[c], xs)
        with b.if_else(b.icmp_signed("==", k1, nb)) as (last, before):
            with last:
                store_rows(b, oa, acc, x0, col0)
            with before:
                for row, row_at in zip(acc, sums_at):
                    for a, at in zip(row, row_at):
                        store_vector(b, at, 0, b.load(a))
        return context.get_dummy_value()
    return types.none(kind, path, packed, scales, mins, q, d, sums, x0, k0, k1, partial, out, col0), codegen


@njit(cache=True)
def _quantize_rows(x, nb, flat, d, sums, first, last):  # rows first <= r < last of quantized_rows' outputs
    fours = np.empty(8, np.int32)
    for r in range(first, last):
        for k in range(nb):
            d[r, k] = quantize_block(x, r, k, flat, r * 32 * nb + 32 * k, fours)
            for h in range(2):
                sums[r, 2 * k + h] = fours[4 * h:4 * h + 4].sum()


@njit(cache=True)
def _zeroed_outputs(n, nb):  # quantized_rows' outputs for n rows, zeros
    padded = (n + X_ROWS - 1) // X_ROWS * X_ROWS
    return (np.zeros((padded, 32 * nb), np.int8), np.zeros((padded, nb), np.float32),
            np.zeros((padded, 2 * nb), np.int32))


@njit(cache=True)
def quantized_rows(x, nb):
    """x float32 [n, >= 32nb] -> q int8 [n', 32nb], d float32 [n', nb], sums int32 [n', 2nb] (each 16 values'
    sum of q); n' = n rounded up to X_ROWS, zeros past n."""
    q, d, sums = _zeroed_outputs(x.shape[0], nb)
    _quantize_rows(x, nb, q.reshape(-1), d, sums, np.int64(0), x.shape[0])  # not a literal 0: one signature
    return q, d, sums


QUANTIZE_ROWS = 16  # rows of x a task of quantized_rows_parallel quantizes


# Tasks of rows calling the serial loop, not a row per task: numba compiled a parallel loop whose body
# allocated (fours) and summed slices in about 2 s on a Zen 4, this one in under 1 s
# (tools/bench/first_run.py: slowest_own_s)
@njit(parallel=True, cache=True)
def quantized_rows_parallel(x, nb):  # quantized_rows, the rows shared among numba's threads
    q, d, sums = _zeroed_outputs(x.shape[0], nb)
    flat, n = q.reshape(-1), x.shape[0]
    for i in prange((n + QUANTIZE_ROWS - 1) // QUANTIZE_ROWS):
        _quantize_rows(x, nb, flat, d, sums, i * QUANTIZE_ROWS, min((i + 1) * QUANTIZE_ROWS, n))
    return q, d, sums


# below this many blocks (a short clip's rows) starting a parallel region costs more than the quantizing it
# would split
PARALLEL_BLOCKS = 4096


@njit(cache=True)
def _as_int16(q):  # x's quants as the pairs layout's kernel reads them
    return q.astype(np.int16)


@njit(cache=True)
def _as_int8(q):  # the fours layout reads x's quants as they are (one driver body for both layouts)
    return q


def _x_quants(count, q):  # x's quants as the layout of `count` lines reads them: compiled code only
    raise NotImplementedError("compiled code only: numba picks the layout when the driver compiles")


@overload(_x_quants, prefer_literal=True)
def _x_quants_kernel(count, q):
    """_as_int16 for the pairs layout (16 lines), _as_int8 for the fours, by the literal `count`: a number
    in the driver's closure, where a dispatcher would pickle differently in every process and so change
    the driver's cache key (numba keys a cached function by its closure's pickled contents)."""
    if not isinstance(count, types.IntegerLiteral):
        return None
    layout = _as_int16 if count.literal_value == 16 else _as_int8
    return lambda count, q: layout(q)


def _driver(kind: str, path: str):
    """The product for `kind` on `path`: x float32 [n, >= 32nb'] @ W.T -> out float32 [n, rows], W `kind`
    data of nb whole blocks a row (nb' = nb * values per block / 32)."""
    per = BLOCKS[kind].size // 32
    scales_per, rows_a_call, count = SCALES[kind], call_rows(kind, path), lines(kind, path)
    k_chunk = K_CHUNK_BLOCKS[path]

    def gemm(x, data, nb, out):
        if x.shape[0] * nb * per >= PARALLEL_BLOCKS:
            q, d, sums = quantized_rows_parallel(x, nb * per)
        else:
            q, d, sums = quantized_rows(x, nb * per)
        q = _x_quants(count, q)
        panels = (data.shape[0] + PANEL - 1) // PANEL
        for t in prange(panels):
            packed = np.empty((nb * per, 2, count, 64), np.uint8)
            scales = np.empty((nb * per * scales_per, PANEL), np.float32)
            mins = np.empty((nb * per, PANEL), np.float32)
            _pack_panel(kind, path, data, t * PANEL, nb, packed, scales, mins)
            partial = np.empty((q.shape[0] if nb * per > k_chunk else 1, PANEL), np.float32)
            for k0 in range(0, nb * per, k_chunk):
                for x0 in range(0, q.shape[0], rows_a_call):
                    _rows_times_panel(kind, path, packed, scales, mins, q, d, sums, x0, k0,
                                      min(nb * per, k0 + k_chunk), partial, out, t * PANEL)
    gemm.__name__ = gemm.__qualname__ = f"gemm_{kind}_int8_{path}"
    return njit(parallel=True, cache=True)(gemm)


GEMM_INT8 = {(kind, path): _driver(kind, path) for path in PATHS for kind in KINDS}
