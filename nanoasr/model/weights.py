"""Checkpoints: read weights in their stored type, map every published layout onto the logical names,
validate names, shapes and types against model_specs/fun_asr_nano.json before any math.

Logical names are the Transformers 5.23 state-dict names (DESIGN §4). Also read: older Hub revisions
(`stem`, `layers`, `timestamp_prediction_layers`, `self_attn_layer_norm`, ...) and the original FunASR
names (`audio_encoder.encoders0.0...`, fused `linear_q_k_v`, `audio_adaptor.blocks...`, `llm.model...`),
and FunASR's own folder: model.pt (a torch.save archive, read by nanoasr.formats.torch_zip), config.yaml and
the Qwen3-0.6B/ folder with the decoder's config and tokenizer.
"""
from __future__ import annotations

import dataclasses
import json
import re
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

from nanoasr.errors import ModelError
from nanoasr.formats import safetensors
from nanoasr.model import config as config_mod
from nanoasr.model.config import Config
from nanoasr.tensor import BLOCK_TYPES, DENSE_TYPES, StoredTensor, has_nonfinite

TEXT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "processor_config.json", "generation_config.json")
IGNORED = re.compile(r"^(ctc\.|ctc_decoder\.|.*rotary_emb\.inv_freq$)")  # no role in transcription


@dataclass(frozen=True)
class Checkpoint:
    config: Config
    tensors: dict[str, StoredTensor]  # logical name -> weight in its stored type
    files: dict[str, str] = field(default_factory=dict)  # verbatim config/tokenizer/template texts
    source: dict = field(default_factory=dict)  # path, format, repo, revision, license


@lru_cache(maxsize=1)
def spec() -> dict:
    return json.loads(resources.files("nanoasr").joinpath("model_specs/fun_asr_nano.json").read_text("utf-8"))


def _layer_set(key: str, config: Config) -> list[int]:
    a = config.audio
    sets = {
        "audio.first": [0],
        "audio.rest": list(range(1, a.num_hidden_layers)),
        "audio.all": list(range(a.num_hidden_layers)),
        "audio.final_norm": list(a.final_norm_layers),
        "adaptor.all": list(range(config.adaptor.num_hidden_layers)),
        "text.all": list(range(config.text.num_hidden_layers)),
    }
    return sets[key]


def _dim(expr, config: Config) -> int:
    if isinstance(expr, int):
        return expr
    value = 1
    for factor in expr.split("*"):
        section, name = factor.split(".")
        value *= getattr(getattr(config, section), name)
    return value


def expected_tensors(config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
    """logical name -> (shape, kind) for this config, from the spec table."""
    out = {}
    for entry in spec()["tensors"]:
        shape = tuple(_dim(d, config) for d in entry["shape"])
        layers = _layer_set(entry["layers"], config) if "layers" in entry else [None]
        for i in layers:
            out[entry["name"].replace("{i}", str(i))] = (shape, entry["kind"])
    return out


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


# --- other published layouts -> logical names ---------------------------------------------------------

_SUBLAYER_FUNASR = [
    (".self_attn.linear_out.", ".self_attn.o_proj."), (".self_attn.fsmn_block.", ".self_attn.fsmn.conv."),
    (".self_attn.linear_q.", ".self_attn.q_proj."), (".self_attn.linear_k.", ".self_attn.k_proj."),
    (".self_attn.linear_v.", ".self_attn.v_proj."),
    (".feed_forward.w_1.", ".mlp.fc1."), (".feed_forward.w_2.", ".mlp.fc2."),
    (".norm1.", ".input_layernorm."), (".norm2.", ".post_attention_layernorm."),
]
_SUBLAYER_OLD_HF = [
    (".self_attn_layer_norm.", ".input_layernorm."), (".final_layer_norm.", ".post_attention_layernorm."),
    (".self_attn.out_proj.", ".self_attn.o_proj."), (".fc1.", ".mlp.fc1."), (".fc2.", ".mlp.fc2."),
]


def _replace_all(name: str, pairs) -> str:
    for old, new in pairs:
        name = name.replace(old, new)
    return name


def _audio_layer(group: str, index: int, config: Config) -> int:
    n_transcription = config.audio.num_hidden_layers - config.audio.num_timestamp_prediction_layers
    return {"first": 0, "main": index + 1, "tp": index + n_transcription}[group]


def _map_funasr(name: str, config: Config) -> str:
    last_main, last = config.audio.final_norm_layers
    if name.startswith("llm.model."):
        return "model.language_model." + name[len("llm.model."):]
    if name.startswith("llm.lm_head."):
        return "lm_head." + name[len("llm.lm_head."):]
    m = re.match(r"audio_encoder\.(encoders0|encoders|tp_encoders)\.(\d+)(\..+)$", name)
    if m:
        group = {"encoders0": "first", "encoders": "main", "tp_encoders": "tp"}[m.group(1)]
        layer = _audio_layer(group, int(m.group(2)), config)
        return f"model.audio_tower.layers.{layer}" + _replace_all(m.group(3), _SUBLAYER_FUNASR)
    m = re.match(r"audio_encoder\.(after_norm|tp_norm)\.(weight|bias)$", name)
    if m:
        layer = last_main if m.group(1) == "after_norm" else last
        return f"model.audio_tower.layers.{layer}.final_layernorm.{m.group(2)}"
    m = re.match(r"audio_adaptor\.linear([12])\.(.+)$", name)
    if m:
        return f"model.multi_modal_projector.linear_{m.group(1)}.{m.group(2)}"
    m = re.match(r"audio_adaptor\.blocks\.(\d+)(\..+)$", name)
    if m:
        return f"model.multi_modal_projector.layers.{m.group(1)}" + _replace_all(m.group(2), _SUBLAYER_FUNASR)
    return name


def _map_old_hf(name: str, config: Config) -> str:
    last_main, last = config.audio.final_norm_layers
    name = name.replace("model.audio_adaptor.", "model.multi_modal_projector.")
    name = name.replace("model.multi_modal_projector.blocks.", "model.multi_modal_projector.layers.")
    m = re.match(r"model\.audio_tower\.(stem|layers|timestamp_prediction_layers)(?:\.(\d+))?(\..+)$", name)
    if m and not (m.group(1) == "layers" and m.group(2) is None):
        group = {"stem": "first", "layers": "main", "timestamp_prediction_layers": "tp"}[m.group(1)]
        layer = _audio_layer(group, int(m.group(2) or 0), config)
        tail = _replace_all(m.group(3), _SUBLAYER_OLD_HF).replace(".fsmn.", ".self_attn.fsmn.")
        return f"model.audio_tower.layers.{layer}" + tail.replace(".self_attn.self_attn.", ".self_attn.")
    m = re.match(r"model\.audio_tower\.(layer_norm|timestamp_prediction_layer_norm)\.(weight|bias)$", name)
    if m:
        layer = last_main if m.group(1) == "layer_norm" else last
        return f"model.audio_tower.layers.{layer}.final_layernorm.{m.group(2)}"
    if name.startswith("model.multi_modal_projector.layers."):
        return _replace_all(name, _SUBLAYER_OLD_HF)
    return name


def _is_old_hf(names) -> bool:
    markers = (".stem.", ".timestamp_prediction_layers.", ".self_attn_layer_norm.", ".audio_adaptor.",
               "model.audio_tower.layer_norm.", ".multi_modal_projector.blocks.")
    return any(marker in n for n in names for marker in markers)


def _split_fused_qkv(name: str, t: StoredTensor) -> dict[str, StoredTensor]:
    """FunASR's linear_q_k_v [3D, in] (and bias [3D]) -> q_proj, k_proj, v_proj rows (views, no copy)."""
    if t.dtype not in DENSE_TYPES or t.shape[0] % 3:
        raise ModelError(f"tensor {name}: a fused q/k/v needs a float tensor with 3*D rows, found {t.dtype} "
                         f"{list(t.shape)}")
    d = t.shape[0] // 3
    out = {}
    for i, part in enumerate(("q_proj", "k_proj", "v_proj")):
        data = t.data[i * d:(i + 1) * d]
        out[name.replace("linear_q_k_v", part)] = StoredTensor(data, t.dtype, (d, *t.shape[1:]))
    return out


def to_logical(tensors: dict[str, StoredTensor], config: Config) -> dict[str, StoredTensor]:
    """Rename a checkpoint's tensors onto the logical layout; drops tensors that play no part in
    transcription."""
    names = list(tensors)
    if any(n.startswith(("audio_encoder.", "audio_adaptor.", "llm.")) for n in names):
        mapper = _map_funasr
    elif _is_old_hf(names):
        mapper = _map_old_hf
    else:
        mapper = None
    out = {}
    for name, t in tensors.items():
        if IGNORED.match(name):
            continue
        logical = mapper(name, config) if mapper else name
        if "linear_q_k_v" in logical:
            out.update(_split_fused_qkv(logical, t))
        else:
            out[logical] = t
    return out


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


def _read_json(path: Path, what: str):
    """A JSON file's value; a missing, unreadable, non-UTF-8 or malformed file is one ModelError."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{path}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as exc:  # a directory, no permission, not UTF-8
        raise ModelError(f"{path}: {what} cannot be read ({exc})") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ModelError(f"{path}: {what} is not valid JSON ({type(exc).__name__}: {exc})") from None


def load_config(path: Path) -> Config:
    raw = _read_json(path, "config.json")
    if not isinstance(raw, dict):
        raise ModelError(f"{path}: expected a JSON object, found {type(raw).__name__}")
    return config_mod.from_dict(_legacy_config(raw, str(path)), str(path))


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: cannot be read as UTF-8 text ({exc})") from None


# --- FunASR's own folder: model.pt, config.yaml and the Qwen3-0.6B/ folder --------------------------------

QWEN_FOLDER = "Qwen3-0.6B"  # config.yaml's llm_conf.init_param_path: the decoder's config and tokenizer
QWEN_FILES = tuple(n for n in TEXT_FILES if n != "config.json")  # Qwen's config.json is the decoder's alone
# config.yaml key -> typed-config field (funasr/models/sense_voice/model.py SenseVoiceEncoderSmall,
# funasr/models/llm_asr/adaptor.py Transformer, the frontend_conf of WavFrontend)
YAML_AUDIO = {"output_size": "hidden_size", "attention_heads": "num_attention_heads",
              "linear_units": "intermediate_size", "kernel_size": "fsmn_kernel_size"}
YAML_ADAPTOR = {"attention_heads": "num_attention_heads", "n_layer": "num_hidden_layers",
                "ffn_dim": "projector_hidden_size"}
YAML_FRONTEND = {"n_mels": "num_mel_bins", "lfr_m": "num_stacked_frames"}


def _layer_count(names, prefix: str) -> int:
    indices = [int(m.group(1)) for m in map(re.compile(re.escape(prefix) + r"(\d+)\.").match, names) if m]
    return max(indices) + 1 if indices else 0


def _funasr_layout(names) -> Config:
    """The encoder layer counts FunASR's names show (encoders0, encoders, tp_encoders): enough to map them."""
    main = _layer_count(names, "audio_encoder.encoders.")
    timestamp = _layer_count(names, "audio_encoder.tp_encoders.")
    return Config(audio=config_mod.AudioConfig(num_hidden_layers=1 + main + timestamp,
                                               num_timestamp_prediction_layers=timestamp))


def _read_yaml(path: Path) -> dict | None:
    """config.yaml as a mapping; None when it is absent or PyYAML (not a dependency) is not installed."""
    if not path.is_file():
        return None
    try:
        import yaml
    except ImportError:
        return None
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: config.yaml cannot be read ({exc})") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ModelError(f"{path}: config.yaml is not valid YAML ({type(exc).__name__}: {exc})") from None
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
            raise ModelError(f"{path}: {section}.{key} must be an integer, found {value!r}")
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
    rate = adaptor.pop("downsample_rate", 1)
    if rate != 1:
        raise ModelError(f"{path}: audio_adaptor_conf.downsample_rate {rate} is not supported (expected 1)")
    return audio, adaptor


def _funasr_config(folder: Path, tensors: dict[str, StoredTensor], where: str) -> Config:
    """Config from config.yaml (encoder, adaptor) and Qwen3-0.6B/config.json (decoder) where present;
    what they leave open comes from tensor shapes, and a warning lists what had to be assumed."""
    from nanoasr.formats import gguf

    shapes, assumed = gguf.config_from_shapes(tensors, None, where)
    yaml_path, qwen = folder / "config.yaml", folder / QWEN_FOLDER / "config.json"
    raw_yaml = _read_yaml(yaml_path)
    audio, adaptor = _yaml_sections(raw_yaml, yaml_path) if raw_yaml is not None else ({}, {})
    text = _read_json(qwen, "config.json") if qwen.is_file() else dataclasses.asdict(shapes.text)
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
    return {name: _read_text(qwen / name) for name in QWEN_FILES if (qwen / name).is_file()}


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
    from nanoasr.formats import torch_zip

    where = str(weights)
    raw = torch_zip.read(weights)  # CTC tensors stay readable here; to_logical drops them
    if not any(n.startswith("audio_encoder.") for n in raw):
        raise ModelError(f"{where}: no audio_encoder.* tensors; expected FunASR's Fun-ASR-Nano state dict "
                         f"(audio_encoder, audio_adaptor, llm)")
    files = _qwen_files(weights.parent)
    tensors = _drop_tied_head(to_logical(raw, _funasr_layout(raw)))
    config = _funasr_config(weights.parent, tensors, where)
    validate(tensors, config, where)
    return Checkpoint(config, tensors, files, {"path": where, "format": "model.pt"})


def _file_magic(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(4)
    except OSError as exc:
        raise ModelError(f"{path}: cannot be read ({exc})") from None


def _load_file(path: Path) -> Checkpoint:
    """A GGUF or a torch.save archive, told apart by their first bytes (a .gguf name goes to the GGUF reader,
    which names what is wrong with it)."""
    magic = _file_magic(path)
    if magic == b"GGUF" or path.suffix.lower() == ".gguf":
        from nanoasr.formats import gguf

        return gguf.read(path)
    if magic == b"PK\x03\x04":  # a zip: torch.save's format
        return load_funasr(path)
    raise ModelError(f"{path}: expected a GGUF file or a torch.save archive (model.pt), "
                     f"found a file starting with {magic!r}")


def load_checkpoint(path: str | Path) -> Checkpoint:
    """A safetensors checkpoint directory, a .gguf file, or FunASR's model.pt (the file, or a directory that
    holds it) -> validated Checkpoint (weights memory-mapped)."""
    path = Path(path)
    if path.is_file():
        return _load_file(path)
    if not path.exists():
        raise ModelError(f"{path}: no such model directory, .gguf or model.pt file")
    if not path.is_dir():
        raise ModelError(f"{path}: expected a checkpoint directory, a .gguf file or a model.pt file")
    safetensors_files = ("model.safetensors", "model.safetensors.index.json")
    if (path / "model.pt").is_file() and not any((path / n).exists() for n in safetensors_files):
        return load_funasr(path / "model.pt")
    config = load_config(path / "config.json")
    files = {name: _read_text(path / name) for name in TEXT_FILES if (path / name).is_file()}
    if "tokenizer.json" not in files:
        raise ModelError(f"{path}: tokenizer.json is missing (the checkpoint's tokenizer is required)")
    tensors = to_logical(safetensors.read_checkpoint_dir(path), config)
    validate(tensors, config, str(path))
    return Checkpoint(config, tensors, files, {"path": str(path), "format": "safetensors"})
