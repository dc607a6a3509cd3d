"""Typed model config: config.json (nested or legacy flat) or GGUF metadata -> frozen dataclasses.

Defaults are the real Fun-ASR-Nano-2512 values; everything a checkpoint states overrides them, and
rope_theta must be stated (the Transformers default, 1e4, and Qwen3-0.6B's, 1e6, differ).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from nanoasr.errors import ModelError
from nanoasr.untrusted import short

ACTIVATIONS = ("relu",)  # the audio encoder and adaptor
TEXT_ACTIVATIONS = ("silu",)  # SwiGLU in the Qwen3 decoder


@dataclass(frozen=True)
class AudioConfig:
    """SAN-M encoder."""

    num_mel_bins: int = 80
    num_stacked_frames: int = 7  # LFR m
    hidden_size: int = 512
    num_attention_heads: int = 4
    intermediate_size: int = 2048
    num_hidden_layers: int = 70  # 50 transcription layers + the timestamp layers, all run
    num_timestamp_prediction_layers: int = 20
    fsmn_kernel_size: int = 11
    layer_norm_eps: float = 1e-5
    hidden_act: str = "relu"
    max_position_embeddings: int = 2049

    @property
    def input_size(self) -> int:
        return self.num_mel_bins * self.num_stacked_frames

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def final_norm_layers(self) -> tuple[int, int]:
        """Layers that end with an extra LayerNorm: the last transcription layer and the last layer."""
        n_transcription = self.num_hidden_layers - self.num_timestamp_prediction_layers
        return n_transcription - 1, self.num_hidden_layers - 1


@dataclass(frozen=True)
class AdaptorConfig:
    """Projector (linear, act, linear) and the bidirectional adaptor blocks."""

    hidden_size: int = 1024
    num_attention_heads: int = 8
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    projector_hidden_size: int = 2048
    layer_norm_eps: float = 1e-5  # as configured; the funasr profile runs 1e-12 (DESIGN §2)
    hidden_act: str = "relu"
    projector_hidden_act: str = "relu"
    # FunASR gives the decoder only fake_token_len(T) audio rows when true, all T when false (its
    # audio_adaptor_conf default); Fun-ASR-Nano sets it, Fun-ASR-MLT-Nano's config.yaml does not
    use_low_frame_rate: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class TextConfig:
    """Qwen3 decoder (Qwen3-0.6B). Shapes: V vocab_size, H hidden_size, F intermediate_size, Hq
    num_attention_heads, Hkv num_key_value_heads, D head_dim; the embeddings are [V, H], q_proj [Hq * D, H],
    k_proj and v_proj [Hkv * D, H], o_proj [H, Hq * D], gate_proj and up_proj [F, H], down_proj [H, F]."""

    vocab_size: int = 151936  # V: token ids, the rows of the embeddings and of the LM head
    hidden_size: int = 1024  # H: the residual stream's width
    intermediate_size: int = 3072  # F: the SwiGLU feed-forward's width
    num_hidden_layers: int = 28
    num_attention_heads: int = 16  # Hq: query heads
    num_key_value_heads: int = 8  # Hkv: key/value heads, each shared by Hq / Hkv query heads (GQA)
    head_dim: int = 128  # D: per head, not H / Hq (Qwen3 states it: 16 * 128 = 2048 > 1024)
    rms_norm_eps: float = 1e-6  # the RMSNorms' epsilon, q_norm and k_norm (per head) included
    rope_theta: float = 1e6  # RoPE base; a checkpoint must state it (module docstring)
    max_position_embeddings: int = 40960  # as configured; prompts and token budgets stay far below it
    hidden_act: str = "silu"  # SwiGLU's gate activation (TEXT_ACTIVATIONS)
    tie_word_embeddings: bool = True  # the LM head is the embeddings (checked: Fun-ASR-Nano ties them)


@dataclass(frozen=True)
class Config:
    audio: AudioConfig = AudioConfig()
    adaptor: AdaptorConfig = AdaptorConfig()
    text: TextConfig = TextConfig()
    audio_token_id: int = 151646

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SECTIONS = (("audio", AudioConfig), ("adaptor", AdaptorConfig), ("text", TextConfig))  # Config's parts


def _number(value, where: str, key: str) -> float:
    """A JSON/GGUF number as float; bools and non-numbers are errors, huge integers become inf."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelError(f"{where}: {key} must be a number, found {short(value)}")
    try:
        return float(value)
    except OverflowError:
        return math.inf  # rejected by check() as not finite


def _pick(cls, raw: dict, where: str, **renamed):
    """The dataclass fields present in `raw` (unknown keys are ignored; wrong types are errors)."""
    values = {}
    for f in dataclasses.fields(cls):
        key = renamed.get(f.name, f.name)
        if key in raw and raw[key] is not None:
            value = raw[key]
            expected = type(f.default)
            if expected is float:
                value = _number(value, where, key)
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise ModelError(f"{where}: {key} must be {expected.__name__}, found {short(value)}")
            values[f.name] = value
    return cls(**values)


def _rope_theta(text: dict, where: str) -> float:
    key = "rope_parameters" if text.get("rope_parameters") else "rope_scaling"
    params = text.get(key) or {}
    if not isinstance(params, dict):
        raise ModelError(f"{where}: text_config.{key} must be an object, found {short(params)}")
    theta = text.get("rope_theta")
    if theta is None:  # absent or null at the top of text_config: the rope_parameters spelling
        theta = params.get("rope_theta")
    if theta is None:
        raise ModelError(f"{where}: text_config has neither rope_theta nor rope_parameters.rope_theta")
    if params.get("rope_type", "default") != "default":
        raise ModelError(f"{where}: rope_type {short(params['rope_type'])} is not supported "
                         f"(expected 'default')")
    return _number(theta, where, "text_config.rope_theta")


def _section(raw: dict, key: str, where: str) -> dict:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ModelError(f"{where}: {key} must be an object, found {type(value).__name__}")
    return value


# Adaptor fields as older checkpoints spelled them at the top level of config.json.
LEGACY_ADAPTOR_KEYS = {
    "hidden_size": "adaptor_hidden_size",
    "num_attention_heads": "adaptor_num_attention_heads",
    "intermediate_size": "adaptor_intermediate_size",
    "num_hidden_layers": "adaptor_num_hidden_layers",
    "projector_hidden_size": "projector_hidden_size",
    "layer_norm_eps": "adaptor_layer_norm_eps",
    "hidden_act": "adaptor_hidden_act",
    "projector_hidden_act": "projector_hidden_act",
}


def from_dict(raw: dict, where: str = "config.json") -> Config:
    """Build and check a Config from a parsed config.json."""
    if not isinstance(raw, dict):
        raise ModelError(f"{where}: expected a JSON object, found {type(raw).__name__}")
    text_raw = raw.get("text_config")
    if not isinstance(text_raw, dict):
        raise ModelError(f"{where}: text_config is missing; this does not look like a Fun-ASR-Nano config")
    audio = _pick(AudioConfig, _section(raw, "audio_config", where), f"{where} audio_config")
    if raw.get("adaptor_config") is not None:
        adaptor = _pick(AdaptorConfig, _section(raw, "adaptor_config", where), f"{where} adaptor_config")
    else:
        adaptor = _pick(AdaptorConfig, raw, f"{where} (flat adaptor fields)", **LEGACY_ADAPTOR_KEYS)
    text = _pick(TextConfig, text_raw, f"{where} text_config")
    text = dataclasses.replace(text, rope_theta=_rope_theta(text_raw, where))
    tie = raw.get("tie_word_embeddings", text_raw.get("tie_word_embeddings", True))
    if not isinstance(tie, bool):
        raise ModelError(f"{where}: tie_word_embeddings must be true or false, found {short(tie)}")
    text = dataclasses.replace(text, tie_word_embeddings=tie)
    config = Config(audio, adaptor, text, raw.get("audio_token_id", Config.audio_token_id))
    check(config, where)
    return config


def check(config: Config, where: str) -> None:
    """Reject configs the engine cannot run, with the field, the expected and the found value."""
    wrong_kind = next(_range_errors(config), None)
    if wrong_kind:
        raise ModelError(f"{where}: {wrong_kind}")
    a, p, t = config.audio, config.adaptor, config.text
    rules = [
        (a.hidden_act in ACTIVATIONS,
         f"audio_config.hidden_act must be one of {ACTIVATIONS}, found {short(a.hidden_act)}"),
        (p.hidden_act in ACTIVATIONS,
         f"adaptor_config.hidden_act must be one of {ACTIVATIONS}, found {short(p.hidden_act)}"),
        (p.projector_hidden_act in ACTIVATIONS,
         f"adaptor_config.projector_hidden_act must be one of {ACTIVATIONS}, "
         f"found {short(p.projector_hidden_act)}"),
        (t.hidden_act in TEXT_ACTIVATIONS,
         f"text_config.hidden_act must be 'silu', found {short(t.hidden_act)}"),
        (t.tie_word_embeddings,
         "tie_word_embeddings must be true (Fun-ASR-Nano ties the LM head to the embeddings)"),
        (a.hidden_size % a.num_attention_heads == 0,
         f"audio hidden_size {a.hidden_size} is not divisible by {a.num_attention_heads} heads"),
        (p.hidden_size % p.num_attention_heads == 0,
         f"adaptor hidden_size {p.hidden_size} is not divisible by {p.num_attention_heads} heads"),
        (p.hidden_size == t.hidden_size,
         f"adaptor hidden_size ({p.hidden_size}) must equal text hidden_size ({t.hidden_size})"),
        (t.num_attention_heads % t.num_key_value_heads == 0,
         f"text num_attention_heads {t.num_attention_heads} is not a multiple of "
         f"num_key_value_heads {t.num_key_value_heads}"),
        (t.head_dim % 2 == 0, f"text head_dim must be even for RoPE, found {t.head_dim}"),
        (a.input_size % 2 == 0, f"audio input size must be even, found {a.input_size}"),
        (a.fsmn_kernel_size % 2 == 1, f"fsmn_kernel_size must be odd, found {a.fsmn_kernel_size}"),
        (0 < a.num_timestamp_prediction_layers < a.num_hidden_layers,
         f"num_timestamp_prediction_layers ({a.num_timestamp_prediction_layers}) must be between 1 and "
         f"num_hidden_layers - 1 ({a.num_hidden_layers - 1})"),
        (0 <= config.audio_token_id < t.vocab_size,
         f"audio_token_id {config.audio_token_id} is outside the vocabulary (size {t.vocab_size})"),
    ]
    for ok, message in rules:
        if not ok:
            raise ModelError(f"{where}: {message}")


def _range_errors(config: Config):
    """Sizes must be positive integers and eps/theta positive finite numbers (before a rule divides)."""
    for section, values in (("audio_config", config.audio), ("adaptor_config", config.adaptor),
                            ("text_config", config.text)):
        for f in dataclasses.fields(values):
            value = getattr(values, f.name)
            expected = type(f.default)
            if expected is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                yield f"{section}.{f.name} must be a positive integer, found {short(value)}"
            if expected is float and (not isinstance(value, float) or not math.isfinite(value) or value <= 0):
                yield f"{section}.{f.name} must be a positive finite number, found {short(value)}"
    if isinstance(config.audio_token_id, bool) or not isinstance(config.audio_token_id, int):
        yield f"audio_token_id must be an integer token id, found {short(config.audio_token_id)}"
