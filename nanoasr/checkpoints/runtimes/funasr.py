"""FunASR's own folder: model.pt (a torch.save archive, read by nanoasr.formats.torch_zip), config.yaml
and the Qwen3-0.6B/ folder with the decoder's config and tokenizer.
"""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from nanoasr.checkpoints import ctc
from nanoasr.checkpoints.checkpoint import TEXT_FILES, Checkpoint, read_json, read_text, validate
from nanoasr.checkpoints.layouts import to_logical
from nanoasr.checkpoints.shapes import config_from_shapes, layer_count
from nanoasr.errors import ModelError
from nanoasr.formats import torch_zip
from nanoasr.model import config as config_mod
from nanoasr.model.config import Config
from nanoasr.tensor import StoredTensor
from nanoasr.untrusted import short

QWEN_FOLDER = "Qwen3-0.6B"  # config.yaml's llm_conf.init_param_path: the decoder's config and tokenizer
QWEN_FILES = tuple(n for n in TEXT_FILES if n != "config.json")  # Qwen's config.json is the decoder's alone
# config.yaml key -> typed-config field (funasr/models/sense_voice/model.py SenseVoiceEncoderSmall,
# funasr/models/llm_asr/adaptor.py Transformer, the frontend_conf of WavFrontend)
YAML_AUDIO = {"output_size": "hidden_size", "attention_heads": "num_attention_heads",
              "linear_units": "intermediate_size", "kernel_size": "fsmn_kernel_size"}
YAML_ADAPTOR = {"attention_heads": "num_attention_heads", "n_layer": "num_hidden_layers",
                "ffn_dim": "projector_hidden_size"}
YAML_FRONTEND = {"n_mels": "num_mel_bins", "lfr_m": "num_stacked_frames"}
MAX_YAML_ALIASES = 16  # expands a document at most ~350-fold (3^5); FunASR's config.yaml has no alias


def funasr_layout(names, where: str) -> Config:
    """The encoder layer counts FunASR's names show (encoders0, encoders, tp_encoders): enough to map them."""
    main = layer_count(names, "audio_encoder.encoders.", where)
    timestamp = layer_count(names, "audio_encoder.tp_encoders.", where)
    return Config(audio=config_mod.AudioConfig(num_hidden_layers=1 + main + timestamp,
                                               num_timestamp_prediction_layers=timestamp))


def _yaml_loader(yaml):
    """PyYAML's safe loader, refusing more than MAX_YAML_ALIASES aliases: each alias is a reference, and a
    kilobyte of nested ones (an alias bomb) stands for gigabytes once anything walks the whole value."""
    class Loader(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_YAML_ALIASES:
                    raise yaml.YAMLError(f"more than {MAX_YAML_ALIASES} aliases")
            return super().compose_node(parent, index)
    return Loader


def _read_yaml(path: Path) -> dict | None:
    """config.yaml as a mapping; None when it is absent or PyYAML (not a dependency) is not installed."""
    if not path.exists():
        return None
    try:
        import yaml
    except ImportError:
        return None
    text = read_text(path, "config.yaml")
    try:
        raw = yaml.load(text, Loader=_yaml_loader(yaml))
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # ValueError: a number of 5,000 digits
        raise ModelError(f"{path}: config.yaml is not valid YAML ({type(exc).__name__}: "
                         f"{short(str(exc))})") from None
    if not isinstance(raw, dict):
        raise ModelError(f"{path}: expected a YAML mapping, found {type(raw).__name__}")
    return raw


def _yaml_ints(raw: dict, section: str, keys: dict, path: Path) -> dict:
    """The integer fields of one config.yaml section, renamed to typed-config fields."""
    conf = raw.get(section) or {}
    if not isinstance(conf, dict):
        raise ModelError(f"{path}: {section} must be a mapping, found {type(conf).__name__}")
    out = {}
    for key, field_name in keys.items():
        value = conf.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelError(f"{path}: {section}.{key} must be an integer, found {short(value)}")
        out[field_name] = value
    return out


def _yaml_sections(raw: dict, path: Path) -> tuple[dict, dict]:
    """(audio, adaptor) fields that FunASR's config.yaml states."""
    encoder_keys = dict(YAML_AUDIO, num_blocks="num_blocks", tp_blocks="tp_blocks")
    audio = _yaml_ints(raw, "audio_encoder_conf", encoder_keys, path)
    audio.update(_yaml_ints(raw, "frontend_conf", YAML_FRONTEND, path))
    if "num_blocks" in audio or "tp_blocks" in audio:  # encoders0 + encoders count num_blocks; tp on top
        main, timestamp = audio.pop("num_blocks", 0), audio.pop("tp_blocks", 0)
        audio.update(num_hidden_layers=main + timestamp, num_timestamp_prediction_layers=timestamp)
    adaptor_keys = dict(YAML_ADAPTOR, downsample_rate="downsample_rate")
    adaptor = _yaml_ints(raw, "audio_adaptor_conf", adaptor_keys, path)
    # absent means false, FunASR's default (Fun-ASR-MLT-Nano's config.yaml leaves it out)
    low_frame_rate = (raw.get("audio_adaptor_conf") or {}).get("use_low_frame_rate", False)
    if not isinstance(low_frame_rate, bool):
        raise ModelError(f"{path}: audio_adaptor_conf.use_low_frame_rate must be true or false, "
                         f"found {short(low_frame_rate)}")
    adaptor["use_low_frame_rate"] = low_frame_rate
    rate = adaptor.pop("downsample_rate", 1)
    if rate != 1:
        raise ModelError(f"{path}: audio_adaptor_conf.downsample_rate {rate} is not supported (expected 1)")
    return audio, adaptor


def _funasr_config(folder: Path, tensors: dict[str, StoredTensor], raw_yaml: dict | None,
                   where: str) -> Config:
    """Config from config.yaml (encoder, adaptor) and Qwen3-0.6B/config.json (decoder) where present;
    what they leave open comes from tensor shapes, and a warning lists what had to be assumed."""
    shapes, assumed = config_from_shapes(tensors, None, where)
    yaml_path, qwen = folder / "config.yaml", folder / QWEN_FOLDER / "config.json"
    audio, adaptor = _yaml_sections(raw_yaml, yaml_path) if raw_yaml is not None else ({}, {})
    text = read_json(qwen, "config.json") if qwen.is_file() else dataclasses.asdict(shapes.text)
    if not isinstance(text, dict):
        raise ModelError(f"{qwen}: expected a JSON object, found {type(text).__name__}")
    unread = {"audio": raw_yaml is None, "adaptor": raw_yaml is None, "text": not qwen.is_file()}
    guessed = [a for a in assumed if unread.get(a.split(".")[0])]
    if guessed:
        missing = ["config.yaml (or PyYAML is not installed)"] * (raw_yaml is None)
        missing += [f"{QWEN_FOLDER}/config.json"] * unread["text"]
        warnings.warn(f"{where}: no readable {' or '.join(missing)}; config derived from tensor shapes, "
                      f"assumed {len(guessed)} field(s): {', '.join(guessed)}", stacklevel=2)
    raw = {"audio_config": dict(dataclasses.asdict(shapes.audio), **audio),
           "adaptor_config": dict(dataclasses.asdict(shapes.adaptor), **adaptor), "text_config": text}
    return config_mod.from_dict(raw, where)


def _qwen_files(folder: Path) -> dict[str, str]:
    qwen = folder / QWEN_FOLDER
    if not (qwen / "tokenizer.json").is_file():
        raise ModelError(f"{qwen / 'tokenizer.json'}: missing; FunASR's model.pt takes its tokenizer from "
                         f"the {QWEN_FOLDER}/ folder beside it")
    return {name: read_text(qwen / name) for name in QWEN_FILES if (qwen / name).is_file()}


def _drop_tied_head(tensors: dict[str, StoredTensor]) -> dict[str, StoredTensor]:
    """FunASR's Qwen3 ties llm.lm_head to the embeddings, so torch.save wrote one storage for both: kept
    once, as in the Transformers layout (a GGUF would otherwise carry the matrix twice)."""
    head, embed = tensors.get("lm_head.weight"), tensors.get("model.language_model.embed_tokens.weight")
    if (head is not None and embed is not None and head.dtype == embed.dtype and head.shape == embed.shape
            and head.data.ctypes.data == embed.data.ctypes.data):
        return {name: t for name, t in tensors.items() if name != "lm_head.weight"}
    return tensors


def load_funasr(weights: Path) -> Checkpoint:
    """FunASR's model.pt (read without torch), with config.yaml and Qwen3-0.6B/ from the folder beside it."""
    where = str(weights)
    raw = torch_zip.read(weights)  # to_logical drops the CTC tensors; ctc.load reads them
    if not any(n.startswith("audio_encoder.") for n in raw):
        raise ModelError(f"{where}: no audio_encoder.* tensors; expected FunASR's Fun-ASR-Nano state dict "
                         f"(audio_encoder, audio_adaptor, llm)")
    files = _qwen_files(weights.parent)
    tensors = _drop_tied_head(to_logical(raw, funasr_layout(raw, where)))
    raw_yaml = _read_yaml(weights.parent / "config.yaml")
    config = _funasr_config(weights.parent, tensors, raw_yaml, where)
    validate(tensors, config, where)
    branch, absent = ctc.load(raw, raw_yaml, weights.parent, where)
    return Checkpoint(config, tensors, files, {"path": where, "format": "model.pt"}, branch, absent or "")
