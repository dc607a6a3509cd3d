"""The kernels follow numba's target (nanoasr/kernels/target.py): NUMBA_CPU_FEATURES limits the features the
product paths are chosen by, so that an AVX2 target never gets the VNNI path or the AMX tiles, and the whole
pipeline compiles and runs for it."""
import json
import os
import subprocess
import sys

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir
from numba.core import config

from nanoasr import convert
from nanoasr.backend import cpu as cpu_backend
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.kernels import target
from nanoasr.kernels.bf16 import amx
from nanoasr.kernels.bf16 import avx512 as bf16_gemm
from nanoasr.kernels.int8 import dot as int8_dot
from nanoasr.kernels.ir import vector as vector_ir
from tests.conftest import ROOT

AVX2_TARGET = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx2,+fma,+f16c,+bmi2"}
HOST_AVX2 = bool(llvm.get_host_cpu_features().get("avx2"))
HOST_AVX512 = bool(llvm.get_host_cpu_features().get("avx512f"))


@pytest.fixture
def numba_features(monkeypatch):
    """Sets numba's NUMBA_CPU_FEATURES for the test; the cached answers are forgotten before and after."""
    def forget():
        for asked in (target.features, int8_dot.host_path, amx.available, bf16_gemm.available):
            asked.cache_clear()

    def set_features(value):
        monkeypatch.setattr(config, "CPU_FEATURES", value)
        forget()
    yield set_features
    monkeypatch.undo()
    forget()


def test_without_numba_settings_the_host_features_and_path_count(numba_features):
    numba_features(None)
    host = llvm.get_host_cpu_features()
    assert target.features() == {name: bool(on) for name, on in host.items()}
    vnni = host.get("avx512vnni") and host.get("avx512bw")
    assert int8_dot.host_path() == ("vnni" if vnni else "avx2" if host.get("avx2") else None)


def test_numba_features_limit_the_product_paths(numba_features):
    host = llvm.get_host_cpu_features()
    numba_features("+avx2,+fma,+f16c,-avx512f")
    got = target.features()
    assert {name for name, on in got.items() if on} == {f for f in ("avx2", "fma", "f16c") if host.get(f)}
    assert int8_dot.host_path() == ("avx2" if host.get("avx2") else None)
    assert not amx.available() and not bf16_gemm.available()
    numba_features("")  # numba's "generic" target: no feature at all, the float32 paths
    assert int8_dot.host_path() is None and not any(target.features().values())


@pytest.mark.parametrize("host, hint, cache", [("znver4", (1, 8), "L2"), ("znver3", (1, 8), "L2"),
                                               ("sapphirerapids", (3, 4), "L1"), ("haswell", (3, 4), "L1")])
def test_the_weight_prefetch_follows_the_host_and_reaches_the_instruction(monkeypatch, host, hint, cache):
    """AMD's Zen cores prefetch into L2, further ahead; the locality is the one the emitted prefetch asks."""
    monkeypatch.setattr(llvm, "get_host_cpu_name", lambda: host)
    target.weight_prefetch.cache_clear()
    try:
        assert target.weight_prefetch() == hint and target.weight_prefetch().cache == cache
        module = ir.Module()
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType(ir.IntType(8))]), "f")
        builder = ir.IRBuilder(fn.append_basic_block())
        vector_ir.prefetch(builder, fn.args[0])
        builder.ret_void()
        assert f"i32 0, i32 {hint[0]}, i32 1)" in str(module)
    finally:
        monkeypatch.undo()
        target.weight_prefetch.cache_clear()


AVX2_RUN = """
import json, sys
import numpy as np
from numba import njit
from nanoasr.api import Model
from nanoasr.kernels.bf16 import amx
from nanoasr.kernels.int8 import dot as int8_dot
from nanoasr.kernels.int8.dot import MATVEC_INT8
from tests.test_int8_activations import forced_logits

np.save(sys.argv[2], forced_logits(Model.load(sys.argv[1], activations="int8")))
fresh = njit(parallel=True)(MATVEC_INT8["q8_0", "avx2"].py_func)  # compiled afresh: its assembly shows
fresh(np.ones((1, 64), np.float32), np.zeros((4, 68), np.uint8), 2, np.empty((1, 4), np.float32))
asm = "".join(fresh.inspect_asm().values())
print(json.dumps({"path": int8_dot.host_path(), "amx": amx.available(), "zmm": "zmm" in asm,
                  "vpmaddubsw": "vpmaddubsw" in asm}))
"""


@pytest.mark.cpu_path
@pytest.mark.skipif(not HOST_AVX2, reason="this CPU has no AVX2")
@pytest.mark.skipif(not HOST_AVX512, reason="this CPU's own target is AVX2: every other test runs that path")
def test_an_avx2_target_runs_the_avx2_path_without_avx512(tiny_dir, tmp_path, monkeypatch):
    """In a process whose numba target is Haswell (AVX2, FMA, F16C), from an empty kernel cache: the int8
    decode runs the AVX2 path, no AMX, no 512-bit registers in the compiled kernel, and the logits are the
    AVX2 path's here (within float32 rounding: reductions vectorised 8 lanes wide sum in another order
    than 16 lanes wide)."""
    from tests.test_int8_activations import forced_logits

    path = tmp_path / "tiny-q8_0.gguf"
    convert.write(path, load_checkpoint(tiny_dir), "q8_0", report=False, progress=None)
    env = {**os.environ, **AVX2_TARGET, "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", AVX2_RUN, str(path), str(tmp_path / "logits.npy")], env=env,
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"path": "avx2", "amx": False, "zmm": False,
                                                        "vpmaddubsw": True}
    from nanoasr.api import Model

    monkeypatch.setattr(cpu_backend, "host_path", lambda: "avx2")
    monkeypatch.setattr(amx, "available", lambda: False)
    here = forced_logits(Model.load(str(path), activations="int8"))
    there = np.load(tmp_path / "logits.npy")
    np.testing.assert_allclose(there, here, rtol=1e-5, atol=1e-5 * np.abs(here).max())
    assert np.array_equal(there.argmax(-1), here.argmax(-1))
