"""What a first run costs: nanoasr on an empty numba cache (its kernels compile) against a warm one.

    python tools/bench/first_run.py --model CKPT [--model CKPT2 ...] --audio CLIP [--activations auto]
                                    [--server] [--tree DIR]

For each model, in a fresh empty NUMBA_CACHE_DIR: `python -m nanoasr CLIP --model CKPT` twice (cold, then
warm), each one's wall time and whether it printed the compile notice; the kernels a cold transcription
compiles (in a child process on another fresh cache: each numba function of nanoasr and its signatures, the
specializations, numba's seconds compiling them, and the five slowest by name, each with the functions it
compiled on its way and without them: its own); with --server, `nanoasr serve` on a fresh cache: seconds until
it listens, then the first and the second request's. `--tree` runs the nanoasr of another checkout (its root
first on the path), so that one command measures before and after a change. Prints one JSON object per model.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(rb"running on (http://127\.0\.0\.1:\d+)")
NOTICE = "compiling kernels"
COUNT = """
import gc, json, sys
from numba.core import event
from numba.core.dispatcher import Dispatcher
from nanoasr.api import Model
model, activations, audio = sys.argv[1:]
compiles = event.RecordingListener()
with event.install_listener("numba:compile", compiles):
    Model.load(model, activations=activations).transcribe(audio)
kernels = {f"{d.py_func.__module__}.{d.py_func.__qualname__}": [str(s) for s in d.signatures]
           for d in gc.get_objects() if issubclass(type(d), Dispatcher)
           and d.py_func.__module__.startswith("nanoasr.") and d.signatures}
seconds, own, started = {}, {}, []  # started: [start, seconds of the compiles nested in it]
for at, happened in compiles.buffer:  # a compile's time includes the functions it compiles on its way
    if happened.is_start:
        started.append([at, 0.0])
        continue
    start, nested = started.pop()
    took = at - start
    f = happened.data["dispatcher"].py_func
    name = f"{f.__module__}.{f.__qualname__}"
    own[name] = own.get(name, 0.0) + took - nested
    if started:
        started[-1][1] += took
    else:
        seconds[name] = seconds.get(name, 0.0) + took
print(json.dumps({"kernels": kernels, "seconds": seconds, "own": own}))
"""


def environ(tree: Path, cache: str) -> dict:
    return dict(os.environ, PYTHONPATH=str(tree), NUMBA_CACHE_DIR=cache)


def run(command: list[str], tree: Path, cache: str) -> subprocess.CompletedProcess:
    """`command` with the tree's nanoasr: run from the tree, since `python -m` and `-c` put the working
    folder before PYTHONPATH."""
    return subprocess.run(command, env=environ(tree, cache), cwd=tree, capture_output=True, text=True,
                          check=True)


def transcription(tree: Path, cache: str, model: str, audio: str, activations: str) -> dict:
    """One `python -m nanoasr` run: its wall seconds and whether it said it compiles."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "nanoasr", audio, "--model", model, "--activations", activations]
    done = run(command, tree, cache)
    return {"wall_s": round(time.perf_counter() - start, 2), "notice": NOTICE in done.stderr}


def specializations(tree: Path, model: str, audio: str, activations: str) -> dict:
    """The compiled signatures of each nanoasr numba function after one cold transcription."""
    with tempfile.TemporaryDirectory(prefix="nanoasr-numba-") as cache:
        done = run([sys.executable, "-c", COUNT, model, activations, audio], tree, cache)
    found = json.loads(done.stdout.splitlines()[-1])
    kernels, seconds, own = found["kernels"], found["seconds"], found["own"]

    def slowest(times):
        return {name: round(s, 2) for name, s in sorted(times.items(), key=lambda item: -item[1])[:5]}
    return {"functions": len(kernels), "signatures": sum(map(len, kernels.values())),
            "several": {name: signatures for name, signatures in kernels.items() if len(signatures) > 1},
            "compile_s": round(sum(seconds.values()), 2), "slowest_s": slowest(seconds),
            "slowest_own_s": slowest(own)}


def server(tree: Path, model: str, audio: str, activations: str) -> dict:
    """`nanoasr serve` on an empty cache: seconds until it listens, then two requests' seconds."""
    import httpx

    with tempfile.TemporaryDirectory(prefix="nanoasr-numba-") as cache:
        log = Path(cache) / "server.log"  # read by name: the server's writes keep their own file offset
        start = time.perf_counter()
        with open(log, "wb") as out:
            process = subprocess.Popen([sys.executable, "-m", "nanoasr", "serve", "--model", model, "--port",
                                        "0", "--activations", activations], env=environ(tree, cache),
                                       cwd=tree, stdout=out, stderr=subprocess.STDOUT)
        try:
            while (found := READY.search(log.read_bytes())) is None:
                if process.poll() is not None:
                    raise RuntimeError(f"the server did not start:\n{log.read_text(errors='replace')}")
                time.sleep(0.05)
            times = {"ready_s": round(time.perf_counter() - start, 2)}
            for name in ("first_request_s", "second_request_s"):
                with open(audio, "rb") as fh:
                    start = time.perf_counter()
                    httpx.post(found[1].decode() + "/v1/audio/transcriptions", files={"file": fh},
                               data={"model": "m"}, timeout=600).raise_for_status()
                times[name] = round(time.perf_counter() - start, 2)
            return times
        finally:
            process.terminate()
            process.wait(60)


def measure(tree: Path, model: str, audio: str, activations: str, with_server: bool) -> dict:
    out = {"model": model, "activations": activations}
    with tempfile.TemporaryDirectory(prefix="nanoasr-numba-") as cache:
        out["cold"] = transcription(tree, cache, model, audio, activations)
        out["warm"] = transcription(tree, cache, model, audio, activations)
    out["compiled"] = specializations(tree, model, audio, activations)
    if with_server:
        out["server"] = server(tree, model, audio, activations)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="a checkpoint (repeatable)")
    parser.add_argument("--audio", required=True, help="the clip every run transcribes")
    parser.add_argument("--activations", default="auto")
    parser.add_argument("--server", action="store_true", help="also time `nanoasr serve`'s first requests")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose nanoasr runs")
    args = parser.parse_args()
    audio = str(Path(args.audio).resolve())
    for model in args.model:
        print(json.dumps(measure(args.tree.resolve(), str(Path(model).resolve()), audio, args.activations,
                                 args.server)), flush=True)


if __name__ == "__main__":
    main()
