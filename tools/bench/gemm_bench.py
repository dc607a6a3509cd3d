"""Many-row products (encoder, prefill) at the model's shapes: what widening the stored matrix costs.

    python tools/bench/gemm_bench.py [--threads 2] [--rows 167 500 196 1568] [--dtypes bf16 q8_0 ...]
                                     [--json out] [--isa native|avx2]

For more than backend.cpu.FUSED_ROWS rows nanoasr widens the stored matrix to float32 in a reused buffer and
multiplies with BLAS. For each shape, row count and stored type this times, in ms per product (medians):
  widen+BLAS  that product, as nanoasr runs it (backend.cpu.stored_matmul);
  BLAS f32    BLAS on a float32 copy made beforehand: what a float32 GEMM reading the stored type would
              have to beat (the same arithmetic; it would read 1-2 bytes a weight instead of 4, which
              matters little where the product runs near the arithmetic peak);
  tiled       widening 128 weight rows at a time into a buffer that stays in cache, each followed by its
              BLAS product (the widened copy is never written to memory);
  AMX bf16    (BF16 weights, on CPUs with AMX) the product with bf16 activations: rows rounded to bf16,
              AMX tiles reading the stored matrix (kernels/bf16/amx.py), BLAS kept to one thread as the model
              keeps it (first, after a pause: BLAS's threads spin for a while after the previous shape);
  bf16 GEMM   (BF16 weights, on CPUs with AVX512-BF16) the same product with vdpbf16ps, reading the stored
              matrix (kernels/bf16/avx512.py), BLAS kept to one thread and a pause first;
  int8 GEMM   (Q8_0, Q4_K, Q6_K weights, with AVX512-VNNI or AVX2) the product with int8
              activations: rows quantized per 32 columns, weights packed per task (kernels/int8/gemm.py);
              BLAS kept to one thread and a pause first, as for the tiles.
The weights come from distinct copies of the matrix that overflow the last-level cache, as in a forward pass.
Rows: 167 and 500 are the encoder's frames for 10 s and 30 s, 196 a prefill, 1568 eight prefills together.
Runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, as users' machines have them, or with `--isa avx2`
held to an AVX2-only CPU's instructions (tools/lib/measure.py).
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from tools.lib.measure import ISA_ENVIRON, median_ms, rerun_without_blas_vars  # noqa: E402

rerun_without_blas_vars()

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from nanoasr.backend import cpu as cpu_backend  # noqa: E402
from nanoasr.backend import host  # noqa: E402
from nanoasr.kernels import stored as stored_kernels  # noqa: E402
from nanoasr.kernels.bf16 import amx  # noqa: E402
from nanoasr.kernels.bf16 import avx512 as bf16_gemm  # noqa: E402
from nanoasr.kernels.int8.dot import KINDS as MATVEC_INT8_KINDS  # noqa: E402
from nanoasr.kernels.int8.dot import host_path  # noqa: E402
from nanoasr.tensor import StoredTensor  # noqa: E402
from tools.bench.kernel_bench import COLD_BYTES, stored_matrix  # noqa: E402

SHAPES = {  # name: (out_features, in_features)
    "enc attn": (512, 512), "enc fc1": (2048, 512), "enc fc2": (512, 2048),
    "dec q": (2048, 1024), "dec kv": (1024, 1024), "dec o": (1024, 2048),
    "dec gate/up": (3072, 1024), "dec down": (1024, 3072),
}
ENCODER_ROWS = {167, 500}
TILE_ROWS = 128
DTYPES = ("bf16", "f16", "q8_0", "q4_k", "q6_k")


def tiled(x: np.ndarray, w: StoredTensor, out: np.ndarray, tile: np.ndarray) -> np.ndarray:
    rows, cols = w.shape
    for r0 in range(0, rows, TILE_ROWS):
        r1 = min(rows, r0 + TILE_ROWS)
        part = stored_kernels.widen(w.data[r0:r1], w.dtype, r1 - r0, cols, tile[:r1 - r0])
        out[:, r0:r1] = x @ part.T
    return out


def per_call_ms(fn, operands: list, reps: int) -> float:
    """Median over `reps` passes of the mean ms per call, one call per operand."""
    fn(operands[0])  # compiles the kernels, allocates the buffers
    return median_ms(lambda: [fn(op) for op in operands], reps) / len(operands)


def time_shape(rng, dtype: str, rows: int, cols: int, n: int, reps: int) -> dict:
    first = stored_matrix(rng, dtype, rows, cols)
    copies = [first] + [first.copy() for _ in range(max(0, COLD_BYTES // first.nbytes - 1))]
    stored = [StoredTensor(c, dtype, (rows, cols)) for c in copies]
    wide = stored_kernels.widen(first, dtype, rows, cols, np.empty((rows, cols), np.float32))
    wides = [wide] + [wide.copy() for _ in range(max(0, COLD_BYTES // wide.nbytes - 1))]
    x = rng.standard_normal((n, cols), np.float32)
    out, tile = np.empty((n, rows), np.float32), np.empty((TILE_ROWS, cols), np.float32)
    ms = {}
    if dtype == "bf16" and amx.available():
        rounded = [StoredTensor(c, dtype, (rows, cols), activations="bf16") for c in copies]
        time.sleep(0.3)
        with host.threads(None, numba_products=True):  # BLAS kept to one thread, as the model keeps it
            ms["AMX bf16"] = per_call_ms(lambda w: cpu_backend.stored_matmul(x, w), rounded, reps)
    if dtype == "bf16" and bf16_gemm.available():
        time.sleep(0.3)
        with host.threads(None, numba_products=True):
            ms["bf16 GEMM"] = per_call_ms(lambda w: bf16_gemm.products(x, amx.weight_rows(w.data), out),
                                          stored, reps)
    if host_path() is not None and dtype in MATVEC_INT8_KINDS:
        int8 = [StoredTensor(c, dtype, (rows, cols), activations="int8") for c in copies]
        time.sleep(0.3)
        with host.threads(None, numba_products=True):  # as the model runs it
            ms["int8 GEMM"] = per_call_ms(lambda w: cpu_backend.stored_matmul(x, w), int8, reps)
    ms["widen+BLAS"] = per_call_ms(lambda w: cpu_backend.stored_matmul(x, w), stored, reps)
    ms["BLAS f32"] = per_call_ms(lambda w: x @ w.T, wides, reps)
    ms["tiled"] = per_call_ms(lambda w: tiled(x, w, out, tile), stored, reps)
    return {"dtype": dtype, "shape": [rows, cols], "rows": n, "ms": ms,
            "gflops": {k: 2 * n * rows * cols / v / 1e6 for k, v in ms.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[167, 500, 196, 1568])
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", type=pathlib.Path)
    ap.add_argument("--isa", default="native", choices=tuple(ISA_ENVIRON),
                    help="avx2: held to an AVX2-only CPU's instructions "
                         "(tools/lib/measure.py; applied on start)")
    args = ap.parse_args(argv)

    import numba
    from threadpoolctl import threadpool_limits

    numba.set_num_threads(args.threads)
    threadpool_limits(args.threads)
    print(f"threads {args.threads}, {platform.processor() or platform.machine()}; ms per product (median), "
          f"GFLOP/s in brackets\n")
    tiles = "bf16" in args.dtypes and amx.available()
    int8 = host_path() is not None and any(d in MATVEC_INT8_KINDS for d in args.dtypes)
    gemm = "bf16" in args.dtypes and bf16_gemm.available()
    columns = (("widen+BLAS", "BLAS f32", "tiled") + (("AMX bf16",) if tiles else ())
               + (("bf16 GEMM",) if gemm else ()) + (("int8 GEMM",) if int8 else ()))
    print("| type | rows | shape | " + " | ".join(columns) + " | widening's share |")
    print("|---|---|---|" + "---|" * (len(columns) + 1))
    rng = np.random.default_rng(0)
    results = []
    for n in args.rows:
        for dtype in args.dtypes:
            for name, (rows, cols) in SHAPES.items():
                if name.startswith("enc") != (n in ENCODER_ROWS):
                    continue
                r = time_shape(rng, dtype, rows, cols, n, args.reps)
                r["name"] = name
                results.append(r)
                ms, gf = r["ms"], r["gflops"]
                cells = " | ".join(f"{ms[k]:.2f} ({gf[k]:.0f})" if k in ms else "" for k in columns)
                share = 1 - ms["BLAS f32"] / ms["widen+BLAS"]
                print(f"| {dtype} | {n} | {name} {rows}x{cols} | {cells} | {share:.0%} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
