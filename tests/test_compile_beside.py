"""A first run compiles the decode step's layer kernel in a child process beside its own work
(Model.compile_beside, decoder.compile_step_beside, kernels/decode_layer.compile_beside): on an empty kernel
cache the child compiles the layer for the argument types a real step passes, so the process's own decode
step loads the layer from the disk cache and compiles nothing itself; on the cache that left, no child
starts.
The layer is tests/test_decode_layer.py's, over whole blocks (the tiny checkpoint's widths are not, and its
decoder runs op by op)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from nanoasr.backend.host import usable_cpus

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEP = """
import json
import numpy as np
from numba.core import event
from nanoasr.kernels import decode_layer
from nanoasr.model import decoder
from nanoasr.ops import rope_inv_freq
from tests.test_decode_layer import CFG, layer_weights
w = layer_weights(["bf16"] * 7, "exact")
started = decoder.compile_step_beside(w, CFG)
children = list(decode_layer._beside.values())
layer = decode_layer.layer_for(decoder.compiled_layers(w, CFG)[0].products)
compiles = event.RecordingListener()
x = np.random.default_rng(1).standard_normal((1, 1, CFG.hidden_size)).astype(np.float32)
with event.install_listener("numba:compile", compiles):
    decoder.forward(x, w, CFG, decoder.KVCache(CFG, 1, 4), slice(0, 1), [0],
                    rope_inv_freq(CFG.head_dim, CFG.rope_theta))
compiled = sorted({e.data["dispatcher"].py_func.__name__ for _, e in compiles.buffer})
print(json.dumps({"started": started, "children": [c.returncode for c in children], "compiled": compiled,
                  "layer_loaded": sum(layer._cache_hits.values()),
                  "layer_compiled": sum(layer._cache_misses.values())}))
"""


def step(cache_dir) -> dict:
    """A decode step of one row in a fresh process on `cache_dir`, after compile_step_beside."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", STEP], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_decode_layer_compiles_beside_a_first_run_and_is_loaded(tmp_path):
    if usable_cpus() < 2:
        pytest.skip("compile_beside starts no child with fewer than two usable CPUs")
    first = step(tmp_path)
    assert first == {"started": True, "children": [0], "compiled": [], "layer_loaded": 1, "layer_compiled": 0}
    second = step(tmp_path)
    assert second == {"started": False, "children": [], "compiled": [], "layer_loaded": 1,
                      "layer_compiled": 0}
