"""The exceptions nanoasr raises at its edges; each message says what, what was expected, what was found."""


class NanoasrError(Exception):
    """Base class of every error nanoasr raises on purpose."""


class AudioError(NanoasrError, ValueError):
    """The audio given cannot be read or is not usable speech input."""


class ModelError(NanoasrError):
    """A checkpoint, GGUF file or model package is missing, malformed or unsupported."""


class OptionError(NanoasrError, ValueError):
    """A transcription or command option has a value nanoasr does not accept; `field` names the option."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class AudioTooLongError(AudioError):
    """The audio is longer than the duration limit the caller set (`max_duration_s`)."""
