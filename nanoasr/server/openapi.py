"""The transcription route's request and responses in the OpenAPI schema: FastAPI cannot infer them, as the
route reads its multipart body itself."""

from nanoasr.api import MAX_CONTEXT_CHARS
from nanoasr.server.fields import RESPONSE_FORMATS

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
OPENAPI_REQUEST = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "model"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "the audio file"},
        "model": {"type": "string", "description": "any name; the server has one model"},
        "language": {"type": "string",
                     "description": "ISO code, English or Chinese name (zh, en, ja; MLT-Nano: 31) or auto"},
        "prompt": {"type": "string", "maxLength": MAX_CONTEXT_CHARS,  # the library's context
                   "description": "context text for the model"},
        "response_format": {"type": "string", "enum": list(RESPONSE_FORMATS), "default": "json"},
        "temperature": {"type": "number", "default": 0, "description": "0 only (greedy decoding)"},
        "timestamp_granularities[]": {
            "type": "array", "items": {"type": "string", "enum": ["segment", "word"]},
            "description": "word: with verbose_json, for a model with FunASR's CTC branch"},
        "stream": {"type": "boolean", "default": False},
        "hotwords": {"type": "string", "description": "words to favour, comma or newline separated"},
        "itn": {"type": "boolean", "default": True, "description": "inverse text normalisation"},
    }}}}}}
OPENAPI_RESPONSES = {
    200: {"description": "the transcript in the requested format", "content": {
        "application/json": {}, "text/plain": {}, "application/x-subrip": {}, "text/vtt": {},
        "text/event-stream": {}}},
    **{status: {"description": what, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
       for status, what in ((400, "bad audio or fields"), (401, "missing or wrong API key"),
                            (408, "an upload too slow: no data for the read timeout, slower than the minimum "
                                  "rate, or past the upload timeout"),
                            (413, "upload or audio duration over the limit"),
                            (503, "queue or upload slots full; see Retry-After"))},
}
