"""Decode-time matrix-vector kernels at the Qwen3-0.6B decoder's shapes: ms per call and weight GB/s.

    python tools/bench/kernel_bench.py [--threads 2] [--batch 1 8] [--dtypes f16 q8_0 ...]
                                 [--activations exact|int8|vnni|avx2] [--in-cache] [--json out.json]

Weights stream from memory as in decoding: each shape is timed over enough distinct copies of the matrix to
overflow the last-level cache, in 2 MiB pages where the OS gives them (as --huge-pages and files mapped in
2 MiB pages hold them). GB/s counts the stored bytes of the matrix read per call. The per-token line
adds 28 layers of q/k/v/o/gate/up/down plus the LM head; with q4_k and q6_k both timed, a Q4_K_M line
mixes them as llama.cpp's Q4_K_M files do. `--activations int8` times the block types with x quantized
to int8 (the kernels of int8 activations, on this CPU's integer path; vnni or avx2 pick the path, where the
CPU runs it) instead of float32 rows. `--in-cache` times one copy over and over instead: what the kernel's
arithmetic allows where memory does not hold it back (a matrix that fits the core's cache). Runs with
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (it re-executes itself without them), as users' machines have
them.
"""
from __future__ import annotations

import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from tools.lib.measure import last_level_cache_bytes, rerun_without_blas_vars  # noqa: E402

rerun_without_blas_vars()

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from nanoasr.backend.host import in_huge_pages  # noqa: E402
from nanoasr.kernels import stored  # noqa: E402
from nanoasr.kernels.int8 import dot as int8_dot  # noqa: E402

HIDDEN, HEAD_DIM, Q_HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 1024, 128, 16, 8, 3072, 151936, 28
SHAPES = {  # name: (rows = out_features, cols = in_features)
    "q": (Q_HEADS * HEAD_DIM, HIDDEN),
    "k": (KV_HEADS * HEAD_DIM, HIDDEN),
    "v": (KV_HEADS * HEAD_DIM, HIDDEN),
    "o": (HIDDEN, Q_HEADS * HEAD_DIM),
    "gate": (FFN, HIDDEN),
    "up": (FFN, HIDDEN),
    "down": (HIDDEN, FFN),
    "lm_head": (VOCAB, HIDDEN),
}
DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_k", "q6_k")
F16_FIELDS = {"q8_0": (0,), "q4_k": (0, 2), "q6_k": (208,)}


# bytes of copies each timing streams through: twice the last-level cache, at least 192 MiB
COLD_BYTES = max(192 << 20, 2 * last_level_cache_bytes())


def stored_matrix(rng, dtype: str, rows: int, cols: int) -> np.ndarray:
    """Random stored data of a [rows, cols] weight: dense types weight-like (normal, std 0.02; random bit
    patterns would hold subnormal values, which slow float arithmetic), block types random quants under
    finite scales, so the arithmetic is ordinary."""
    if dtype in ("f32", "f16", "bf16"):
        w = rng.standard_normal((rows, cols), np.float32) * np.float32(0.02)
        if dtype == "bf16":  # the top half of each float32
            return (w.view(np.uint32) >> 16).astype(np.uint16)
        return w.astype(np.float16) if dtype == "f16" else w
    per, nbytes = stored.QK[dtype]
    raw = rng.integers(0, 256, (rows, cols // per, nbytes), dtype=np.uint8)
    for at in F16_FIELDS[dtype]:
        scale = rng.uniform(-0.05, 0.05, (rows, cols // per)).astype(np.float16)
        raw[:, :, at:at + 2] = scale.view(np.uint8).reshape(rows, cols // per, 2)
    return raw.reshape(rows, -1)


def product(dtype: str, activations: str):
    """The decode kernel for `dtype` weights and `activations` rows ("exact", "int8": the host's integer
    path, or a path of int8_dot.PATHS), as stored.matvec's signature."""
    if activations == "exact" or dtype not in stored.MATVEC_INT8_KINDS:
        return stored.matvec
    path = int8_dot.host_path() if activations == "int8" else activations
    runnable = {"vnni": ("vnni", "avx2"), "avx2": ("avx2",), None: ()}[int8_dot.host_path()]
    if path not in runnable:
        raise SystemExit(f"this CPU cannot run the int8 path {path or '(none: no AVX2)'}")
    return lambda x, data, dtype, rows, cols, out: stored.matvec_int8(x, data, dtype, rows, cols, out, path)


def time_shape(rng, dtype: str, rows: int, cols: int, batch: int, reps: int, activations: str,
               in_cache: bool = False) -> dict:
    """Best and median ms per call over `reps` passes through distinct copies of one matrix (or the same one
    as many times, in_cache)."""
    matvec = product(dtype, activations)
    first = stored_matrix(rng, dtype, rows, cols)
    count = max(1, COLD_BYTES // first.nbytes)
    copies = in_huge_pages([first]) * count if in_cache else in_huge_pages([first] * count)
    x = rng.standard_normal((batch, cols), np.float32)
    out = np.empty((batch, rows), np.float32)
    matvec(x, first, dtype, rows, cols, out)  # compile or load from the cache
    per_call = []
    for _ in range(reps):
        start = time.perf_counter()
        for data in copies:
            matvec(x, data, dtype, rows, cols, out)
        per_call.append((time.perf_counter() - start) / len(copies))
    best, median = min(per_call), float(np.median(per_call))
    return {"dtype": dtype, "shape": [rows, cols], "batch": batch, "bytes": int(first.nbytes),
            "ms_best": best * 1e3, "ms_median": median * 1e3,
            "gbps_best": first.nbytes / best / 1e9, "gbps_median": first.nbytes / median / 1e9}


def q4_k_m_step(results: list, batch: int) -> dict | None:
    """The decoder step of a Q4_K_M file from the q4_k and q6_k timings: llama.cpp stores the LM head
    (tied token embedding) and attn_v / ffn_down of half the layers as q6_k, the rest as q4_k."""
    ms = {(r["dtype"], r["name"]): r for r in results if r["batch"] == batch}
    if not all((t, n) in ms for t in ("q4_k", "q6_k") for n in SHAPES):
        return None
    plan = [("q4_k", n, LAYERS) for n in SHAPES if n not in ("v", "down", "lm_head")]
    plan += [(t, n, LAYERS // 2) for t in ("q4_k", "q6_k") for n in ("v", "down")] + [("q6_k", "lm_head", 1)]
    token = sum(k * ms[t, n]["ms_median"] for t, n, k in plan)
    nbytes = sum(k * ms[t, n]["bytes"] for t, n, k in plan)
    return {"dtype": "q4_k_m", "batch": batch, "name": "decoder_step", "ms_median": token, "bytes": nbytes,
            "gbps_median": nbytes / token / 1e6}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--activations", choices=("exact", "int8") + int8_dot.PATHS, default="exact")
    ap.add_argument("--in-cache", action="store_true", help="time one copy over and over")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args(argv)

    import numba

    numba.set_num_threads(args.threads)
    cpu_name = platform.processor() or platform.machine()
    print(f"threads {numba.get_num_threads()}, numba {numba.__version__}, {cpu_name}, "
          f"activations {args.activations}{', in cache' if args.in_cache else ''}, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}")
    rng = np.random.default_rng(0)
    results = []
    print(f"{'dtype':6} {'B':>2} {'shape':>8} {'rows x cols':>14} {'MB':>7} {'ms best':>9} {'ms median':>9} "
          f"{'GB/s best':>9} {'GB/s med':>9}")
    for batch in args.batch:
        for dtype in args.dtypes:
            per_shape = {}
            for name in args.shapes:
                rows, cols = SHAPES[name]
                r = time_shape(rng, dtype, rows, cols, batch, args.reps, args.activations, args.in_cache)
                r["name"] = name
                results.append(r)
                per_shape[name] = r
                print(f"{dtype:6} {batch:>2} {name:>8} {rows:>7}x{cols:<6} {r['bytes'] / 1e6:7.2f} "
                      f"{r['ms_best']:9.3f} {r['ms_median']:9.3f} {r['gbps_best']:9.1f} "
                      f"{r['gbps_median']:9.1f}", flush=True)
            if set(per_shape) == set(SHAPES):
                layer = sum(per_shape[n]["ms_median"] for n in SHAPES if n != "lm_head")
                token = LAYERS * layer + per_shape["lm_head"]["ms_median"]
                nbytes = LAYERS * sum(per_shape[n]["bytes"] for n in SHAPES if n != "lm_head") \
                    + per_shape["lm_head"]["bytes"]
                print(f"{dtype:6} {batch:>2} decoder step (28 layers + LM head, medians): {token:.1f} ms, "
                      f"{nbytes / token / 1e6:.1f} GB/s")
                results.append({"dtype": dtype, "batch": batch, "name": "decoder_step", "ms_median": token,
                                "bytes": nbytes, "gbps_median": nbytes / token / 1e6})
        mix = q4_k_m_step(results, batch)
        if mix:
            print(f"q4_k_m {batch:>2} decoder step (Q4_K_M mix, medians): {mix['ms_median']:.1f} ms, "
                  f"{mix['gbps_median']:.1f} GB/s")
            results.append(mix)
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "activations": args.activations,
                                         "in_cache": args.in_cache, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
