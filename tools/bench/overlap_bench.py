"""Whether encoding the next segments while decoding pays on this machine: the encoder and adaptor on a 30 s
segment and a run of batched decode steps (8 rows, as long audio decodes them), one after the other with
every thread each, against both at once in two Python threads with the threads split between them (and
with every thread each).

    python tools/bench/overlap_bench.py MODEL [--threads 2] [--activations exact|bf16|int8] [--steps 30]
                                        [--rounds 3] [--isa native|avx2]

Each line is one round; the sequential figure is the time long audio spends on the two stages today.
Runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, as tools/bench/bench.py does, or with `--isa avx2`
held to an AVX2-only CPU's instructions (tools/lib/measure.py).
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from tools.lib.measure import ISA_ENVIRON, rerun_without_blas_vars  # noqa: E402

rerun_without_blas_vars()

import argparse  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from nanoasr.api import BATCH_SIZE, Model  # noqa: E402
from nanoasr.backend import ACTIVATIONS  # noqa: E402
from nanoasr.model import decoder  # noqa: E402
from tools.lib.synth import speech_like  # noqa: E402

ROWS = BATCH_SIZE  # segments decoded together, as long audio decodes them
PROMPT = 200  # positions of each row's prompt before the steps: a 30 s segment's


def stages(model: Model, steps: int):
    """(encode(threads), decode(threads)): the encoder and adaptor on 30 s, and `steps` steps of ROWS rows
    on a session prefilled beforehand (each call takes a fresh one, prefilled before it is timed)."""
    cfg = model.config.text
    rng = np.random.default_rng(0)
    feats = model.features(speech_like(30, seed=3), "funasr")
    prompts = [rng.standard_normal((PROMPT, cfg.hidden_size)).astype(np.float32) for _ in range(ROWS)]
    sessions = []

    def prepare():
        session = decoder.Session(model.weights, cfg, rows=ROWS)
        with model.thread_scope():
            for p in prompts:
                session.prefill(p, room=steps + 1)
        sessions.append(session)

    def encode(threads: int):
        with model.thread_scope(threads):
            model.adapt(model.encode(feats), "funasr")

    def decode(threads: int):
        session = sessions.pop()
        with model.thread_scope(threads):
            for _ in range(steps):
                session.step([1000] * ROWS).argmax(axis=-1)
    return prepare, encode, decode


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - start) * 1e3


def together(encode, decode, threads: tuple[int, int]) -> tuple[float, float, float]:
    """Both stages at once, in two Python threads with these numba threads each -> ms (wall, encode,
    decode)."""
    ms = {}

    def run(name, fn, n):
        ms[name] = timed(fn, n)
    workers = [threading.Thread(target=run, args=("encode", encode, threads[0])),
               threading.Thread(target=run, args=("decode", decode, threads[1]))]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return (time.perf_counter() - start) * 1e3, ms["encode"], ms["decode"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--activations", choices=ACTIVATIONS, default="exact")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--isa", default="native", choices=tuple(ISA_ENVIRON),
                        help="avx2: held to an AVX2-only CPU's instructions (tools/lib/measure.py)")
    args = parser.parse_args()
    model = Model.load(args.model, threads=args.threads, activations=args.activations)
    prepare, encode, decode = stages(model, args.steps)
    n = args.threads
    split = (max(1, n - n // 2), max(1, n // 2))
    prepare()
    encode(n)  # compiles
    decode(n)
    print(f"{args.model}, {args.activations} activations, {n} threads: encoder + adaptor on 30 s, "
          f"{args.steps} decode steps of {ROWS} rows; ms")
    for _ in range(args.rounds):
        prepare()
        encoded = timed(encode, n)
        decoded = timed(decode, n)
        cells = [f"one after the other: {encoded:.0f} + {decoded:.0f} = {encoded + decoded:.0f}"]
        for threads in (split, (n, n)):
            prepare()
            wall, e, d = together(encode, decode, threads)
            cells.append(f"at once, {threads[0]} + {threads[1]} threads: {wall:.0f} (encode {e:.0f}, "
                         f"decode {d:.0f})")
        print(" | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
