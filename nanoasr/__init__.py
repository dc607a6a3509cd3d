"""nanoasr: offline speech-to-text with Fun-ASR-Nano on numpy + numba (CPU) and CuPy (NVIDIA GPUs).

    import nanoasr
    model = nanoasr.load_model()               # the official checkpoint, pinned revision
    print(model.transcribe("meeting.m4a").text)

Importing nanoasr is light: numba kernels and CuPy load only when a model needs them.
"""
import os

# OpenBLAS's threads keep spinning for 2^28 cycles (about 0.1 s) after each call, on the cores that numba's
# threads need next: the decode steps after a prefill's GEMMs ran slower (docs/reports/performance.md).
# 2^20 cycles (under a millisecond) still spans the gaps between the encoder's calls. OpenBLAS reads this
# when numpy loads it, so it holds where nanoasr is imported first (its commands are); a value already set
# stands.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

from nanoasr.errors import AudioError, AudioTooLongError, ModelError, NanoasrError, OptionError  # noqa: E402
from nanoasr.transcript import Segment, Transcript, Word  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "AudioError", "AudioTooLongError", "Model", "ModelError", "NanoasrError", "OptionError", "Segment",
    "Transcript", "Word", "load_model",
]


def load_model(model=None, device="cpu", threads=None, **kwargs):
    """Load a Fun-ASR-Nano model: a local directory or .gguf, a hub id (`org/repo[@rev]`), or a package
    name; by default $NANOASR_MODEL or the config file's `model`, else the default package (nanoasr.hub)."""
    from nanoasr.api import Model

    return Model.load(model, device=device, threads=threads, **kwargs)


def __getattr__(name):
    if name == "Model":
        from nanoasr.api import Model

        return Model
    raise AttributeError(f"module 'nanoasr' has no attribute {name!r}")
