"""activations="auto", the default, resolves per stored type and CPU: int8 rows against Q8_0/Q4_K/Q6_K where
the CPU has the int8 kernels (AVX2 or AVX512-VNNI), bf16 rows against BF16 where it multiplies bf16 natively
(AMX or AVX512-BF16), float32 rows elsewhere. The CPU's features are held with numba's target settings, as
tests/test_target.py does. A loaded model's Plan says what it resolved to."""
import inspect
import platform

import llvmlite.binding as llvm
import numpy as np
import pytest
import soundfile

from nanoasr import api, cli
from nanoasr.backend import cpu, host
from nanoasr.cli import doctor, serve, transcribe
from nanoasr.kernels import target
from nanoasr.kernels.int8 import dot as int8_dot
from nanoasr.tensor import StoredTensor
from tests.test_target import numba_features  # noqa: F401  (the fixture)

HOST = llvm.get_host_cpu_features()
TYPES = ("f32", "f16", "bf16", "q8_0", "q4_k", "q6_k")


def marks(activations: str = "auto") -> dict[str, str]:
    """stored type -> the activations cpu.place marks such a matrix with."""
    tensors = {kind: StoredTensor(np.zeros((1, 1), np.uint8), kind, (32, 256)) for kind in TYPES}
    placed = cpu.place(tensors, set(), activations) if activations else cpu.place(tensors, set())
    return {kind: t.activations for kind, t in placed.items()}


def test_auto_is_the_default_everywhere():
    assert marks(None) == marks("auto")
    for function in (api.Model.__init__, api.Model.load):
        assert inspect.signature(function).parameters["activations"].default == "auto"
    assert transcribe.build_parser().parse_args(["a.wav"]).activations == "auto"
    assert serve.build_parser().parse_args([]).activations == "auto"


@pytest.mark.skipif(not HOST.get("avx2"), reason="the int8 kernels need AVX2")
def test_auto_takes_int8_rows_for_block_quantized_weights_on_avx2(numba_features):  # noqa: F811 (the fixture)
    numba_features("+avx2,+fma,+f16c")  # an AVX2 CPU without AVX-512 or AMX
    assert marks() == {"f32": "exact", "f16": "exact", "bf16": "exact", "q8_0": "int8", "q4_k": "int8",
                       "q6_k": "int8"}
    assert doctor.kernels()["auto_activations"] == ("f32 exact, f16 exact, bf16 exact, q8_0 int8, q4_k int8, "
                                                    "q6_k int8")


def test_auto_keeps_float32_rows_where_the_cpu_has_neither_path(numba_features):  # noqa: F811 (the fixture)
    numba_features("")  # numba's generic target: no feature at all
    assert set(marks().values()) == {"exact"}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the bf16 GEMM is x86_64's")
def test_auto_takes_bf16_rows_for_bf16_weights_on_native_bf16(numba_features, monkeypatch):  # noqa: F811
    numba_features(None)
    with_bf16 = {**{name: False for name in HOST}, "avx2": True, "avx512bw": True, "avx512bf16": True}
    monkeypatch.setattr(target, "features", lambda: with_bf16)
    assert marks() == {"f32": "exact", "f16": "exact", "bf16": "bf16", "q8_0": "int8", "q4_k": "int8",
                       "q6_k": "int8"}


def test_the_named_modes_apply_to_the_types_they_name():
    assert marks("exact") == dict.fromkeys(TYPES, "exact")
    assert marks("bf16") == {**dict.fromkeys(TYPES, "exact"), "bf16": "bf16"}
    block_quantized = dict.fromkeys(("q8_0", "q4_k", "q6_k"), "int8")
    assert marks("int8") == {**dict.fromkeys(TYPES, "exact"), **block_quantized}


def test_the_plan_of_a_loaded_model_and_where_it_is_shown(tiny_checkpoint, tiny_dir, tmp_path, capsys):
    plan = api.Model(tiny_checkpoint, threads=1).plan
    assert plan.device == "cpu" and plan.isa == (int8_dot.host_path() or "float32")
    assert plan.activations == (("bf16", cpu.resolved_activations("bf16", "auto")),)
    assert plan.threads == "1" and plan.wait == host.start_numba_threads().wait
    assert plan.pages == "read through the file mapping"
    assert doctor.main(["--model", str(tiny_dir)]) == 0
    assert f"  activations: bf16 {plan.activations[0][1]}\n" in capsys.readouterr().out
    soundfile.write(tmp_path / "a.wav", np.zeros(16000, np.float32), 16000)
    assert cli.main([str(tmp_path / "a.wav"), "--model", str(tiny_dir), "--threads", "1", "-v"]) == 0
    assert f"; plan: {plan}\n" in capsys.readouterr().err
