"""Where the time goes: cProfile of encoder + adaptor on 30 s, a 196-position prefill, and decode steps.

    python tools/profile_stages.py MODEL [--threads 2] [--steps 20] [--top 12]

MODEL is a checkpoint directory or .gguf. Each stage runs once to compile and warm up, then once under
cProfile; the table lists the functions with the most time of their own (BLAS calls count in the Python
function that makes them). Decode steps also run without the weight products (replaced by zeros) and
without attention, to show what the rest of a step costs. Runs with OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE unset, as tools/bench.py does.
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tools.measure import median_ms, rerun_without_blas_vars  # noqa: E402

rerun_without_blas_vars()

import argparse  # noqa: E402
import cProfile  # noqa: E402
import pstats  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from nanoasr import backend  # noqa: E402
from nanoasr.api import Model  # noqa: E402
from nanoasr.model import decoder  # noqa: E402
from tools.synth import speech_like  # noqa: E402


def profiled(name: str, fn, top: int) -> None:
    fn()
    start = time.perf_counter()
    fn()
    print(f"\n== {name}: {(time.perf_counter() - start) * 1e3:.1f} ms")
    profile = cProfile.Profile()
    profile.runcall(fn)
    pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(top)


def warm_median_ms(fn) -> float:
    fn()
    return median_ms(fn, 15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    model = Model.load(args.model, threads=args.threads)
    cfg, w = model.config.text, model.weights
    rng = np.random.default_rng(0)
    with backend.threads(model.threads):
        feats, mask = model.features([speech_like(30, seed=3)], "funasr")
        profiled("encoder + adaptor, 30 s", lambda: model.adapt(model.encode(feats, mask), mask, "funasr"),
                 args.top)
        prompt = rng.standard_normal((1, 196, cfg.hidden_size)).astype(np.float32)

        def prefill():
            cache = decoder.KVCache(cfg, 1, 200)
            decoder.logits(decoder.forward(prompt, w, cfg, cache, slice(0, 1), [0]), w)
        profiled("prefill, 196 positions", prefill, args.top)

        cache = decoder.KVCache(cfg, 1, 200 + args.steps)
        decoder.forward(prompt, w, cfg, cache, slice(0, 1), [0])
        filled = cache.lengths.copy()

        def step():
            cache.lengths[:] = filled
            x = decoder.embed([1000], w)[:, None, :]
            hidden = decoder.forward(x, w, cfg, cache, slice(0, 1), cache.lengths[:1].copy())
            decoder.logits(hidden, w).argmax()

        profiled(f"{args.steps} decode steps after 196 positions",
                 lambda: [step() for _ in range(args.steps)], args.top)
        print(f"\ndecode step: {warm_median_ms(step):.1f} ms", end="")
        kernels = model.backend.kernels
        products, attend = kernels.stored_matmul, kernels.decode_attention
        zeros = {}
        kernels.stored_matmul = lambda rows, t: zeros.setdefault(
            (len(rows), t.shape[0]), np.zeros((len(rows), t.shape[0]), np.float32))
        print(f"; without the weight products {warm_median_ms(step):.1f} ms", end="")
        kernels.decode_attention = lambda q, keys, values, lengths: q
        print(f"; and without attention {warm_median_ms(step):.1f} ms")
        kernels.stored_matmul, kernels.decode_attention = products, attend
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
