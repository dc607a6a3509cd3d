"""How a transcription fares on a machine it shares: (a) one alone, (b) two at once, (c) one beside one
CPU-bound process per core, each timed after a warm-up in its own process.

    python tools/bench/contention.py --model CKPT [--tree DIR] [--seconds 5] [--tokens 30] [--rounds 3]
                                     [--threads N] [--activations exact|int8|bf16]

`--tree` runs the nanoasr of another checkout (its root first on the path), so that one command measures the
figures before and after a change: (a) is the idle figure. The transcriptions of (b) start together: each
process loads and warms its model, then waits until every one is ready. Prints each figure (the median over
the rounds, with its minimum and maximum) and the ratios (b)/(a) and (c)/(a), and beside each the CPU time the
transcriptions took (all their threads) and the part of it OpenBLAS's own threads ran, working or spinning
while idle (Linux: its threads are those beside the main one once numpy has loaded; elsewhere not shown).
`--activations exact` measures the float32 path. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset in the
runs, as users' machines do not set them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.lib.measure import environ_without_blas_vars  # noqa: E402

CHILD = """
import json, os, sys, threading, time
import numpy as np
TASKS = "/proc/self/task"
blas = set(os.listdir(TASKS)) - {str(threading.get_native_id())} if os.path.isdir(TASKS) else None
def blas_seconds():  # utime + stime of OpenBLAS's threads (fields 14 and 15 of each one's stat): ticks
    stats = (open(f"{TASKS}/{t}/stat").read().rsplit(")", 1)[1].split() for t in blas)
    ticks = sum(int(s[11]) + int(s[12]) for s in stats)
    return ticks / os.sysconf("SC_CLK_TCK")
from nanoasr.api import Model
args = json.loads(sys.argv[1])
model = Model.load(args["model"], threads=args["threads"], **({"activations": args["activations"]}
                                                              if args["activations"] else {}))
wave = (0.1 * np.random.default_rng(0).standard_normal(int(16000 * args["seconds"]))).astype(np.float32)
options = dict(sample_rate=16000, max_new_tokens=args["tokens"], ignore_stop=True)
model.transcribe(wave, **options)  # compiles what is not cached, fills the caches
print("ready", flush=True)
sys.stdin.readline()
start, cpu, blas_before = time.perf_counter(), time.process_time(), blas and blas_seconds()
model.transcribe(wave, **options)
print(json.dumps({"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu,
                  "blas": blas and blas_seconds() - blas_before}), flush=True)
"""
HOG = "while True: pass"


def transcriptions(args, count: int, hogs: int) -> list[dict]:
    """{seconds, cpu, blas} of each of `count` transcriptions started together, beside `hogs` busy processes
    (blas None where OpenBLAS's threads cannot be told)."""
    env = environ_without_blas_vars("native")
    env["PYTHONPATH"] = str(Path(args.tree).resolve())
    model = os.path.abspath(args.model) if os.path.exists(args.model) else args.model  # a path, or a hub id
    child = json.dumps({"model": model, "threads": args.threads,
                        "activations": args.activations, "seconds": args.seconds, "tokens": args.tokens})
    # run in the tree: `python -c` puts the working directory before PYTHONPATH, and another checkout's
    # nanoasr would be imported from there
    runs = [subprocess.Popen([sys.executable, "-c", CHILD, child], env=env, cwd=args.tree,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(count)]
    busy = []
    try:
        for run in runs:
            if run.stdout.readline().strip() != "ready":
                raise SystemExit(f"a transcription failed to start (exit {run.wait()})")
        busy = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
        for run in runs:
            run.stdin.write("go\n")
            run.stdin.flush()
        return [json.loads(run.stdout.readline()) for run in runs]
    finally:
        for process in busy + runs:
            process.kill()
            process.wait()


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="nanoasr checkpoint dir or .gguf")
    ap.add_argument("--tree", default=str(ROOT), help="the checkout whose nanoasr runs (default: this one)")
    ap.add_argument("--seconds", type=float, default=5.0, help="audio per transcription")
    ap.add_argument("--tokens", type=int, default=30, help="tokens decoded per transcription")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="nanoasr's threads (default: its own)")
    ap.add_argument("--activations", default=None, help="nanoasr's activations (default: its own)")
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    figures = {"alone": [], "two at once": [], f"beside {cores} busy": []}
    for _ in range(args.rounds):  # interleaved, so that other work on the machine slows each alike
        figures["alone"] += transcriptions(args, 1, 0)
        figures["two at once"] += transcriptions(args, 2, 0)
        figures[f"beside {cores} busy"] += transcriptions(args, 1, cores)
    alone = statistics.median(run["seconds"] for run in figures["alone"])
    for name, runs in figures.items():
        seconds = [run["seconds"] for run in runs]
        ratio = "" if name == "alone" else f"  {statistics.median(seconds) / alone:.2f}x alone"
        cpu = f"CPU {statistics.median(run['cpu'] for run in runs):.2f} s"
        if all(run["blas"] is not None for run in runs):
            cpu += f", of it OpenBLAS's threads {statistics.median(run['blas'] for run in runs):.2f} s"
        print(f"{name:>16}: {summary(seconds)}{ratio}; {cpu}")


if __name__ == "__main__":
    main()
