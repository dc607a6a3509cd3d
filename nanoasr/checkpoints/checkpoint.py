"""A checkpoint: config, weights in their stored type and the text files beside them, and the checks it passes
before any math: names, shapes and types against model_specs/fun_asr_nano.json, finite small tensors.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nanoasr.checkpoints.spec import expected_tensors, spec
from nanoasr.errors import ModelError
from nanoasr.formats import bounds
from nanoasr.model.config import Config
from nanoasr.storage import BLOCK_TYPES, DENSE_TYPES
from nanoasr.tensor import StoredTensor, has_nonfinite

if TYPE_CHECKING:
    from nanoasr.checkpoints.ctc import CtcBranch

TEXT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "processor_config.json", "generation_config.json")  # kept verbatim in Checkpoint.files
TEXT_FILE_LIMIT = 256 << 20  # a config or tokenizer file (Qwen's tokenizer.json is 11 MB)


@dataclass(frozen=True)
class Checkpoint:
    config: Config
    tensors: dict[str, StoredTensor]  # logical name -> weight in its stored type
    files: dict[str, str] = field(default_factory=dict)  # verbatim config/tokenizer/template texts
    source: dict = field(default_factory=dict)  # path, format, repo, revision, license
    ctc: "CtcBranch | None" = None  # FunASR's CTC branch, which only some model.pt files carry
    ctc_absent: str = "its format (not FunASR's model.pt) has no CTC branch"  # why `ctc` is None


def _check_layer_counts(tensors: dict[str, StoredTensor], config: Config, where: str) -> None:
    """Every layer holds at least one tensor: a larger layer count is refused before the expected-name table
    is built (a count of 10**9 would otherwise take the memory of a billion names)."""
    for section in ("audio", "adaptor", "text"):
        n_layers = getattr(config, section).num_hidden_layers
        if n_layers > len(tensors):
            raise ModelError(f"{where}: {section}_config.num_hidden_layers is {n_layers}, but the checkpoint "
                             f"holds only {len(tensors)} tensors (expected at least one per layer)")


def validate(tensors: dict[str, StoredTensor], config: Config, where: str) -> None:
    _check_layer_counts(tensors, config, where)
    expected = expected_tensors(config)
    missing = [n for n in expected if n not in tensors]
    if missing:
        raise ModelError(f"{where}: {len(missing)} tensor(s) missing, first {missing[0]} "
                         f"(expected shape {list(expected[missing[0]][0])})")
    unknown = [n for n in tensors if n not in expected and n not in spec()["optional_tensors"]]
    if unknown:
        raise ModelError(f"{where}: unexpected tensor {unknown[0]} "
                         f"(shape {list(tensors[unknown[0]].shape)}); "
                         f"{len(unknown)} tensor(s) not in the Fun-ASR-Nano layout")
    for name, (shape, kind) in expected.items():
        t = tensors[name]
        if tuple(t.shape) != shape:
            raise ModelError(f"{where}: tensor {name}: expected shape {list(shape)}, found {list(t.shape)}")
        if kind != "matrix" and t.dtype not in DENSE_TYPES:
            raise ModelError(f"{where}: tensor {name}: expected a float type (F32/F16/BF16), "
                             f"found {t.dtype}")
    check_finite_at_load(tensors, expected, where)
    lm_head = tensors.get("lm_head.weight")
    if (lm_head is not None
            and tuple(lm_head.shape) != expected["model.language_model.embed_tokens.weight"][0]):
        raise ModelError(f"{where}: tensor lm_head.weight: expected the embedding's shape, "
                         f"found {list(lm_head.shape)}")


def check_finite_at_load(tensors: dict[str, StoredTensor], expected: dict, where: str) -> None:
    """NaN/Inf in the small tensors: vectors and kernels (widened at load anyway) and the block scales of
    quantized matrices. Dense matrices are left to the first forward (generate.py): reading them all here
    would page in the whole checkpoint."""
    for name, t in tensors.items():
        kind = expected[name][1] if name in expected else "matrix"  # lm_head.weight
        if (kind != "matrix" or t.dtype in BLOCK_TYPES) and has_nonfinite(t):
            part = "block scales" if t.dtype in BLOCK_TYPES else "values"
            raise ModelError(f"{where}: tensor {name}: expected finite {part}, found NaN or Inf "
                             f"({t.dtype} {list(t.shape)})")


# --- reading the text files, for the loaders -------------------------------------------------------------

def read_json(path: Path, what: str):
    """A JSON file's value; a missing, unreadable, non-regular, oversized, non-UTF-8 or malformed file is one
    ModelError (ValueError covers JSONDecodeError and integers of more digits than Python converts)."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ModelError(f"{path}: {what} is not valid JSON ({type(exc).__name__}: {exc})") from None


def read_text(path: Path, what: str = "text file") -> str:
    try:
        return bounds.read_file(path, TEXT_FILE_LIMIT, what).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelError(f"{path}: {what} cannot be read as UTF-8 text ({exc})") from None
