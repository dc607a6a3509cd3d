"""Checkpoints opened by path: a safetensors directory, a .gguf file, or FunASR's model.pt (the file, or a
directory that holds it); weights memory-mapped in their stored type and validated before any math.
"""
from __future__ import annotations

from pathlib import Path

from nanoasr.checkpoints.checkpoint import TEXT_FILES, Checkpoint, read_json, read_text, validate
from nanoasr.checkpoints.gguf_schema import load_gguf
from nanoasr.checkpoints.layouts import to_logical
from nanoasr.checkpoints.runtimes.funasr import load_funasr
from nanoasr.checkpoints.runtimes.funasr_llamacpp import DECODER_ARCH, ENCODER_ARCH, load_pair
from nanoasr.errors import ModelError
from nanoasr.formats import gguf_read, safetensors
from nanoasr.model import config as config_mod
from nanoasr.model.config import Config


def _legacy_config(raw: dict, where: str) -> dict:
    """The first Hub revision's `encoder_config` spelled as the nested audio_config (same meaning)."""
    enc = raw.get("encoder_config")
    if not isinstance(enc, dict) or "audio_config" in raw:
        return raw
    renamed = {"d_model": "hidden_size", "encoder_attention_heads": "num_attention_heads",
               "encoder_ffn_dim": "intermediate_size", "kernel_size": "fsmn_kernel_size"}
    audio = {renamed.get(k, k): v for k, v in enc.items()}
    main, timestamp = enc.get("encoder_layers", 0), enc.get("num_timestamp_prediction_blocks", 0)
    if any(isinstance(n, bool) or not isinstance(n, int) for n in (main, timestamp)):
        raise ModelError(f"{where}: encoder_config.encoder_layers and num_timestamp_prediction_blocks must "
                         f"be integers, found {main!r} and {timestamp!r}")
    if "encoder_layers" in enc:  # transcription layers; the timestamp layers come on top
        audio["num_hidden_layers"] = main + timestamp
    if "num_timestamp_prediction_blocks" in enc:
        audio["num_timestamp_prediction_layers"] = timestamp
    return dict(raw, audio_config=audio)


def load_config(path: Path) -> Config:
    raw = read_json(path, "config.json")
    if not isinstance(raw, dict):
        raise ModelError(f"{path}: expected a JSON object, found {type(raw).__name__}")
    return config_mod.from_dict(_legacy_config(raw, str(path)), str(path))


def _file_magic(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(4)
    except OSError as exc:
        raise ModelError(f"{path}: cannot be read ({exc})") from None


def _architecture(contents: tuple[dict, dict]) -> str | None:
    arch = contents[0].get("general.architecture")
    return arch if isinstance(arch, str) else None


def _load_gguf(path: Path, llm: Path | None, contents: tuple[dict, dict] | None = None) -> Checkpoint:
    """One GGUF, or FunASR's llama.cpp encoder file with its decoder file `llm`; the file is read once."""
    contents = contents or gguf_read.read(path)
    arch = _architecture(contents)
    if arch == ENCODER_ARCH:
        if llm is None:
            raise ModelError(f"{path}: the encoder file of FunASR's llama.cpp runtime; give its decoder file "
                             f"too (--llm QWEN3.gguf), or a directory that holds both")
        return load_pair(path, Path(llm), {path: contents})
    if llm is not None:
        raise ModelError(f"{path}: --llm is only for the encoder file of FunASR's llama.cpp runtime "
                         f"(general.architecture {ENCODER_ARCH!r}), found {arch!r}")
    if arch == DECODER_ARCH:
        raise ModelError(f"{path}: a llama.cpp qwen3 GGUF holds the decoder only; give FunASR's encoder GGUF "
                         f"as the model and this file as --llm, or a directory that holds both")
    return load_gguf(path, contents)


def _load_file(path: Path, llm: Path | None) -> Checkpoint:
    """A GGUF or a torch.save archive, told apart by their first bytes (a .gguf name goes to the GGUF reader,
    which names what is wrong with it)."""
    magic = _file_magic(path)
    if magic == b"GGUF" or path.suffix.lower() == ".gguf":
        return _load_gguf(path, llm)
    if llm is not None:
        raise ModelError(f"{path}: --llm is only for the encoder file of FunASR's llama.cpp runtime")
    if magic == b"PK\x03\x04":  # a zip: torch.save's format
        return load_funasr(path)
    raise ModelError(f"{path}: expected a GGUF file or a torch.save archive (model.pt), "
                     f"found a file starting with {magic!r}")


def _gguf_folder(path: Path) -> Checkpoint:
    """A directory of GGUF files: FunASR's llama.cpp pair (encoder + qwen3 decoder), or a single GGUF."""
    files = sorted(path.glob("*.gguf"))
    contents = {f: gguf_read.read(f) for f in files}  # headers parsed, tensors memory-mapped: read once
    by_arch: dict[str | None, list[Path]] = {}
    for f in files:
        by_arch.setdefault(_architecture(contents[f]), []).append(f)
    encoders, decoders = by_arch.get(ENCODER_ARCH, []), by_arch.get(DECODER_ARCH, [])
    if len(encoders) == 1 and len(decoders) == 1:
        return load_pair(encoders[0], decoders[0], contents)
    if len(files) == 1:
        return _load_gguf(files[0], None, contents[files[0]])
    raise ModelError(f"{path}: expected one model in the directory: a config.json checkpoint, model.pt, one "
                     f"GGUF, or FunASR's llama.cpp encoder + decoder GGUFs; found {len(files)} GGUF file(s) "
                     f"({', '.join(f.name for f in files)})")


def load_checkpoint(path: str | Path, llm: str | Path | None = None) -> Checkpoint:
    """A safetensors checkpoint directory, a .gguf file, FunASR's model.pt (the file, or a directory that
    holds it), or FunASR's llama.cpp encoder GGUF with its decoder GGUF `llm` (or a directory holding both)
    -> validated Checkpoint (weights memory-mapped)."""
    path = Path(path)
    if path.is_file():
        return _load_file(path, llm)
    if not path.exists():
        raise ModelError(f"{path}: no such model directory, .gguf or model.pt file")
    if not path.is_dir():
        raise ModelError(f"{path}: expected a checkpoint directory, a .gguf file or a model.pt file")
    if llm is not None:
        raise ModelError(f"{path}: --llm needs the encoder GGUF file as the model, not a directory")
    safetensors_files = ("model.safetensors", "model.safetensors.index.json")
    if (path / "model.pt").is_file() and not any((path / n).exists() for n in safetensors_files):
        return load_funasr(path / "model.pt")
    if not (path / "config.json").exists() and any(path.glob("*.gguf")):
        return _gguf_folder(path)
    config = load_config(path / "config.json")
    files = {name: read_text(path / name) for name in TEXT_FILES if (path / name).is_file()}
    if "tokenizer.json" not in files:
        raise ModelError(f"{path}: tokenizer.json is missing (the checkpoint's tokenizer is required)")
    tensors = to_logical(safetensors.read_checkpoint_dir(path), config)
    validate(tensors, config, str(path))
    return Checkpoint(config, tensors, files, {"path": str(path), "format": "safetensors"})
