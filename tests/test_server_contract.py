"""HTTP contract of the server with a stand-in model: status codes, envelopes, limits, queue, auth."""
import io
import threading
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("fastapi")

from nanoasr.errors import AudioError  # noqa: E402
from nanoasr.server import create_app  # noqa: E402
from nanoasr.transcript import Segment, Transcript  # noqa: E402
from tests.serverutil import running  # noqa: E402


class StandInModel:
    """Decodes the upload like the real one would reject it, and echoes a fixed transcript."""

    def __init__(self, delay=0.0):
        self.delay = delay
        self.calls = 0

    def transcribe(self, audio, on_segment=None, **kwargs):
        with open(audio, "rb") as f:  # the server hands over the upload as a path
            data = f.read()
        self.kwargs = kwargs
        if not data.startswith(b"RIFF"):
            raise AudioError("<upload>: not audio (cannot be decoded)")
        self.calls += 1
        time.sleep(self.delay)
        segments = (Segment(0.0, 1.5, "hello there", "stop", (1, 2)),
                    Segment(1.5, 3.0, "general", "stop", (3,)))
        for s in segments:
            if on_segment:
                on_segment(s)
        return Transcript("hello there general", segments, kwargs.get("language"), 3.0, {})


def wav_bytes(seconds=0.5):
    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(16000 * seconds), np.float32), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def post(url, data=None, files=None, headers=None):
    files = files if files is not None else {"file": ("a.wav", wav_bytes(), "audio/wav")}
    return httpx.post(url + "/v1/audio/transcriptions", data={"model": "fun-asr-nano", **(data or {})},
                      files=files, headers=headers, timeout=30)


def assert_envelope(response, status, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param


@pytest.fixture(scope="module")
def url():
    with running(create_app(StandInModel(), max_upload_mb=1)) as base:
        yield base


def test_json_and_plain_formats(url):
    assert post(url).json() == {"text": "hello there general"}
    text = post(url, {"response_format": "text"})
    assert text.headers["content-type"].startswith("text/plain") and text.text == "hello there general"
    vtt = post(url, {"response_format": "vtt"})
    assert vtt.headers["content-type"].startswith("text/vtt") and vtt.text.startswith("WEBVTT")
    srt = post(url, {"response_format": "srt"})
    assert srt.text.startswith("1\n00:00:00,000 --> 00:00:01,500")


def test_verbose_json_has_duration_language_and_segments(url):
    body = post(url, {"response_format": "verbose_json", "language": "en"}).json()
    assert body["duration"] == 3.0 and body["language"] == "english"
    assert [(s["start"], s["end"], s["text"]) for s in body["segments"]] == [(0.0, 1.5, "hello there"),
                                                                             (1.5, 3.0, "general")]
    assert body["usage"] == {"type": "duration", "seconds": 3.0}


def test_stream_sends_deltas_then_done(url):
    with httpx.stream("POST", url + "/v1/audio/transcriptions", data={"model": "m", "stream": "true"},
                      files={"file": ("a.wav", wav_bytes(), "audio/wav")}, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[0] == 'data: {"type": "transcript.text.delta", "delta": "hello there"}'
    assert events[-1] == 'data: {"type": "transcript.text.done", "text": "hello there general"}'


@pytest.mark.parametrize("data, param", [
    ({"temperature": "0.7"}, "temperature"),
    ({"timestamp_granularities[]": "word"}, "timestamp_granularities"),
    ({"response_format": "xml"}, "response_format"),
    ({"language": "klingon"}, "language"),
])
def test_bad_fields_are_400(url, data, param):
    assert_envelope(post(url, data), 400, param)


def test_undecodable_empty_and_missing_file_are_400(url):
    assert_envelope(post(url, files={"file": ("a.wav", b"not audio at all", "audio/wav")}), 400, "file")
    assert_envelope(post(url, files={"file": ("a.wav", b"", "audio/wav")}), 400, "file")
    response = httpx.post(url + "/v1/audio/transcriptions", data={"model": "m"}, timeout=30)
    assert_envelope(response, 400, "file")


def test_upload_over_the_limit_is_413(url):
    big = b"RIFF" + bytes(2 * 1024 * 1024)
    assert_envelope(post(url, files={"file": ("a.wav", big, "audio/wav")}), 413, "file")


def test_chunked_upload_over_the_limit_is_413(url):
    boundary = "b0undary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--{boundary}\r\n"
            'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n').encode()

    def body():  # no Content-Length: the limit is found while streaming
        yield head
        for _ in range(40):
            yield bytes(64 * 1024)
        yield f"\r\n--{boundary}--\r\n".encode()

    response = httpx.post(url + "/v1/audio/transcriptions", content=body(), timeout=30,
                          headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert_envelope(response, 413, "file")


@pytest.mark.parametrize("content, content_type", [
    (b'{"model": "m"}', "application/json"),
    (b"--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm", "multipart/form-data; boundary=x"),
    (b"garbage", "multipart/form-data"),
])
def test_malformed_bodies_are_400(url, content, content_type):
    response = httpx.post(url + "/v1/audio/transcriptions", content=content, timeout=30,
                          headers={"Content-Type": content_type})
    assert_envelope(response, 400)


@pytest.mark.parametrize("data, param", [
    ({"stream": "maybe"}, "stream"),
    ({"itn": "2"}, "itn"),
    ({"temperature": "warm"}, "temperature"),
    ({"timestamp_granularities[]": "char"}, "timestamp_granularities"),
    ({"prompt": "x" * 5000}, "prompt"),
    ({"prompt": "x" * 70000}, "prompt"),
])
def test_more_bad_fields_are_400(url, data, param):
    assert_envelope(post(url, data), 400, param)


def test_missing_model_and_two_files_are_400(url):
    response = httpx.post(url + "/v1/audio/transcriptions",
                          files={"file": ("a.wav", wav_bytes(), "audio/wav")})
    assert_envelope(response, 400, "model")
    two = [("file", ("a.wav", wav_bytes(), "audio/wav")), ("file", ("b.wav", wav_bytes(), "audio/wav"))]
    assert_envelope(post(url, files=two), 400, "file")


def test_unknown_route_and_method_use_the_envelope(url):
    assert_envelope(httpx.get(url + "/v1/nothing"), 404)
    assert_envelope(httpx.get(url + "/v1/audio/transcriptions"), 405)


def test_prompt_hotwords_and_segment_granularity_reach_the_model():
    model = StandInModel()
    with running(create_app(model)) as base:
        response = post(base, {"prompt": " a meeting ", "hotwords": "alpha, beta\ngamma", "itn": "false",
                               "language": "English", "timestamp_granularities[]": "segment"})
    assert response.status_code == 200, response.text
    assert model.kwargs == {"language": "en", "context": "a meeting", "hotwords": ("alpha", "beta", "gamma"),
                            "itn": False}


def test_models_and_health(url):
    assert httpx.get(url + "/health").json()["status"] == "ok"
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "fun-asr-nano"


def test_api_key():
    with running(create_app(StandInModel(), api_key="sekret")) as base:
        assert_envelope(post(base), 401)
        assert_envelope(post(base, headers={"Authorization": "Bearer wrong"}), 401)
        assert post(base, headers={"Authorization": "Bearer sekret"}).status_code == 200
        assert httpx.get(base + "/health").status_code == 200


def test_full_queue_is_503_with_retry_after():
    model = StandInModel(delay=0.5)
    with running(create_app(model, max_queue=1)) as base:
        results = []
        first = threading.Thread(target=lambda: results.append(post(base)))
        first.start()
        time.sleep(0.2)
        busy = post(base)
        first.join()
        assert results[0].status_code == 200
        assert_envelope(busy, 503)
        assert busy.headers["retry-after"]


def test_uploads_are_removed_after_a_disconnect_and_after_an_abandoned_stream(tmp_path):
    import socket

    model = StandInModel(delay=0.3)
    with running(create_app(model, upload_dir=str(tmp_path))) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as s:
            head = (b'--xx\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
                    + bytes(500_000))
            s.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n"
                      b"Content-Type: multipart/form-data; boundary=xx\r\n\r\n" + head)
            deadline = time.monotonic() + 10
            while not list(tmp_path.iterdir()) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert [p.suffix for p in tmp_path.iterdir()] == [".wav"]  # written while it arrives
        with httpx.stream("POST", base + "/v1/audio/transcriptions", data={"model": "m", "stream": "true"},
                          files={"file": ("a.wav", wav_bytes(), "audio/wav")}, timeout=30) as response:
            assert response.status_code == 200  # closed without reading a single event
        deadline = time.monotonic() + 10
        while httpx.get(base + "/health").json()["served"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(base + "/health").json() == {"status": "ok", "queued": 0, "served": 1}
        assert list(tmp_path.iterdir()) == []
