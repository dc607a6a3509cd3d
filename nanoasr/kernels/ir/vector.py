"""LLVM vector building blocks for the stored-weight kernels (llvmlite IR, emitted inside numba intrinsics).

Numba leaves LLVM's SLP vectoriser off, and its loop vectoriser unrolls the 32-element loop inside a block and
then vectorises across blocks with byte inserts and gathers (4-8 GB/s measured), so block work is written as
explicit vector code with these helpers.
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from nanoasr.kernels import target

F32 = ir.FloatType()
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
V16 = ir.VectorType(F32, 16)


def i64(value: int) -> ir.Constant:
    return ir.Constant(ir.IntType(64), value)


def load_vector(builder, base, off, elty, n):
    """Load n elements of elty at element offset `off` (an int) of pointer `base`, unaligned."""
    ptr = builder.gep(base, [i64(off)]) if off else base
    v = builder.load(builder.bitcast(ptr, ir.PointerType(ir.VectorType(elty, n))))
    v.align = 1
    return v


def store_vector(builder, base, off, value):
    """Store a vector at element offset `off` (an int) of pointer `base` (of the vector's element type)."""
    ptr = builder.gep(base, [i64(off)]) if off else base
    builder.store(value, builder.bitcast(ptr, ir.PointerType(value.type))).align = 1


def splat(builder, value, n=16):
    """<n x value's type> with `value` in every lane."""
    empty = ir.Constant(ir.VectorType(value.type, n), None)
    return lanes(builder, builder.insert_element(empty, value, ir.Constant(I32, 0)), [0] * n)


def store_first(builder, at, line, room):
    """The first `room` (an i64, up to 16) of the 16 floats `line` at `at`: one masked store."""
    i64x16 = ir.VectorType(ir.IntType(64), 16)
    mask = builder.icmp_signed("<", ir.Constant(i64x16, list(range(16))), splat(builder, room))
    ptr = builder.bitcast(at, ir.PointerType(line.type))
    fnty = ir.FunctionType(ir.VoidType(), [line.type, ptr.type, I32, mask.type])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.masked.store.v16f32.p0")
    builder.call(fn, [line, ptr, ir.Constant(I32, 4), mask])


def store_rows(builder, out, acc, x0, col0):
    """acc[r][c] (allocas of <16 x float>) to out[x0 + r, col0 + 16c..] (out: a float32 [m, n] C-contiguous
    array's struct), the rows and columns out has."""
    b = builder
    m, n = cgutils.unpack_tuple(b, out.shape)
    for r, row_accs in enumerate(acc):
        row = b.add(x0, i64(r))
        with b.if_then(b.icmp_signed("<", row, m)):
            for c, a in enumerate(row_accs):
                col = b.add(col0, i64(16 * c))
                with b.if_then(b.icmp_signed("<", col, n)):
                    store_first(b, b.gep(out.data, [b.add(b.mul(row, n), col)]), b.load(a), b.sub(n, col))


def lanes(builder, v, idx):
    """Lanes idx of v (repeats allowed: a splat is lanes(v, [i] * n))."""
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, len(idx)), list(idx)))


def pick(builder, a, b, idx):
    """Lanes idx of a and b side by side (b's lanes numbered from len(a))."""
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, len(idx)), idx))


def concatenated(builder, vectors):
    """The vectors (one type, a power of two of them) side by side, in order, as one vector."""
    vectors = list(vectors)
    while len(vectors) > 1:
        vectors = [pick(builder, u, v, list(range(2 * u.type.count)))
                   for u, v in zip(vectors[::2], vectors[1::2])]
    return vectors[0]


def bytes_of(value, n=32):
    """<n x i8> constant: `value` in every lane, or a list of lanes."""
    return ir.Constant(ir.VectorType(I8, n), value if isinstance(value, list) else [value] * n)


def pad16(builder, v):
    """<8 x float> as <16 x float>, zeros above."""
    return pick(builder, v, ir.Constant(v.type, None), list(range(16)))


def mac(builder, ptr, a, b):
    """*ptr += a * b for float vectors, rounded once (llvm.fma)."""
    ty = a.type
    fnty = ir.FunctionType(ty, [ty] * 3)
    fma = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.fma.v{ty.count}f32")
    builder.store(builder.call(fma, [a, b, builder.load(ptr)]), ptr)


def prefetch(builder, ptr):
    """Ask for the cache line at ptr (i8*), into the cache level target.weight_prefetch names. With several
    rows of x each weight line keeps the core busy for many cycles, and the hardware prefetcher does not run
    far enough ahead of such a slow stream."""
    fnty = ir.FunctionType(ir.VoidType(), [ptr.type, I32, I32, I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    locality = ir.Constant(I32, target.weight_prefetch().locality)
    builder.call(fn, [ptr, ir.Constant(I32, 0), locality, ir.Constant(I32, 1)])


def unrolled_loop(builder, count, unroll, body):
    """body(index) for index < count, the loop unrolled `unroll` times."""
    main = builder.udiv(count, i64(unroll))
    with cgutils.for_range(builder, main) as loop:
        for u in range(unroll):
            body(builder.add(builder.mul(loop.index, i64(unroll)), i64(u)))
    with cgutils.for_range(builder, builder.sub(count, builder.mul(main, i64(unroll)))) as loop:
        body(builder.add(builder.mul(main, i64(unroll)), loop.index))


def lane_sums(builder, vs):
    """<len(vs) x float> of the lane sums of the 16-lane vectors vs (a power of two of them, at most 16):
    pairs are folded into vectors of half-length segments until one is left, then its segments summed."""
    seg = 16
    while len(vs) > 1:
        half = seg // 2
        lo = [s * seg + j for s in range(16 // seg) for j in range(half)]
        lo += [16 + i for i in lo]
        hi = [i + half for i in lo]
        vs = [builder.fadd(pick(builder, a, b, lo), pick(builder, a, b, hi))
              for a, b in zip(vs[::2], vs[1::2])]
        seg = half
    v, width = vs[0], 16
    while seg > 1:
        half = seg // 2
        lo = [s * seg + j for s in range(width // seg) for j in range(half)]
        v = builder.fadd(lanes(builder, v, lo), lanes(builder, v, [i + half for i in lo]))
        seg, width = half, width // 2
    return v


def transposed(builder, lines):
    """n lines of 16 lanes (n = 2, 4, 8 or 16), each group of n lanes transposed with the lines: bit b of the
    line and of the lane index swapped for each b < n (16 lines: the 16 columns; 8 lines: two 8 x 8 blocks
    side by side)."""
    lines, bits = list(lines), [1 << t for t in range(len(lines).bit_length() - 1)]
    for b in bits:
        low = [c if not c & b else 16 + c - b for c in range(16)]
        high = [c + b if not c & b else 16 + c for c in range(16)]
        for i in range(len(lines)):
            if not i & b:
                lines[i], lines[i + b] = pick(builder, lines[i], lines[i + b], low), \
                    pick(builder, lines[i], lines[i + b], high)
    return lines
