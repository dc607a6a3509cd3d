"""Every CPU kernel compiles for aarch64 from this machine. A process whose kernel choice (kernels/target.py)
is told the target is aarch64 without dotprod runs the tiny model (Q4_K and Q6_K, bf16, Q8_0 weights) and
calls every other kernel's entry point, keeping each compiled library's LLVM IR as numba optimized it, before
the host's code generation lowers it for x86; LLVM's AArch64 back end then compiles that IR, generic (NEON),
with dotprod and with i8mm. No x86 intrinsic may reach an ARM target, and the int8 and bf16 products are
never chosen there. The int8 products' AArch64 paths (sdot with dotprod, smmla with i8mm), which cannot run
here, are compiled by numba itself for an aarch64 target in another process, and their assembly shows the
instructions; they run under emulation in tools/arm_check.sh.
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
# kernels an aarch64 target without dotprod must never compile: the int8 products (x86's, and AArch64's with
# dotprod or i8mm) and the bf16 products (x86's)
NOT_GENERIC = re.compile(r"nanoasr\.kernels\.(int8\.|bf16\.)")
INTEGER_OPS = re.compile(r"^\s+(sdot|smmla)\s", re.M)

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
target.features = lambda: dict.fromkeys(("neon", "fp-armv8", "bf16"), True)

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
assert blas_split.matmul(np.ones((128, 256), np.float32), np.ones((512, 256), np.float32)) is not None
compiled = {}
for obj in gc.get_objects():
    kernel = (issubclass(type(obj), numba.core.registry.CPUDispatcher)
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


def test_an_aarch64_target_without_dotprod_chooses_no_integer_or_x86_kernel(arm_run):
    _, run = arm_run
    assert run["choice"] == {"int8": None, "amx": False, "avx512_bf16": False, "bf16": False}
    chosen = [name for name in run["compiled"] if NOT_GENERIC.match(name) and run["compiled"][name]]
    assert chosen == [], "int8 or bf16 kernels compiled for an aarch64 target without dotprod"


def test_every_other_kernel_was_compiled(arm_run):
    """The run reaches every kernel the aarch64 target may use, so that the compilation below covers all."""
    _, run = arm_run
    missing = [name for name, files in run["compiled"].items() if not files and not NOT_GENERIC.match(name)]
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
            if arm == "generic":
                assert not INTEGER_OPS.search(assembly), f"{file}: sdot or smmla without dotprod"


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


@pytest.fixture
def fresh_host_path(monkeypatch):
    """int8_dot.host_path asked afresh under the test's patches, its cached answer forgotten after them."""
    int8_dot.host_path.cache_clear()
    yield
    monkeypatch.undo()
    int8_dot.host_path.cache_clear()


def test_no_int8_path_off_x86_whatever_the_features(monkeypatch, fresh_host_path):
    """The x86 paths' feature names decide nothing on another architecture."""
    monkeypatch.setattr(target, "features", lambda: {"avx2": True, "avx512vnni": True, "avx512bw": True})
    monkeypatch.setattr(target, "architecture", lambda: "x86_64")
    assert int8_dot.host_path() == "vnni"
    int8_dot.host_path.cache_clear()
    monkeypatch.setattr(target, "architecture", lambda: "aarch64")
    assert int8_dot.host_path() is None


@pytest.mark.parametrize("features, path", [(("neon",), None), (("neon", "dotprod"), "dotprod"),
                                            (("neon", "dotprod", "i8mm"), "i8mm"), (("neon", "i8mm"), None)])
def test_the_aarch64_int8_path_follows_dotprod_and_i8mm(monkeypatch, fresh_host_path, features, path):
    monkeypatch.setattr(target, "features", lambda: dict.fromkeys(features, True))
    monkeypatch.setattr(target, "architecture", lambda: "aarch64")
    assert int8_dot.host_path() == path


ARM_INT8 = """
import json, pathlib, sys
import llvmlite.binding as llvm

llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()
llvm.get_process_triple = lambda: "aarch64-unknown-linux-gnu"  # numba's code generation targets aarch64
from nanoasr.kernels import target

target.features = lambda: dict.fromkeys(("neon", "dotprod", "i8mm"), True)
from numba import types
from nanoasr.kernels.int8.dot import ARM_PATHS, KINDS, MATVEC_INT8, host_path
from nanoasr.kernels.int8.gemm import GEMM_INT8

out = pathlib.Path(sys.argv[1])
matrix = types.Array(types.float32, 2, "C")
signature = (matrix, types.Array(types.uint8, 2, "C"), types.int64, matrix)
files = {}
for path in ARM_PATHS:
    for kind in KINDS:
        for product, drivers in (("matvec", MATVEC_INT8), ("gemm", GEMM_INT8)):
            drivers[kind, path].compile(signature)
            name = f"{product}_{kind}_{path}.ll"
            (out / name).write_text("".join(drivers[kind, path].inspect_llvm().values()))
            files[name] = (product, path)
print(json.dumps({"choice": host_path(), "files": files}))
"""


@pytest.fixture(scope="module")
def arm_int8(tmp_path_factory):
    """The int8 products of each AArch64 path, as numba compiles them for an aarch64 target with dotprod
    and i8mm (the process's triple aarch64, numba's CPU generic with those features): {file: (product,
    path)} of their LLVM IR."""
    tmp = tmp_path_factory.mktemp("arm_int8")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp / "cache"), "NUMBA_CPU_NAME": "generic",
           "NUMBA_CPU_FEATURES": "+neon,+dotprod,+i8mm",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", ARM_INT8, str(tmp)], env=env, capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(done.stdout.splitlines()[-1])
    assert run["choice"] == "i8mm"
    return tmp, run["files"]


def test_the_dotprod_path_compiles_to_sdot_without_i8mm(arm_int8):
    """Every int8 product of the dotprod path, compiled for a CPU with dotprod and no i8mm: sdot, no smmla."""
    tmp, files = arm_int8
    dotprod = [name for name, (_, path) in files.items() if path == "dotprod"]
    assert len(dotprod) == 6
    for name in dotprod:
        ir_text = (tmp / name).read_text()
        assert "@llvm.x86." not in ir_text and "@llvm.aarch64.neon.sdot.v4i32.v16i8" in ir_text
        assembly = aarch64_assembly(ir_text, ARM_TARGETS["dotprod"])
        assert set(INTEGER_OPS.findall(assembly)) == {"sdot"}, name


def test_the_i8mm_gemm_compiles_to_smmla(arm_int8):
    """With i8mm the many-row products multiply 2 x 2 tiles (smmla); its decode products are sdot's."""
    tmp, files = arm_int8
    i8mm = {name: product for name, (product, path) in files.items() if path == "i8mm"}
    assert sorted(i8mm.values()) == ["gemm"] * 3 + ["matvec"] * 3
    for name, product in i8mm.items():
        assembly = aarch64_assembly((tmp / name).read_text(), ARM_TARGETS["i8mm"])
        assert set(INTEGER_OPS.findall(assembly)) == ({"smmla"} if product == "gemm" else {"sdot"}), name
