"""Backend selection without a GPU: the CPU path is unaffected and asking for CUDA fails with one clear
message."""
import subprocess
import sys

import pytest

from nanoasr import backend
from nanoasr.errors import OptionError

usable, why = backend.cuda_status()


@pytest.mark.skipif(usable, reason="a GPU is usable here")
def test_cuda_request_names_what_is_missing(capsys):
    with pytest.raises(OptionError, match="device='cuda' is not available: ") as info:
        backend.resolve("cuda")
    assert why in str(info.value) and ("CuPy" in why)
    assert backend.resolve("auto") is backend.CPU
    assert "running on the CPU" in capsys.readouterr().err


def test_unknown_device_is_rejected():
    with pytest.raises(OptionError, match="device must be one of auto, cpu, cuda; got 'tpu'"):
        backend.resolve("tpu")


def test_import_and_cpu_load_never_import_cupy(tiny_dir):
    code = ("import sys, nanoasr; m = nanoasr.load_model(sys.argv[1], device='cpu'); "
            "assert 'cupy' not in sys.modules, 'cupy imported'")
    subprocess.run([sys.executable, "-c", code, str(tiny_dir)], check=True)


@pytest.mark.skipif(usable, reason="a GPU is usable here")
def test_cli_device_cuda_fails_with_one_line(tiny_dir, tmp_path):
    import numpy as np
    import soundfile

    wav = tmp_path / "a.wav"
    soundfile.write(wav, np.zeros(16000, np.float32), 16000)
    done = subprocess.run([sys.executable, "-m", "nanoasr", str(wav), "--model", str(tiny_dir),
                           "--device", "cuda"], capture_output=True, text=True)
    assert done.returncode != 0 and done.stdout == ""
    assert "device='cuda' is not available" in done.stderr and "Traceback" not in done.stderr
