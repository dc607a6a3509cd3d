"""numba's threads share the machine: their pool is started with workers that spin only briefly when idle,
and importing nanoasr sets nothing in the environment."""
import json
import os
import subprocess
import sys

import pytest

from nanoasr.backend import host

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


@needs_gomp
def test_numba_workers_spin_briefly_and_the_environment_is_left_alone():
    seen, gomp = probe()
    assert seen["import"] and seen["after"]
    assert seen["policy"] == ["omp", "spin then sleep: GOMP_SPINCOUNT=10000, KMP_BLOCKTIME=1"]
    assert gomp["GOMP_SPINCOUNT"] == host.OMP_SPIN["GOMP_SPINCOUNT"]  # libgomp's default is 300000


@needs_gomp
def test_a_wait_policy_the_user_set_stands():
    seen, gomp = probe(OMP_WAIT_POLICY="active")
    assert seen["policy"] == ["omp", "as set: OMP_WAIT_POLICY=active"]
    assert int(gomp["GOMP_SPINCOUNT"]) > int(host.OMP_SPIN["GOMP_SPINCOUNT"])


def test_a_threading_layer_the_user_chose_stands():
    seen, _ = probe(NUMBA_THREADING_LAYER="workqueue")
    assert seen["policy"] == ["workqueue", "its own (sleeps when idle)"]
