"""nanoasr: offline speech-to-text with Fun-ASR-Nano on numpy + numba (CPU) and CuPy (NVIDIA GPUs).

    import nanoasr
    model = nanoasr.load_model()               # the official checkpoint, pinned revision
    print(model.transcribe("meeting.m4a").text)

Importing nanoasr is light: numba kernels and CuPy load only when a model needs them.
"""
from nanoasr.errors import AudioError, AudioTooLongError, ModelError, NanoasrError, OptionError
from nanoasr.transcript import Segment, Transcript, Word

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
