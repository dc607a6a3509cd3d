"""The ceiling the vector instructions set on this CPU: multiply-adds per second per core, for the steps the
stored-weight products are built of, where nothing but those instructions held them back.

    python tools/bench/isa_peak.py [--isa native|avx2] [--threads 2] [--seconds 0.5] [--json out.json]

Each step runs in CHAINS independent chains, each chain's result an operand of its next step, so that the
instructions' ports set the pace rather than their latency, and LLVM can neither hoist nor fold them:
  fp32 FMA 256    vfmadd on 8 floats: what float32 BLAS multiplies with on AVX2 (and Transformers fp32);
  fp32 FMA 512    the same on 16 floats, with AVX-512;
  int8 pairs      vpmaddwd + vpaddd on 256 bits: 16 int16 products a step, the int8 GEMM's step for Q8_0
                  weights on AVX2 (kernels/int8/gemm.py);
  int8 fours      vpmaddubsw + vpmaddwd + vpaddd on 256 bits: 32 products of unsigned by signed bytes a
                  step, the int8 GEMM's for Q4_K and Q6_K on AVX2 (their quants are unsigned);
  int8 signed fours  the same after vpsignb gives one operand the other's signs: signed by signed bytes
                  (Q8_0's quants), the AVX2 decode kernels' step (kernels/int8/dot.py, whose sign step
                  compiles to vpxor + vpsubb: one instruction more than here);
  int8 VNNI       vpdpbusd on 512 bits: 64 byte products a step, with AVX512-VNNI.
Each line gives G multiply-adds per second on one thread and on `--threads` (one chain set per thread), and
the one-thread rate against the 256-bit FMA's: how much faster than float32 arithmetic an int8 product on
that step can run at best. `--isa avx2` holds the compile to an AVX2-only CPU's instructions (the lines it
lacks are left out); the rates are this machine's cores'. Where AVX512-VNNI is there, LLVM fuses vpmaddwd +
vpaddd into vpdpwssd, so the AVX2 steps' native lines measure that instead.
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from tools.lib.measure import rerun_without_blas_vars  # noqa: E402

rerun_without_blas_vars()

import argparse  # noqa: E402
from functools import cache  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import get_num_threads, njit, prange, set_num_threads, types  # noqa: E402
from numba.core import cgutils  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from nanoasr.kernels import target  # noqa: E402
from nanoasr.kernels.ir.vector import F32, I8, I16, I32, splat  # noqa: E402

CHAINS = 12  # above each step's latency times its throughput: 4-8 cycles at 1-2 a cycle


def _call(b, name, ret, args):
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return b.call(fn, args)


def _fma(b, acc):  # acc * 0.5 + 1: converges to 2, never subnormal
    n = acc.type.count
    return _call(b, f"llvm.fma.v{n}f32", acc.type, [acc, splat(b, ir.Constant(F32, 0.5), n),
                                                    splat(b, ir.Constant(F32, 1.0), n)])


def _pairs(b, acc):  # acc + vpmaddwd(acc as 16 int16, 3s)
    v16 = ir.VectorType(I16, 16)
    products = _call(b, "llvm.x86.avx2.pmadd.wd", acc.type, [b.bitcast(acc, v16), ir.Constant(v16, [3] * 16)])
    return b.add(acc, products)


def _fours(b, acc):  # acc + vpmaddwd(vpmaddubsw(acc as 32 bytes, 3s), 1s)
    v32, v16 = ir.VectorType(I8, 32), ir.VectorType(I16, 16)
    halves = _call(b, "llvm.x86.avx2.pmadd.ub.sw", v16, [b.bitcast(acc, v32), ir.Constant(v32, [3] * 32)])
    products = _call(b, "llvm.x86.avx2.pmadd.wd", acc.type, [halves, ir.Constant(v16, [1] * 16)])
    return b.add(acc, products)


def _signed_fours(b, acc):  # _fours on |x| (3s) and w with x's sign (vpsignb): signed times signed bytes
    v32, v16 = ir.VectorType(I8, 32), ir.VectorType(I16, 16)
    signed = _call(b, "llvm.x86.avx2.psign.b", v32, [b.bitcast(acc, v32), ir.Constant(v32, [1, -1] * 16)])
    halves = _call(b, "llvm.x86.avx2.pmadd.ub.sw", v16, [ir.Constant(v32, [3] * 32), signed])
    return b.add(acc, _call(b, "llvm.x86.avx2.pmadd.wd", acc.type, [halves, ir.Constant(v16, [1] * 16)]))


def _vnni(b, acc):  # vpdpbusd(acc, acc's bytes, 3s)
    threes = ir.Constant(acc.type, [0x03030303] * 16)
    return _call(b, "llvm.x86.avx512.vpdpbusd.512", acc.type, [acc, acc, threes])


# name: (step, accumulator lanes and type, multiply-adds a step, the target features it needs)
STEPS = {
    "fp32 FMA 256": (_fma, ir.VectorType(F32, 8), 8, ("avx2", "fma")),
    "fp32 FMA 512": (_fma, ir.VectorType(F32, 16), 16, ("avx512f",)),
    "int8 pairs": (_pairs, ir.VectorType(I32, 8), 16, ("avx2",)),
    "int8 fours": (_fours, ir.VectorType(I32, 8), 32, ("avx2",)),
    "int8 signed fours": (_signed_fours, ir.VectorType(I32, 8), 32, ("avx2",)),
    "int8 VNNI": (_vnni, ir.VectorType(I32, 16), 64, ("avx512vnni",)),
}


def _chains_intrinsic(step, vector):
    @intrinsic
    def chains(typingctx, n, start):
        """CHAINS chains of n steps from lanes of `start` (float64, converted to the lanes' type); returns the
        sum of every chain's first lane, so nothing is dead."""
        def codegen(context, builder, sig, args):
            b, (count, first) = builder, args
            lane = b.fptosi(first, vector.element) if isinstance(vector.element, ir.IntType) else b.fptrunc(
                first, vector.element)
            accs = [cgutils.alloca_once_value(b, splat(b, lane, vector.count)) for _ in range(CHAINS)]
            with cgutils.for_range(b, count):
                for acc in accs:
                    b.store(step(b, b.load(acc)), acc)
            total = ir.Constant(ir.DoubleType(), 0.0)
            for acc in accs:
                head = b.extract_element(b.load(acc), ir.Constant(I32, 0))
                wide = b.sitofp(head, ir.DoubleType()) if isinstance(head.type, ir.IntType) else b.fpext(
                    head, ir.DoubleType())
                total = b.fadd(total, wide)
            return total
        return types.float64(n, start), codegen
    return chains


def available(features=None) -> list[str]:
    """The steps this compile target has the instructions for."""
    features = target.features() if features is None else features
    return [name for name, (*_, needs) in STEPS.items() if all(features.get(f) for f in needs)]


@cache
def chain_runner(name: str):
    """An njit function (n, start, threads) -> float64 [threads]: CHAINS chains of n `name` steps on each of
    `threads` threads."""
    chains = _chains_intrinsic(*STEPS[name][:2])

    @njit(parallel=True)
    def run(n, start, threads):
        out = np.empty(threads, np.float64)
        for t in prange(threads):
            out[t] = chains(n, start + t)
        return out
    return run


def rate(name: str, threads: int, seconds: float) -> float:
    """G multiply-adds per second of `name`'s chains over `threads` threads, the best of three timings of
    about `seconds` each."""
    run = chain_runner(name)
    run(16, 1.0, threads)  # compiles
    n, elapsed = 1 << 14, 0.0
    while elapsed < seconds / 10:  # then scaled to a count that takes about `seconds`
        n *= 4
        elapsed = _seconds(run, n, threads)
    n = max(n, int(n * seconds / elapsed))
    best = min(_seconds(run, n, threads) for _ in range(3))
    return n * CHAINS * STEPS[name][2] * threads / best / 1e9


def _seconds(run, n, threads) -> float:
    start = time.perf_counter()
    run(n, 1.0, threads)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=get_num_threads())
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--isa", choices=("native", "avx2"), default="native",
                    help="avx2: held to an AVX2-only CPU's instructions "
                         "(tools/lib/measure.py; applied on start)")
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args()
    set_num_threads(args.threads)
    rows = {name: {"one_thread": rate(name, 1, args.seconds),
                   "threads": rate(name, args.threads, args.seconds)} for name in available()}
    base = rows["fp32 FMA 256"]["one_thread"] if "fp32 FMA 256" in rows else None
    print(f"{platform.machine()}, target {target_name()}, {args.threads} threads; G multiply-adds per second")
    print(f"{'step':<18} {'1 thread':>9} {f'{args.threads} threads':>10} {'x FMA 256':>10}")
    for name, r in rows.items():
        ratio = f"{r['one_thread'] / base:.2f}" if base else ""
        print(f"{name:<18} {r['one_thread']:9.1f} {r['threads']:10.1f} {ratio:>10}")
    if args.json:
        args.json.write_text(json.dumps({"target": target_name(), "isa": args.isa, "threads": args.threads,
                                         "gmac_per_s": rows}, indent=1) + "\n")


def target_name() -> str:
    import llvmlite.binding as llvm
    from numba.core import config

    return config.CPU_NAME or llvm.get_host_cpu_name()


if __name__ == "__main__":
    main()
