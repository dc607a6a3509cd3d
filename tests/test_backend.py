"""Backend selection without a GPU: the CPU path is unaffected, asking for CUDA fails with one clear message,
and "auto" takes CUDA only when a round trip on the GPU passes, else warns once and runs on the CPU."""
import importlib.machinery
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

from nanoasr import backend
from nanoasr.errors import OptionError

usable, why = backend.cuda_status()


@pytest.mark.skipif(usable, reason="a GPU is usable here")
def test_cuda_request_names_what_is_missing():
    with pytest.raises(OptionError, match="device='cuda' is not available: ") as info:
        backend.resolve("cuda")
    assert why in str(info.value) and ("CuPy" in why)
    with pytest.warns(UserWarning, match="running on the CPU"):
        assert backend.resolve("auto") is backend.CPU


def test_unknown_device_is_rejected():
    with pytest.raises(OptionError, match="device must be one of auto, cpu, cuda; got 'tpu'"):
        backend.resolve("tpu")


def test_auto_without_a_usable_gpu_warns_once_and_runs_on_the_cpu(monkeypatch):
    reason = "the GPU failed a self-check: no kernel image"
    monkeypatch.setattr(backend, "cuda_status", lambda: (False, reason))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert backend.resolve("auto") is backend.CPU
    assert [str(w.message) for w in caught] == [f"nanoasr: no usable GPU ({reason}); running on the CPU"]
    assert caught[0].filename == __file__  # the warning points at the caller, not at the backend
    with pytest.raises(OptionError, match="device='cuda' is not available: the GPU failed a self-check"):
        backend.resolve("cuda")


def widened_right(cupy):
    return backend.BF16_CHECK[1]


def stand_in_cupy(monkeypatch, asarray=np.asarray, asnumpy=np.asarray, kernel=widened_right):
    """A module named cupy that sees one GPU, with the given host<->device copies, and the given answer of
    nanoasr's own kernel in the self-check."""
    cupy = types.ModuleType("cupy")
    cupy.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))
    cupy.ndarray = type("ndarray", (), {})
    cupy.asarray, cupy.asnumpy = asarray, asnumpy
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(backend, "_cuda", None)
    monkeypatch.setattr(backend, "kernel_round_trip", kernel)
    return cupy


def broken_toolkit(_):
    raise RuntimeError("CUDA_ERROR_NO_BINARY_FOR_GPU")


def no_nvvm(cupy):
    raise ImportError("libNVVM cannot be found")


@pytest.mark.parametrize("asarray, asnumpy, kernel, problem", [
    (broken_toolkit, np.asarray, widened_right, "RuntimeError: CUDA_ERROR_NO_BINARY_FOR_GPU"),
    (np.asarray, np.zeros_like, widened_right, "a test computation gave wrong numbers"),
    (np.asarray, np.asarray, no_nvvm, "ImportError: libNVVM cannot be found"),
    (np.asarray, np.asarray, lambda cupy: -backend.BF16_CHECK[1], "a test computation gave wrong numbers")])
def test_a_gpu_failing_its_self_check_is_not_used(monkeypatch, asarray, asnumpy, kernel, problem):
    stand_in_cupy(monkeypatch, asarray, asnumpy, kernel)
    assert backend.cuda_status() == (False, f"the GPU failed a self-check: {problem}")
    with pytest.warns(UserWarning, match=f"no usable GPU \\(the GPU failed a self-check: {problem}\\)"):
        assert backend.resolve("auto") is backend.CPU
    with pytest.raises(OptionError, match="device='cuda' is not available: the GPU failed a self-check"):
        backend.resolve("cuda")


def test_a_gpu_passing_its_self_check_is_chosen_by_auto(monkeypatch):
    cupy = stand_in_cupy(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = backend.resolve("auto")
    assert (chosen.name, chosen.xp) == ("cuda", cupy)
    assert backend.cuda_status() == (True, "1 GPU(s)")


def test_import_and_cpu_load_never_import_cupy(tiny_dir):
    code = ("import sys, nanoasr; assert 'numba' not in sys.modules, 'import nanoasr imported numba'; "
            "m = nanoasr.load_model(sys.argv[1], device='cpu'); "
            "assert 'cupy' not in sys.modules, 'cupy imported'")
    subprocess.run([sys.executable, "-c", code, str(tiny_dir)], check=True)


@pytest.mark.skipif(usable, reason="a GPU is usable here")
def test_cli_device_cuda_fails_with_one_line(tiny_dir, tmp_path):
    import soundfile

    wav = tmp_path / "a.wav"
    soundfile.write(wav, np.zeros(16000, np.float32), 16000)
    done = subprocess.run([sys.executable, "-m", "nanoasr", str(wav), "--model", str(tiny_dir),
                           "--device", "cuda"], capture_output=True, text=True)
    assert done.returncode != 0 and done.stdout == ""
    assert "device='cuda' is not available" in done.stderr and "Traceback" not in done.stderr
