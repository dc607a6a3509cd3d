"""Where the time goes: cProfile of encoder + adaptor on 30 s, a 196-position prefill, and decode steps.

    python tools/bench/profile_stages.py MODEL [--threads 2] [--steps 20] [--top 12]
                                               [--activations auto|exact|bf16|int8] [--huge-pages]

MODEL is a checkpoint directory or .gguf. First the milliseconds per stage that Model.transcribe reports in
Transcript.timings, for 30 s of speech-like audio. Then each stage runs once to compile and warm up, then once
under cProfile; the table lists the functions with the most time of their own (BLAS calls count in the
Python function that makes them). A decode step's time is split from its profile into the layers run as one
compiled call each (nanoasr.kernels.decode_layer: their products and attention inside), the weight products
made op by op (nanoasr.ops.linear: the LM head, and the layers where no compiled call applies), attention
made op by op (nanoasr.ops.decode_attention) and the rest. Runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
unset, as tools/bench/bench.py does.
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from tools.lib.measure import median_ms, rerun_without_blas_vars  # noqa: E402

rerun_without_blas_vars()

import argparse  # noqa: E402
import cProfile  # noqa: E402
import pstats  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import nanoasr.kernels.decode_layer  # noqa: E402
import nanoasr.ops  # noqa: E402
from nanoasr.api import Model  # noqa: E402
from nanoasr.backend import ACTIVATIONS  # noqa: E402
from nanoasr.model import decoder  # noqa: E402
from tools.lib.synth import speech_like  # noqa: E402


def profiled(name: str, fn, top: int) -> pstats.Stats:
    fn()
    start = time.perf_counter()
    fn()
    print(f"\n== {name}: {(time.perf_counter() - start) * 1e3:.1f} ms")
    profile = cProfile.Profile()
    profile.runcall(fn)
    stats = pstats.Stats(profile, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(top)
    return stats


def seconds_in(stats: pstats.Stats, function: str, module=nanoasr.ops) -> float:
    """Time inside module.<function> (nanoasr.ops by default), its callees included, in a profile (0 where it
    was not called)."""
    for (path, _, name), (_, _, _, cumulative, _) in stats.stats.items():
        if path == module.__file__ and name == function:
            return cumulative
    return 0.0


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
    parser.add_argument("--activations", choices=ACTIVATIONS, default="auto")
    parser.add_argument("--huge-pages", action="store_true", help="copy the weights into 2 MiB pages")
    args = parser.parse_args()
    model = Model.load(args.model, threads=args.threads, activations=args.activations,
                       huge_pages=args.huge_pages)
    wave = speech_like(30, seed=3)
    model.transcribe(wave, sample_rate=16000, max_new_tokens=args.steps, ignore_stop=True)  # compiles
    timings = model.transcribe(wave, sample_rate=16000, max_new_tokens=args.steps, ignore_stop=True).timings
    print("transcribe 30 s, ms per stage: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    with model.thread_scope():
        feats = model.features(wave, "funasr")
        profiled("encoder + adaptor, 30 s", lambda: model.adapt(model.encode(feats), "funasr"),
                 args.top)
        prompt = np.random.default_rng(0).standard_normal((196, model.config.text.hidden_size))
        profile_decoder(model, prompt.astype(np.float32), args.steps, args.top)
    return 0


def profile_decoder(model, prompt, steps: int, top: int) -> None:  # prompt [196, H]
    w, cfg = model.weights, model.config.text

    def prefill():
        decoder.Session(w, cfg, rows=1).prefill(prompt, room=4)

    profiled("prefill, 196 positions", prefill, top)
    session = decoder.Session(w, cfg, rows=1)
    session.prefill(prompt, room=3 * steps + 16)  # the three profiled runs and the median's 16 steps
    step = lambda: session.step([1000]).argmax()  # noqa: E731
    stats = profiled(f"{steps} decode steps from 196 positions on", lambda: [step() for _ in range(steps)],
                     top)
    step_ms = warm_median_ms(step)
    layers = seconds_in(stats, "decode_layer", nanoasr.kernels.decode_layer) * 1e3 / steps
    products, attention = (seconds_in(stats, f) * 1e3 / steps for f in ("linear", "decode_attention"))
    print(f"\ndecode step: {step_ms:.1f} ms; in the profile, per step: compiled layers "
          f"(kernels.decode_layer) {layers:.1f} ms, weight products op by op (ops.linear) {products:.1f} ms, "
          f"attention op by op (ops.decode_attention) {attention:.1f} ms; the rest about "
          f"{step_ms - layers - products - attention:.1f} ms")


if __name__ == "__main__":
    raise SystemExit(main())
