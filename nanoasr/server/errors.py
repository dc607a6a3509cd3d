"""OpenAI's error envelope, and which side of an error is at fault: bad input is always a 4xx (the official
client retries 5xx)."""

from nanoasr.errors import AudioError, AudioTooLongError, NanoasrError, OptionError

FORM_FIELDS = {"language": "language", "context": "prompt", "hotwords": "hotwords", "itn": "itn",
               "word_timestamps": "timestamp_granularities"}  # the form field of each library option


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param=None, code=None,
                 headers=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def api_error(exc: NanoasrError, message: str) -> ApiError:
    """Bad audio and options are the client's (4xx); anything else is the server's fault (500)."""
    if isinstance(exc, AudioTooLongError):
        return ApiError(413, f"the uploaded audio is too long: {message}", param="file",
                        code="audio_too_long")
    if isinstance(exc, AudioError):
        return ApiError(400, f"could not decode the uploaded audio: {message}", param="file")
    if isinstance(exc, OptionError):
        return refused_field(exc, message)
    return ApiError(500, message, "server_error")


def refused_field(exc: OptionError, message: str | None = None) -> ApiError:
    """A 400 whose `param` is the form field of the option the error names."""
    return ApiError(400, str(exc) if message is None else message, param=FORM_FIELDS.get(exc.field))


def internal_error(exc: BaseException) -> ApiError:
    """An unexpected failure, named by its type only: its message may hold paths or data."""
    return ApiError(500, f"internal error: {type(exc).__name__}", "server_error")
