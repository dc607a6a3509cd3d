"""numba's threads share the machine: their pool runs on TBB where the dependency is installed (x86-64
Linux), else on OpenMP with workers that spin only briefly when idle; importing nanoasr sets nothing in the
environment."""
import json
import os
import platform
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from nanoasr.backend import host

ROOT = Path(__file__).resolve().parents[1]

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "NUMBA_THREADING_LAYER",
                  "OPENBLAS_THREAD_TIMEOUT")
# Run in a fresh process: the environment as it was, what nanoasr chose, and libgomp's spin count as
# libgomp itself reports it (omp_display_env writes its settings to stderr).
PROBE = """
import ctypes, json, os, sys
before = dict(os.environ)
import nanoasr
imported = dict(os.environ)
from nanoasr.backend import cpu, host
policy = host.start_numba_threads()
print(json.dumps({"import": imported == before, "after": dict(os.environ) == before,
                  "policy": list(policy)}), flush=True)
ctypes.CDLL("libgomp.so.1").omp_display_env(1)
"""


def probe(**settings) -> tuple[dict, dict]:
    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARIABLES} | settings
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    gomp = dict(line.strip().replace("'", "").split(" = ", 1) for line in done.stderr.splitlines()
                if " = " in line)
    return json.loads(done.stdout), gomp


needs_gomp = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="numba's OpenMP layer loads libgomp on Linux only")


@pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.machine() == "x86_64"),
                    reason="the tbb dependency is installed on x86-64 Linux only")
def test_numba_runs_on_tbb_from_the_wheel_and_the_environment_is_left_alone():
    seen, _ = probe()
    assert seen["import"] and seen["after"]
    assert seen["policy"] == ["tbb", "its own"]


def test_the_tbb_runtime_is_found_among_the_wheels_files():
    class Wheel:  # as importlib.metadata gives an installed distribution: files relative to site-packages
        def __init__(self, *names):
            self.files = [PurePosixPath("../../../lib", name) for name in names]

        def locate_file(self, file):
            return Path("/env/lib/python3.11/site-packages") / file
    found = host.tbb_library(Wheel("libtbbmalloc.so.2", "libtbb.so.12", "libtbb.so"))
    assert found == Path("/env/lib/python3.11/site-packages/../../../lib/libtbb.so.12")
    assert host.tbb_library(Wheel("libtbb.so")) is None


def test_a_broken_tbb_install_is_passed_over(monkeypatch):
    class Broken:  # the wheel's files listed, the library itself gone
        files = [PurePosixPath("lib/libtbb.so.12")]

        def locate_file(self, file):
            return Path("/nonexistent") / file
    monkeypatch.setattr("importlib.metadata.distribution", lambda name: Broken())
    host._load_tbb()  # no error: numba then starts the layer it can load


@needs_gomp
def test_numba_workers_spin_briefly_on_openmp_and_the_environment_is_left_alone():
    seen, gomp = probe(NUMBA_THREADING_LAYER="omp")
    assert seen["import"] and seen["after"]
    assert seen["policy"] == ["omp", "spin then sleep: GOMP_SPINCOUNT=1000, KMP_BLOCKTIME=1"]
    assert gomp["GOMP_SPINCOUNT"] == host.OMP_SPIN["GOMP_SPINCOUNT"]  # libgomp's default is 300000


@needs_gomp
def test_a_wait_policy_the_user_set_stands():
    seen, gomp = probe(OMP_WAIT_POLICY="active", NUMBA_THREADING_LAYER="omp")
    assert seen["policy"] == ["omp", "as set: OMP_WAIT_POLICY=active"]
    assert int(gomp["GOMP_SPINCOUNT"]) > int(host.OMP_SPIN["GOMP_SPINCOUNT"])


def test_a_threading_layer_the_user_chose_stands():
    seen, _ = probe(NUMBA_THREADING_LAYER="workqueue")
    assert seen["policy"] == ["workqueue", "its own (sleeps when idle)"]


needs_two_cores = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores: BLAS's pool and "
                                     "numba's have one thread each on one")
# Run in a fresh process: OpenBLAS's own threads are those beside the main one once numpy is imported (it
# starts them as it loads); their CPU time is counted in clock ticks by the OS, and is zero while they never
# run.
BLAS_PROBE = """
import json, sys, threading
import numpy as np
import psutil
process = psutil.Process()
blas = {t.id for t in process.threads()} - {threading.get_native_id()}
from nanoasr.api import Model
from nanoasr.backend import host
from nanoasr import ops
from nanoasr.tensor import StoredTensor

def blas_seconds():
    return sum(t.user_time + t.system_time for t in process.threads() if t.id in blas)

model = Model.load(sys.argv[1], threads=2, activations="exact")
scope = model.thread_scope() if sys.argv[2] == "model" else host.threads(2)
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 1024)).astype(np.float32)
w = StoredTensor(rng.standard_normal((1024, 1024)).astype(np.float32), "f32", (1024, 1024))
q, k = (rng.standard_normal((1, 8, 300, 64)).astype(np.float32) for _ in range(2))
with scope:
    before = blas_seconds()
    for _ in range(20):
        ops.linear(x, w), ops.products(q, k)
    print(json.dumps({"workers": len(blas), "seconds": blas_seconds() - before}))
"""


@needs_two_cores
def test_blas_own_threads_never_run_inside_a_float32_models_thread_scope(tiny_dir):
    """The float32 path's large products (a weight product of the encoder or prefill, attention's) inside the
    model's thread scope run BLAS on numba's threads, never on BLAS's own, whose idle threads spin for a while
    after each call; the same products in a scope that leaves BLAS its threads (the control) run them."""
    seen = {}
    for scope in ("model", "blas pool"):
        done = subprocess.run([sys.executable, "-c", BLAS_PROBE, str(tiny_dir), scope], capture_output=True,
                              text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert done.returncode == 0, done.stderr
        seen[scope] = json.loads(done.stdout)
    assert seen["model"]["workers"] >= 1
    assert seen["model"]["seconds"] == 0 and seen["blas pool"]["seconds"] > 0, seen
