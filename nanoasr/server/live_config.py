"""A realtime transcription session's settings: read from OpenAI's GA `session.update` (`session.type =
"transcription"`, settings under `audio.input`) or the beta `transcription_session.update` (flat fields), and
shown back in either shape. Only the fields present change; `turn_detection: null` turns server VAD off.

Mapping to nanoasr: `transcription.language` -> language, `prompt` -> context, `keywords` -> hotwords;
`model` is shown back as given (this server has one model); `noise_reduction` is accepted and not applied.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from nanoasr.api import Options
from nanoasr.errors import OptionError
from nanoasr.realtime import TurnDetection
from nanoasr.server.live_audio import BETA_FORMATS, FORMATS

GA_INPUT = "session.audio.input"
OPENAI_RATE = 24000  # the only audio/pcm rate OpenAI accepts


class ClientError(Exception):
    """A client event nanoasr refuses: an `invalid_request_error` naming the field (`param`)."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


@dataclass(frozen=True)
class SessionConfig:
    format: str = "audio/pcm"
    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    keywords: tuple[str, ...] = ()
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)

    def options(self, model) -> Options:
        """nanoasr's options for these settings, checked against the loaded model."""
        options = Options(language=self.language, context=self.prompt, hotwords=self.keywords)
        model.check_options(options.language)
        return options

    def ga(self, session_id: str) -> dict:
        fmt = {"type": self.format}
        if self.format == "audio/pcm":
            fmt["rate"] = OPENAI_RATE
        transcription = {"model": self.model, "language": self.language, "prompt": self.prompt,
                         "keywords": list(self.keywords) or None}
        return {"type": "transcription", "id": session_id, "object": "realtime.transcription_session",
                "audio": {"input": {"format": fmt, "transcription": transcription, "noise_reduction": None,
                                    "turn_detection": _vad_view(self.turn_detection)}},
                "include": None}

    def beta(self, session_id: str) -> dict:
        beta_format = {v: k for k, v in BETA_FORMATS.items()}[self.format]
        return {"id": session_id, "object": "realtime.transcription_session",
                "client_secret": {"value": "", "expires_at": 0},  # no ephemeral keys here
                "input_audio_format": beta_format, "modalities": ["text"],
                "input_audio_transcription": {"model": self.model, "language": self.language,
                                              "prompt": self.prompt},
                "turn_detection": _vad_view(self.turn_detection)}


def _vad_view(vad: TurnDetection | None):
    if vad is None:
        return None
    return {"type": "server_vad", "threshold": vad.threshold, "prefix_padding_ms": vad.prefix_padding_ms,
            "silence_duration_ms": vad.silence_duration_ms}


def _object(value, param: str) -> dict:
    if not isinstance(value, dict):
        raise ClientError(f"{param} must be an object; got {type(value).__name__}", param)
    return value


def updated_ga(config: SessionConfig, session) -> SessionConfig:
    """`config` with a GA session.update's `session` applied."""
    session = _object(session, "session")
    if session.get("type") != "transcription":
        raise ClientError("this server runs transcription sessions only: session.type must be "
                          f"'transcription'; got {session.get('type')!r}", "session.type")
    audio_input = _object(_object(session.get("audio", {}), "session.audio").get("input", {}), GA_INPUT)
    changes = {}
    if "format" in audio_input:
        changes["format"] = _ga_format(audio_input["format"])
    if audio_input.get("transcription") is not None:
        changes.update(_transcription(audio_input["transcription"], f"{GA_INPUT}.transcription"))
    if "turn_detection" in audio_input:
        changes["turn_detection"] = _turn_detection(audio_input["turn_detection"],
                                                    f"{GA_INPUT}.turn_detection")
    return dataclasses.replace(config, **changes)


def updated_beta(config: SessionConfig, session) -> SessionConfig:
    """`config` with a beta transcription_session.update's flat `session` applied."""
    session = _object(session, "session")
    changes = {}
    if "input_audio_format" in session:
        name = session["input_audio_format"]
        if name not in BETA_FORMATS:
            raise ClientError(f"input_audio_format must be one of {', '.join(BETA_FORMATS)}; got {name!r}",
                              "session.input_audio_format")
        changes["format"] = BETA_FORMATS[name]
    if session.get("input_audio_transcription") is not None:
        changes.update(_transcription(session["input_audio_transcription"],
                                      "session.input_audio_transcription"))
    if "turn_detection" in session:
        changes["turn_detection"] = _turn_detection(session["turn_detection"], "session.turn_detection")
    return dataclasses.replace(config, **changes)


def _ga_format(value) -> str:
    value = _object(value, f"{GA_INPUT}.format")
    kind = value.get("type", "audio/pcm")
    if kind not in FORMATS:
        raise ClientError(f"audio format type must be one of {', '.join(FORMATS)}; got {kind!r}",
                          f"{GA_INPUT}.format.type")
    if kind == "audio/pcm" and value.get("rate", OPENAI_RATE) != OPENAI_RATE:
        raise ClientError(f"only a 24kHz sample rate is supported for audio/pcm; got {value.get('rate')!r}",
                          f"{GA_INPUT}.format.rate")
    return kind


def _transcription(value, param: str) -> dict:
    value = _object(value, param)
    changes = {}
    for name in ("model", "language", "prompt"):
        if name in value:
            if value[name] is not None and not isinstance(value[name], str):
                raise ClientError(f"{param}.{name} must be a string; got {type(value[name]).__name__}",
                                  f"{param}.{name}")
            changes[name] = value[name] or None
    if "keywords" in value:
        words = value["keywords"] or []
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ClientError(f"{param}.keywords must be a list of strings", f"{param}.keywords")
        changes["keywords"] = tuple(words)
    return changes


def _turn_detection(value, param: str) -> TurnDetection | None:
    if value is None:
        return None
    value = _object(value, param)
    if value.get("type", "server_vad") != "server_vad":
        raise ClientError(f"turn_detection.type must be 'server_vad' (or turn_detection null); got "
                          f"{value.get('type')!r}", f"{param}.type")
    defaults = TurnDetection()
    try:
        return TurnDetection(threshold=value.get("threshold", defaults.threshold),
                             prefix_padding_ms=value.get("prefix_padding_ms", defaults.prefix_padding_ms),
                             silence_duration_ms=value.get("silence_duration_ms"))
    except OptionError as exc:
        raise ClientError(str(exc), f"{param}.{exc.field}") from None
