"""The form's text fields -> what the request asks for. api.Options is the one validator of the library's
options (language, prompt, hotwords, itn); the fields only the server has are checked here."""

from dataclasses import dataclass

from nanoasr.errors import OptionError
from nanoasr.server.errors import ApiError, refused_field

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "")


@dataclass(frozen=True)
class RequestOptions:
    response_format: str
    stream: bool
    transcribe: dict  # keyword arguments of Model.transcribe
    granularities: tuple[str, ...] = ()  # timestamp_granularities asked for (verbose_json)


def request_options(fields: dict) -> RequestOptions:
    """What the form's text fields ask for; raises ApiError(400) naming the field."""
    if last(fields, "model") is None:
        raise ApiError(400, "the 'model' field is required (any name; this server has one model)",
                       param="model")
    response_format = response_format_field(fields)
    check_temperature(fields)
    granularities = granularity_fields(fields, response_format)
    options = library_options(language=last(fields, "language"),
                              context=last(fields, "prompt", "").strip() or None,
                              hotwords=hotword_list(fields), itn=flag(fields, "itn", True))
    # Options has checked the language, so this only turns a name into its code
    transcribe = dict(options.prompt_options(), language=options.language_code)
    if "word" in granularities:
        transcribe["word_timestamps"] = True
    return RequestOptions(response_format, flag(fields, "stream", False), transcribe, granularities)


def last(fields: dict, name: str, default=None):
    values = fields.get(name)
    return values[-1] if values else default


def flag(fields: dict, name: str, default: bool) -> bool:
    value = last(fields, name)
    if value is None:
        return default
    if value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    raise ApiError(400, f"{name} must be true or false; got {value!r}", param=name)


def response_format_field(fields: dict) -> str:
    response_format = last(fields, "response_format", "json").strip() or "json"
    if response_format not in RESPONSE_FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(RESPONSE_FORMATS)}; "
                            f"got {response_format!r}", param="response_format")
    return response_format


def check_temperature(fields: dict) -> None:
    try:
        temperature = float(last(fields, "temperature", "0") or "0")
    except ValueError:
        raise ApiError(400, f"temperature must be a number; got {last(fields, 'temperature')!r}",
                       param="temperature") from None
    if temperature != 0:
        raise ApiError(400, f"only temperature 0 is supported (greedy decoding); got {temperature}",
                       param="temperature")


def granularity_fields(fields: dict, response_format: str) -> tuple[str, ...]:
    """'word' and/or 'segment'; words need verbose_json, as in OpenAI's API (the model must have the CTC
    branch: Model.transcribe says so otherwise)."""
    values = fields.get("timestamp_granularities[]", []) + fields.get("timestamp_granularities", [])
    for value in values:
        if value not in ("word", "segment"):
            raise ApiError(400, f"timestamp_granularities must be 'word' or 'segment'; got {value!r}",
                           param="timestamp_granularities")
    if "word" in values and response_format != "verbose_json":
        raise ApiError(400, f"timestamp_granularities 'word' needs response_format verbose_json; got "
                            f"{response_format!r}", param="timestamp_granularities")
    return tuple(dict.fromkeys(values))


def hotword_list(fields: dict) -> tuple[str, ...]:
    """The words of every `hotwords` field, comma or newline separated."""
    words = (w.strip() for value in fields.get("hotwords", []) for w in value.replace("\n", ",").split(","))
    return tuple(w for w in words if w)


def library_options(**options):
    """api.Options from the fields' values, checked before the upload is decoded; ApiError(400) naming the
    form field it refuses."""
    from nanoasr.api import Options

    try:
        return Options(**options)
    except OptionError as exc:
        raise refused_field(exc) from None
