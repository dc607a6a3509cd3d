"""The product's inner loop as one LLVM intrinsic: out[:, r0:r1] = x @ W[r0:r1].T for a task of weight rows.

x comes packed as [cols/16, nx, 16] (16 columns of every row of x side by side, nx = 1, 4 or 8), so the
columns that meet one 16-lane weight vector are nx consecutive vectors. Each weight vector is decoded once
into a register and multiplied into all rows of x (one accumulator per row); two weight rows are decoded
together, so each load of x feeds two FMAs and two weight streams are in flight; the partial-sum vectors of a
weight row are reduced together once per pass over the columns (lane_sums). Weight lines a few rows ahead
are prefetched (target.weight_prefetch): the hardware prefetcher alone does not run far enough ahead. A row
of x gets the same arithmetic in the same order whatever rows share its batch, so batched decoding picks the
same tokens as decoding alone.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from nanoasr.kernels import target
from nanoasr.kernels.ir.blocks import BLOCKS
from nanoasr.kernels.ir.vector import (F32, I8, I32, V16, i64, lane_sums, load_vector, mac, pad16,
                                       prefetch, unrolled_loop)

_TILE = 4096  # columns per pass: whole rows at these models' widths measured fastest
ROWS = 32  # weight rows per parallel task
_PAIR = 2  # weight rows decoded together, so that each load of x feeds two FMAs


@intrinsic(prefer_literal=True)
def rows_dot(typingctx, kind, nx, data, packed, sums, nb, r0, r1, out):
    """out[:, r0:r1] = x @ W[r0:r1].T over the first nb blocks of each row of data (W stored as `kind`),
    r1 - r0 <= ROWS, for x packed [nb*size/16, nx, 16] (sums: its 32-column sums packed [nb, nx, 16], 8 sums
    and 8 zeros, met with the mins of the types that have them); rows of x past out.shape[0] are padding, not
    written. kind (a storage type's name) and nx are compile-time constants."""
    if not isinstance(kind, types.StringLiteral) or not isinstance(nx, types.IntegerLiteral):
        return None

    def codegen(context, builder, sig, args):
        arrays = [context.make_array(sig.args[i])(context, builder, args[i]) for i in (2, 3, 4, 8)]
        RowsDot(builder, BLOCKS[kind.literal_value], nx.literal_value, *arrays).emit(*args[5:8])
        return context.get_dummy_value()
    return types.none(kind, nx, data, packed, sums, nb, r0, r1, out), codegen


class RowsDot:
    """The intrinsic's code, for one block type and nx rows of x."""

    def __init__(self, builder, block, nx, data, packed, sums, out):
        self.b, self.block, self.nx = builder, block, nx
        self.data, self.packed, self.sums, self.out = data, packed, sums, out

    def emit(self, nb, r0, r1):
        """Per pass over the columns (_TILE of them) and pair of weight rows: accumulate, then add the lane
        sums to the rows' totals; finally store the totals."""
        b = self.b
        base = b.bitcast(self.data.data, ir.PointerType(I8))
        stride = cgutils.unpack_tuple(b, self.data.strides)[0]
        rows = b.sub(r1, r0)
        vec = ir.VectorType(F32, self.nx)
        totals = cgutils.alloca_once(b, vec, size=ROWS)  # per row, summed over the passes
        with cgutils.for_range(b, rows) as row:
            b.store(ir.Constant(vec, None), b.gep(totals, [row.index]))
        accs = [[cgutils.alloca_once(b, V16) for _ in range(self.nx)] for _ in range(_PAIR)]
        step = max(1, _TILE // self.block.size)
        last = b.sub(rows, i64(1))
        ahead = b.mul(stride, i64(target.weight_prefetch().rows_ahead))
        with cgutils.for_range(b, b.udiv(b.add(nb, i64(step - 1)), i64(step))) as tile:
            k0 = b.mul(tile.index, i64(step))
            left = b.sub(nb, k0)
            kn = b.select(b.icmp_unsigned("<", left, i64(step)), left, i64(step))
            pairs = b.udiv(b.add(rows, i64(_PAIR - 1)), i64(_PAIR))
            with cgutils.for_range(b, pairs) as pair:
                # rows i, i+1 (the last row twice when the count is odd)
                first = b.mul(pair.index, i64(_PAIR))
                nxt = [b.add(first, i64(j)) for j in range(1, _PAIR)]
                idx = [first] + [b.select(b.icmp_unsigned("<", i, rows), i, last) for i in nxt]
                ptrs = [b.gep(base, [b.mul(b.add(r0, i), stride)]) for i in idx]
                self.accumulate(ptrs, accs, k0, kn, ahead)
                self.add_sums(totals, idx, accs)
        self.store(totals, rows, r0)

    def accumulate(self, ptrs, accs, k0, count, ahead):
        """accs = the rows at ptrs times x over `count` blocks from block k0."""
        b, block = self.b, self.block
        for a in sum(accs, []):
            b.store(ir.Constant(a.type.pointee, None), a)

        def step(index):
            index = b.add(index, k0)
            xb = b.gep(self.packed.data, [b.mul(index, i64(block.size * self.nx))])
            sb = b.gep(self.sums.data, [b.mul(index, i64(16 * self.nx))])
            blks = [b.gep(w, [b.mul(index, i64(block.nbytes))]) for w in ptrs]
            for blk in blks:  # the same block `ahead` rows on
                for line in range(0, block.nbytes, 64):
                    prefetch(b, b.gep(blk, [b.add(ahead, i64(line))]))
            self.block_fmas([self.decode(blk) for blk in blks], accs, xb, sb)
        unrolled_loop(b, count, block.unroll, step)

    def decode(self, blk):
        """(groups, -mins or None): the mins negated, to be added with an FMA against the column sums."""
        groups, mins = self.block.decode(self.b, blk)
        return groups, None if mins is None else self.b.fsub(ir.Constant(mins.type, None), mins)

    def block_fmas(self, decoded, accs, xb, sb):
        """accs[j][r] += (this block of weight row j) * (row r of x), for the decoded blocks of a step."""
        b, nx = self.b, self.nx
        for groups in zip(*(g for g, _ in decoded)):
            for qs in zip(*(q for _, q in groups)):
                ws = [q if s is None else b.fmul(q, s) for (q, _), (s, _) in zip(qs, groups)]
                for r in range(nx):
                    xv = load_vector(b, xb, qs[0][1] * nx + 16 * r, F32, 16)
                    for j, w in enumerate(ws):
                        mac(b, accs[j][r], w, xv)
        negated = [m for _, m in decoded]
        if negated[0] is not None:  # 8 lanes, widened
            for r in range(nx):
                sv = load_vector(b, sb, 16 * r, F32, 16)
                for j, m in enumerate(negated):
                    mac(b, accs[j][r], pad16(b, m), sv)

    def add_sums(self, totals, idx, accs):
        """totals[i] += the lane sums of row i's accumulators; a repeated row is added once."""
        b = self.b
        for j, i in enumerate(idx):
            at = b.gep(totals, [i])
            old = b.load(at)
            new = b.fadd(old, lane_sums(b, [b.load(a) for a in accs[j]]))
            if j:
                new = b.select(b.icmp_unsigned("==", i, idx[j - 1]), old, new)
            b.store(new, at)

    def store(self, totals, rows, r0):
        """out[r, r0 + row] = totals[row][r] for the rows r of x that out has."""
        b = self.b
        nout, orow = cgutils.unpack_tuple(b, self.out.shape)
        with cgutils.for_range(b, rows) as row:
            v = b.load(b.gep(totals, [row.index]))
            at = b.add(r0, row.index)
            for r in range(self.nx):
                with b.if_then(b.icmp_signed("<", i64(r), nout)):
                    b.store(b.extract_element(v, ir.Constant(I32, r)),
                            b.gep(self.out.data, [b.add(b.mul(i64(r), orow), at)]))
