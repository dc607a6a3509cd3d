"""HTTP contract of the server with a stand-in model: status codes, envelopes, limits, queue, auth."""
import io
import os
import threading
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("fastapi")

from nanoasr.audio.io import DecodedAudio  # noqa: E402
from nanoasr.errors import AudioError, AudioTooLongError, ModelError, OptionError  # noqa: E402
from nanoasr.server import create_app  # noqa: E402
from nanoasr.transcript import Segment, Transcript  # noqa: E402
from tests.serverutil import (closed_by_server, response_head, running, stalled_upload,  # noqa: E402
                              upload_files, wait_until)


class StandInModel:
    """Takes the samples the server decoded and echoes a fixed transcript."""

    def __init__(self, delay=0.0):
        self.delay = delay
        self.calls = 0

    def check_options(self, language=None, word_timestamps=False):
        """Accepts every language and word timestamps."""

    def transcribe(self, audio, on_segment=None, **kwargs):
        assert isinstance(audio, DecodedAudio)  # decoded once, by the server, and handed over as it is
        self.kwargs = kwargs
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
    return error


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


def test_a_refused_option_is_answered_for_its_own_field(url):
    # two bad fields: the answer names the one Options refused (OptionError.field), with that field's message
    hotwords = ",".join(f"w{i}" for i in range(101))
    error = assert_envelope(post(url, {"language": "klingon", "hotwords": hotwords}), 400, "hotwords")
    assert "101" in error["message"]
    error = assert_envelope(post(url, {"language": "klingon"}), 400, "language")
    assert "klingon" in error["message"]


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
            wait_until(lambda: upload_files(tmp_path), what="the upload file exists")
            assert [p.suffix for p in upload_files(tmp_path)] == [".wav"]  # written while it arrives
        with httpx.stream("POST", base + "/v1/audio/transcriptions", data={"model": "m", "stream": "true"},
                          files={"file": ("a.wav", wav_bytes(), "audio/wav")}, timeout=30) as response:
            assert response.status_code == 200  # closed without reading a single event
        deadline = time.monotonic() + 10
        while httpx.get(base + "/health").json()["served"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        health = {"status": "ok", "uploading": 0, "queued": 0, "served": 1}
        assert httpx.get(base + "/health").json() == health
        assert upload_files(tmp_path) == []
    assert list(tmp_path.iterdir()) == []


# --- hostile clients ------------------------------------------------------------------------------


def test_stalled_upload_gets_408_and_its_file_is_removed(tmp_path):
    with running(create_app(StandInModel(), read_timeout_s=0.5, upload_dir=str(tmp_path))) as base:
        with stalled_upload(base) as sock:
            wait_until(lambda: len(upload_files(tmp_path)) == 1, what="the stalled upload's file exists")
            start = time.monotonic()
            status, head = response_head(sock, 10)
            assert status == 408 and b"connection: close" in head
            assert time.monotonic() - start < 5
            assert upload_files(tmp_path) == []  # removed before the answer went out
            assert closed_by_server(sock, 5)
        assert httpx.get(base + "/health").json()["uploading"] == 0
        assert post(base).json() == {"text": "hello there general"}


def test_uploads_in_progress_hold_upload_slots_and_the_rest_get_503_unread(tmp_path):
    """30 clients stall mid-upload against 3 upload slots: three hold a slot and a file, the rest are
    refused before their bodies are read, and the three are timed out and their files removed."""
    app = create_app(StandInModel(), max_uploads=3, read_timeout_s=5, upload_dir=str(tmp_path))
    with running(app) as base:
        holders = [stalled_upload(base) for _ in range(3)]
        wait_until(lambda: len(upload_files(tmp_path)) == 3, what="three upload files exist")
        refused = [stalled_upload(base) for _ in range(26)]
        refused.append(stalled_upload(base, length=20_000_000, expect_continue=True))  # 503, not 100
        heads = [response_head(sock, 5) for sock in refused]
        assert [status for status, _ in heads] == [503] * 27
        assert all(b"retry-after: " in head for _, head in heads)
        assert len(upload_files(tmp_path)) == 3
        assert httpx.get(base + "/health").json()["uploading"] == 3
        assert [response_head(sock, 10)[0] for sock in holders] == [408] * 3
        assert upload_files(tmp_path) == []
        for sock in holders + refused:
            sock.close()
        assert post(base).status_code == 200
        health = {"status": "ok", "uploading": 0, "queued": 0, "served": 1}
        assert httpx.get(base + "/health").json() == health


def test_start_sweeps_abandoned_upload_dirs_but_not_a_running_servers(tmp_path):
    abandoned = tmp_path / "nanoasr-uploads-1-dead"  # a killed server's: nobody holds its lock
    abandoned.mkdir()
    (abandoned / "nanoasr-upload-a.wav").write_bytes(b"RIFF")
    shared = tmp_path / "nanoasr-uploads-2-dead"  # someone else put a file of theirs in it
    shared.mkdir()
    (shared / "nanoasr-upload-b.wav").write_bytes(b"RIFF")
    (shared / "notes.txt").write_text("not ours")
    (tmp_path / "nanoasr-upload-c.wav").write_bytes(b"RIFF")  # not in a server's directory: not ours
    with running(create_app(StandInModel(), upload_dir=str(tmp_path))):
        assert not abandoned.exists()
        (first,) = set(tmp_path.glob("nanoasr-uploads-*")) - {shared}
        with running(create_app(StandInModel(), upload_dir=str(tmp_path))):
            assert first.is_dir()  # the running server's directory is locked, so the second one keeps it
            assert len(set(tmp_path.glob("nanoasr-uploads-*")) - {shared, first}) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nanoasr-upload-c.wav", shared.name]
    assert [p.name for p in shared.iterdir()] == ["notes.txt"]


def post_stream(url, content, data=None):
    return post(url, {"stream": "true", **(data or {})}, files={"file": ("a.wav", content, "audio/wav")})


def test_stream_of_undecodable_audio_is_400_not_an_event(url):
    error = assert_envelope(post_stream(url, b"not audio at all"), 400, "file")
    assert "a.wav" in error["message"] and "nanoasr-upload-" not in error["message"]


def test_stream_with_bad_options_is_400_before_decoding():
    model = StandInModel()
    with running(create_app(model)) as base:
        hotwords = ",".join(f"w{i}" for i in range(101))
        assert_envelope(post_stream(base, wav_bytes(), {"hotwords": hotwords}), 400, "hotwords")
        assert_envelope(post_stream(base, wav_bytes(), {"prompt": "x" * 5000}), 400, "prompt")
    assert model.calls == 0


@pytest.fixture(scope="module")
def two_hours_of_silence():
    """A FLAC that is a few hundred KiB and decodes to 7200 s: 115 million samples, 460 MB as float32."""
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", 16000, 1, format="FLAC", subtype="PCM_16") as f:
        block = np.zeros(16000 * 600, np.int16)
        for _ in range(12):
            f.write(block)
    return buf.getvalue()


class RssPeak:
    """The largest rise in this process's resident memory while the block runs, sampled every 2 ms."""

    def __enter__(self):
        psutil = pytest.importorskip("psutil")
        self._process, self._done = psutil.Process(), threading.Event()
        self.before = self.peak = self._process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._done.wait(0.002):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self.rise = self.peak - self.before


@pytest.mark.parametrize("stream", ["false", "true"])
def test_audio_over_the_duration_limit_is_413_without_decoding_it(two_hours_of_silence, stream):
    model = StandInModel()
    with running(create_app(model, max_duration_s=60)) as base:
        with RssPeak() as rss:
            start = time.monotonic()
            response = post(base, {"stream": stream},
                            files={"file": ("long.flac", two_hours_of_silence, "audio/flac")})
            elapsed = time.monotonic() - start
    error = assert_envelope(response, 413, "file")
    assert error["code"] == "audio_too_long"
    assert "60 s" in error["message"] and "7200" in error["message"]  # the limit and the audio's length
    assert "long.flac" in error["message"] and "nanoasr-upload-" not in error["message"]
    assert elapsed < 5 and rss.rise < 64 * 2**20, (elapsed, rss.rise)
    assert model.calls == 0


@pytest.fixture
def sentinel(tmp_path):
    """Audio on the server's disk that no upload may make the server read: were it read, the request
    would be transcribed (200)."""
    path = tmp_path / "sentinel.mp3"
    t = np.arange(32000) / 16000
    sf.write(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000, format="MP3")
    return path


@pytest.mark.parametrize("name, playlist", [
    ("list.m3u8", "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:2.0,\n{path}\n#EXT-X-ENDLIST\n"),
    ("list.m3u8", "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:2.0,\nfile:{path}\n#EXT-X-ENDLIST\n"),
    ("a.wav", "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:2.0,\n../{name}\n#EXT-X-ENDLIST\n"),
    ("a.wav", "ffconcat version 1.0\nfile {path}\n"),
])
def test_playlists_naming_server_files_are_400(tmp_path, sentinel, name, playlist):
    model = StandInModel()
    with running(create_app(model, upload_dir=str(tmp_path))) as base:
        body = playlist.format(path=sentinel, name=sentinel.name).encode()
        assert_envelope(post(base, files={"file": (name, body, "audio/x-mpegurl")}), 400, "file")
    assert model.calls == 0


class FailingModel:
    """Raises `exc` after sending `segments_first` segments."""

    def __init__(self, exc, segments_first=0):
        self.exc, self.segments_first = exc, segments_first

    def check_options(self, language=None, word_timestamps=False):
        """Accepts every language and word timestamps."""

    def transcribe(self, audio, on_segment=None, **kwargs):
        for i in range(self.segments_first):
            on_segment(Segment(i, i + 1.0, f"part {i}", "stop", (1,)))
        raise self.exc


@pytest.mark.parametrize("stream", ["false", "true"])
@pytest.mark.parametrize("exc, status", [
    (AudioTooLongError("<array>: the audio is 7200.0 s long"), 413),
    (AudioError("<array>: no speech"), 400),
    (OptionError("the prompt is 5000 tokens; the limit is 4096"), 400),  # found only once tokenized
    (ModelError("the checkpoint is broken"), 500),
    (RuntimeError("a bug"), 500),
])
def test_errors_before_the_first_segment_get_their_status_code(exc, status, stream):
    with running(create_app(FailingModel(exc))) as base:
        error = assert_envelope(post(base, {"stream": stream}), status)
    assert error["type"] == ("server_error" if status == 500 else "invalid_request_error")


def test_a_failure_after_the_first_segment_ends_the_stream_with_an_error_event():
    with running(create_app(FailingModel(ModelError("the checkpoint is broken"), segments_first=1))) as base:
        response = post(base, {"stream": "true"})
    assert response.status_code == 200
    events = [line for line in response.text.split("\n") if line.startswith("data: ")]
    assert events[0] == 'data: {"type": "transcript.text.delta", "delta": "part 0"}'
    assert '"type": "error"' in events[-1] and "the checkpoint is broken" in events[-1]


def test_upload_dirs_we_cannot_open_are_left_alone(tmp_path, monkeypatch):
    locked = tmp_path / "nanoasr-uploads-3-unreadable"
    locked.mkdir()
    (locked / "nanoasr-upload-d.wav").write_bytes(b"RIFF")
    real_open = os.open

    def open_as_another_user(path, *args, **kwargs):  # root may open anything, so refusal is simulated
        if os.fspath(path) == str(locked):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_as_another_user)
    with running(create_app(StandInModel(), upload_dir=str(tmp_path))) as base:
        assert post(base).status_code == 200
    assert [p.name for p in tmp_path.iterdir()] == [locked.name]
    assert [p.name for p in locked.iterdir()] == ["nanoasr-upload-d.wav"]


class WarmingModel(StandInModel):
    """A stand-in that notes each warm-up (how many requests it had transcribed by then) and the thread of
    each call."""

    def __init__(self):
        super().__init__()
        self.warm_ups, self.threads = [], []

    def warm_up(self):
        self.warm_ups.append(self.calls)
        self.threads.append(threading.current_thread())
        return 0.0

    def transcribe(self, audio, **kwargs):
        self.threads.append(threading.current_thread())
        return super().transcribe(audio, **kwargs)


def test_the_app_warms_the_model_up_once_before_it_accepts_a_connection():
    model = WarmingModel()
    app = create_app(model, warm_up=True)
    assert model.warm_ups == []  # made, not started
    with running(app) as base:
        assert model.warm_ups == [0]  # when the server listens, the warm-up has run, once
        assert post(base).json() == {"text": "hello there general"}
    assert model.warm_ups == [0] and model.calls == 1
    warm, request = model.threads
    assert warm is request  # the worker thread the requests run on
    with running(create_app(model)) as base:  # warm_up is the caller's choice: off unless asked
        post(base)
    assert model.warm_ups == [0] and model.calls == 2
