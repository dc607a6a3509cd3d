"""nanoasr's GGUF schema, and a GGUF file read into a Checkpoint.

A nanoasr GGUF keeps the logical tensor names and carries everything a checkpoint directory holds: every
typed-config field as `fun_asr_nano.<section>.<field>`, the checkpoint's text files verbatim as strings,
and `tokenizer.ggml.*` arrays so generic GGUF tools see the vocabulary. docs/gguf.md lists every key.
Other GGUFs of the model are read too: transcribe.cpp's, CrispASR's and audio.cpp's
(nanoasr.checkpoints.runtimes.transcribe_cpp, crispasr, audiocpp), and others with the logical names: config
from an embedded config.json, else from the tensor shapes.
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

from gguf import Keys

from nanoasr.checkpoints.checkpoint import Checkpoint, validate
from nanoasr.checkpoints.layouts import to_logical
from nanoasr.checkpoints.runtimes import audiocpp, crispasr, transcribe_cpp
from nanoasr.checkpoints.shapes import config_from_shapes
from nanoasr.errors import ModelError
from nanoasr.formats import gguf_read
from nanoasr.formats.gguf_vocab import tokenizer_files
from nanoasr.model import config as config_mod
from nanoasr.model.config import SECTIONS, Config

ARCH = "fun_asr_nano"
SCHEMA_KEY = f"{ARCH}.schema_version"
SCHEMA_VERSION = 1
LATER_KEYS = {f"{ARCH}.adaptor.use_low_frame_rate"}  # added after schema 1: the default where absent
FILE_KEYS = {  # checkpoint file -> the key that holds its text verbatim
    "config.json": f"{ARCH}.files.config_json",
    "tokenizer.json": f"{ARCH}.files.tokenizer_json",
    "chat_template.jinja": f"{ARCH}.files.chat_template",
    "processor_config.json": f"{ARCH}.files.processor_config_json",
    "generation_config.json": f"{ARCH}.files.generation_config_json",
    "tokenizer_config.json": f"{ARCH}.files.tokenizer_config_json",
}


def _config_from_keys(values: dict, where: str) -> Config:
    raw, missing = {}, []
    for section, cls in SECTIONS:
        keys = {f.name: f"{ARCH}.{section}.{f.name}" for f in dataclasses.fields(cls)}
        missing += [key for key in keys.values() if key not in values and key not in LATER_KEYS]
        raw[f"{section}_config"] = {field: values[key] for field, key in keys.items() if key in values}
    if f"{ARCH}.audio_token_id" not in values:
        missing.append(f"{ARCH}.audio_token_id")
    if missing:
        raise ModelError(f"{where}: {len(missing)} metadata key(s) missing: {', '.join(missing)}")
    raw["audio_token_id"] = values[f"{ARCH}.audio_token_id"]
    return config_mod.from_dict(raw, where)


def _embedded_files(values: dict) -> dict[str, str]:
    """nanoasr's file keys, else any string value that is a config.json or tokenizer.json (other layouts)."""
    files = {name: values[key] for name, key in FILE_KEYS.items() if isinstance(values.get(key), str)}
    for value in values.values():
        if "config.json" in files and "tokenizer.json" in files:
            break  # nanoasr's own keys: parsing the tokenizer's JSON again costs a third of a second
        if not isinstance(value, str) or not value.startswith("{"):
            continue
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):  # JSONDecodeError, or a number of too many digits to convert
            continue
        if isinstance(parsed, dict) and "text_config" in parsed:
            files.setdefault("config.json", value)
        elif isinstance(parsed, dict) and "model" in parsed and "added_tokens" in parsed:
            files.setdefault("tokenizer.json", value)
    if isinstance(values.get(Keys.Tokenizer.CHAT_TEMPLATE), str):
        files.setdefault("chat_template.jinja", values[Keys.Tokenizer.CHAT_TEMPLATE])
    return files


def _source(values: dict, path: Path) -> dict:
    return {"path": str(path), "format": "gguf",
            "repo": values.get(f"{ARCH}.source.repo"), "revision": values.get(f"{ARCH}.source.revision"),
            "license": values.get(Keys.General.LICENSE), "license_url": values.get(Keys.General.LICENSE_LINK),
            "file_type": values.get(Keys.General.FILE_TYPE)}


def _third_party_config(values: dict, files: dict, tensors: dict, where: str) -> Config:
    if "config.json" in files:
        embedded = f"{where} (embedded config.json)"
        try:
            raw = json.loads(files["config.json"])
        except (ValueError, RecursionError) as exc:
            raise ModelError(f"{embedded}: not valid JSON ({type(exc).__name__}: {exc})") from None
        return config_mod.from_dict(raw, embedded)
    config, assumed = config_from_shapes(tensors, values.get(Keys.Tokenizer.LIST), where)
    warnings.warn(f"{where}: no nanoasr metadata ({SCHEMA_KEY}); config derived from tensor shapes, "
                  f"assumed {len(assumed)} field(s): {', '.join(assumed)}", stacklevel=3)
    return config


def load_gguf(path: str | Path, contents: tuple[dict, dict] | None = None) -> Checkpoint:
    """A GGUF file -> validated Checkpoint; tensor data are views of one read-only memory map. `contents`:
    what gguf_read.read(path) returned, when the caller has read it already."""
    path = Path(path)
    where = str(path)
    values, tensors = contents or gguf_read.read(path)
    arch = values.get(Keys.General.ARCHITECTURE)
    embedded = _embedded_files(values)
    if arch in crispasr.ARCHES:
        values = crispasr.with_token_types(values)
    elif arch == audiocpp.ARCH:
        audiocpp.check_family(values, where)
        tensors = audiocpp.logical_tensors(values, tensors, where)
        embedded = dict(audiocpp.embedded_files(values, where), **embedded)
    files = tokenizer_files(values, embedded, where)
    source = _source(values, path)
    if SCHEMA_KEY in values:
        if values[SCHEMA_KEY] != SCHEMA_VERSION:
            raise ModelError(f"{where}: {SCHEMA_KEY} {values[SCHEMA_KEY]} is not supported "
                             f"(this nanoasr reads {SCHEMA_VERSION})")
        config = _config_from_keys(values, where)
    elif arch == transcribe_cpp.ARCH:
        config, tensors = transcribe_cpp.read(values, tensors, where)
        source.update(format="transcribe.cpp gguf", variant=values["stt.variant"])
    elif arch in crispasr.ARCHES:
        config, tensors = crispasr.read(values, tensors, where)
        source.update(format="CrispASR gguf", variant=crispasr.variant(values))
    elif arch == audiocpp.ARCH:
        config = _third_party_config(values, files, tensors, where)
        tensors = to_logical(tensors, config)
        source.update(format="audio.cpp gguf")
    else:
        config = _third_party_config(values, files, tensors, where)
    validate(tensors, config, where)
    return Checkpoint(config, tensors, files, source)
