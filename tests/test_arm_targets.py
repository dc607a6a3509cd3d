"""Every CPU kernel compiles for aarch64 from this machine. A process whose kernel choice (kernels/target.py)
is told the target is aarch64 runs the tiny model (Q4_K and Q6_K, bf16, Q8_0 weights) and calls every other
kernel's entry point, keeping each compiled library's LLVM IR as numba optimized it, before the host's code
generation lowers it for x86; LLVM's AArch64 back end then compiles that IR, generic (NEON), with dotprod and
with i8mm. No x86 intrinsic may reach an ARM target, and the x86-only kernels (the int8 and bf16 products)
are never chosen there.
"""
import json
import os
import re
import subprocess
import sys

import llvmlite.binding as llvm
import pytest

from nanoasr import convert
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.kernels import target
from nanoasr.kernels.int8 import dot as int8_dot
from tests.conftest import ROOT

TRIPLE = "aarch64-unknown-linux-gnu"
ARM_TARGETS = {"generic": "+neon", "dotprod": "+neon,+dotprod", "i8mm": "+neon,+dotprod,+i8mm"}
# each model with the activations ARM_RUN gives it; q4_k_m: Q4_K and Q6_K matrices
STORED = ("q4_k_m", "bf16", "q8_0")
# kernels only the x86 paths call: an aarch64 target must never compile them
X86_ONLY = re.compile(r"nanoasr\.kernels\.(int8\.|bf16\.)")

ARM_RUN = """
import gc, json, pathlib, sys
import llvmlite.binding as llvm
import numba
import numpy as np
from numba.core import codegen

ir_of = {}
finalize = codegen.CPUCodeLibrary._finalize_final_module


def keep_ir(library):
    # the optimized module as it was before the host's code generation, which rewrites it in place for x86
    # (an atomic decrement becomes llvm.x86.atomic.sub.cc): kept, and linked as such into later libraries
    ir_of[library] = str(library._final_module)
    finalize(library)
    library._final_module = llvm.parse_assembly(ir_of[library])


codegen.CPUCodeLibrary._finalize_final_module = keep_ir
from nanoasr.kernels import target
target.architecture = lambda: "aarch64"
target.features = lambda: dict.fromkeys(("neon", "fp-armv8", "dotprod", "i8mm", "bf16"), True)

from nanoasr.api import Model
from nanoasr.backend import cpu as cpu_backend
from nanoasr.kernels import blas_split, softmax, stored
from nanoasr.kernels import elementwise as ew
from nanoasr.kernels.stored.float_rows import MATVEC
from nanoasr.storage import STORED_NUMPY
from nanoasr.kernels.int8.dot import host_path
from nanoasr.kernels.bf16 import amx, avx512
from tests.test_int8_activations import forced_logits

out = pathlib.Path(sys.argv[1])
choice = {"int8": host_path(), "amx": amx.available(), "avx512_bf16": avx512.available(),
          "bf16": cpu_backend.bf16_kernel() is not None}
for model, activations in zip(sys.argv[2:], ("exact", "bf16", "int8")):  # decoder layers and attention
    assert np.isfinite(forced_logits(Model.load(model, activations=activations))).all()
rows, cols = 16, 256
for dtype in MATVEC:
    shape = (rows, cols // stored.QK[dtype][0] * stored.QK[dtype][1]) if dtype in stored.QK else (rows, cols)
    data = np.zeros(shape, STORED_NUMPY[dtype])
    for n in (1, 4, 8):
        x = np.ones((n, cols), np.float32)
        stored.matvec(x, data, dtype, rows, cols, np.empty((n, rows), np.float32))
    stored.widen(data, dtype, rows, cols, np.empty((rows, cols), np.float32))
x, w = np.ones((64, 32), np.float32), np.ones(32, np.float32)
for split in (False, True):  # one thread's rows, and rows shared among numba's threads
    ew.layer_norm(x, w, w, 1e-5, split)
    ew.rms_norm(x, w, 1e-6, split)
    ew.swiglu(x.copy(), x, split)
    ew.fsmn(np.ones((16, 32), np.float32), np.ones((32, 1, 11), np.float32), split)
    ew.add_bias(x.copy(), w, True, split)
    softmax.softmax_inplace(x.copy(), 1.0, split)
softmax.greedy_choice(np.ones((2, 100), np.float32))
ew.apply_rope(np.ones((4, 2, 32), np.float32), np.ones((4, 32), np.float32), np.ones((4, 32), np.float32))
from nanoasr.kernels import decode_layer  # its bf16 rows serve weights marked for a bf16 kernel (x86 today)
decode_layer._bf16_rows(x)
heads = np.ones((1, 4, 1024, 64), np.float32)
assert blas_split.products(heads, heads) is not None
compiled = {}
for obj in gc.get_objects():
    kernel = (isinstance(obj, numba.core.registry.CPUDispatcher)
              and obj.py_func.__module__.startswith("nanoasr.kernels"))
    if kernel and obj.targetoptions.get("inline") != "always":  # inlined: compiled within its callers
        name = obj.py_func.__module__ + "." + obj.py_func.__qualname__
        modules = compiled.setdefault(name, [])
        for cres in obj.overloads.values():
            path = out / f"{name}.{len(modules)}.ll"
            path.write_text(ir_of[cres.library])
            modules.append(path.name)
# the same IR taken from an x86-only driver: the check below must catch it
stored.matvec_int8(np.ones((1, 64), np.float32), np.zeros((4, 68), np.uint8), "q8_0", 4, 64,
                   np.empty((1, 4), np.float32), "avx2")
control = stored.MATVEC_INT8["q8_0", "avx2"]
(out / "x86_control.ll").write_text(ir_of[next(iter(control.overloads.values())).library])
print(json.dumps({"choice": choice, "compiled": compiled}))
"""


@pytest.fixture(scope="module")
def arm_run(tiny_dir, tmp_path_factory):
    """The aarch64-target process's kernel choice, and {kernel: its IR files} for every kernel it compiled."""
    tmp = tmp_path_factory.mktemp("arm")
    models = []
    for stored in STORED:
        path = tmp / f"tiny-{stored}.gguf"
        convert.write(path, load_checkpoint(tiny_dir), stored, report=False, progress=None)
        models.append(str(path))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", ARM_RUN, str(tmp), *models], env=env, capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp, json.loads(done.stdout.splitlines()[-1])


def aarch64_assembly(ir_text: str, features: str) -> str:
    """The module's AArch64 assembly: the host's triple and data layout replaced by the target's."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    machine = llvm.Target.from_triple(TRIPLE).create_target_machine(features=features)
    module = llvm.parse_assembly(ir_text)
    module.triple, module.data_layout = TRIPLE, str(machine.target_data)
    return machine.emit_assembly(module)


def test_llvmlite_carries_the_aarch64_back_end():
    llvm.initialize_all_targets()
    assert llvm.Target.from_triple(TRIPLE).name == "aarch64"


def test_an_aarch64_target_chooses_no_x86_kernel(arm_run):
    _, run = arm_run
    assert run["choice"] == {"int8": None, "amx": False, "avx512_bf16": False, "bf16": False}
    chosen_x86 = [name for name in run["compiled"] if X86_ONLY.match(name) and run["compiled"][name]]
    assert chosen_x86 == [], "x86-only kernels compiled for an aarch64 target"


def test_every_other_kernel_was_compiled(arm_run):
    """The run reaches every kernel the aarch64 target may use, so that the compilation below covers all."""
    _, run = arm_run
    missing = [name for name, files in run["compiled"].items() if not files and not X86_ONLY.match(name)]
    assert missing == []
    assert len(run["compiled"]) > 20


@pytest.mark.parametrize("arm", ARM_TARGETS)
def test_every_kernel_compiles_for_aarch64(arm_run, arm):
    tmp, run = arm_run
    for name, files in run["compiled"].items():
        for file in files:
            ir_text = (tmp / file).read_text()
            assert "@llvm.x86." not in ir_text, f"{file}: an x86 intrinsic"
            assembly = aarch64_assembly(ir_text, ARM_TARGETS[arm])
            assert re.search(r"^\s+ret$", assembly, re.M), f"{file}: no AArch64 code"


def test_an_x86_kernel_is_caught(arm_run):
    """The IR kept the same way from the x86 path's driver names its intrinsics: the check above would see
    them (LLVM's AArch64 back end aborts the process on one it cannot select)."""
    tmp, _ = arm_run
    assert "@llvm.x86.avx2.pmadd" in (tmp / "x86_control.ll").read_text()


@pytest.mark.parametrize("triple, arch", [("x86_64-unknown-linux-gnu", "x86_64"),
                                          ("aarch64-unknown-linux-gnu", "aarch64"),
                                          ("arm64-apple-darwin23.0.0", "aarch64")])
def test_the_architecture_is_the_process_triples(monkeypatch, triple, arch):
    monkeypatch.setattr(llvm, "get_process_triple", lambda: triple)
    target.architecture.cache_clear()
    try:
        assert target.architecture() == arch
    finally:
        monkeypatch.undo()
        target.architecture.cache_clear()


def test_no_int8_path_off_x86_whatever_the_features(monkeypatch):
    """The x86 paths' feature names decide nothing on another architecture."""
    monkeypatch.setattr(target, "features", lambda: {"avx2": True, "avx512vnni": True, "avx512bw": True})
    int8_dot.host_path.cache_clear()
    try:
        monkeypatch.setattr(target, "architecture", lambda: "x86_64")
        assert int8_dot.host_path() == "vnni"
        int8_dot.host_path.cache_clear()
        monkeypatch.setattr(target, "architecture", lambda: "aarch64")
        assert int8_dot.host_path() is None
    finally:
        monkeypatch.undo()
        int8_dot.host_path.cache_clear()
