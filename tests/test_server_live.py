"""The server on a real socket with the tiny engine, called by the official openai client and raw HTTP.

The tiny model has random weights, so its text is noise: every check compares what the server returns
with what `Model.transcribe` returns for the same audio and options. Durations come from soundfile,
subtitles are read back by a strict parser written here.
"""
import io
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import soundfile as sf

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from nanoasr.server import create_app  # noqa: E402
from tests.serverutil import running, serving, stalled_upload, upload_files, wait_until  # noqa: E402
from tools.lib.synth import speech_like  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
KEY = "sk-local-test"
LIMIT_MB = 2
SRT_CUE = re.compile(r"(\d+)\n(\d\d):(\d\d):(\d\d),(\d\d\d) --> (\d\d):(\d\d):(\d\d),(\d\d\d)\n(.+)")
VTT_CUE = re.compile(r"(\d\d):(\d\d):(\d\d)\.(\d\d\d) --> (\d\d):(\d\d):(\d\d)\.(\d\d\d)\n(.+)")


def wav(seconds: float, seed: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, speech_like(seconds, seed), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


SHORT = wav(3.0, 1)
LONG = wav(31.0, 2)  # over 30 s: the engine splits it, so subtitles have several cues


@pytest.fixture(scope="module")
def upload_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("uploads")


@pytest.fixture(scope="module")
def server(tiny_model, upload_dir):
    app = create_app(tiny_model, api_key=KEY, max_upload_mb=LIMIT_MB, upload_dir=str(upload_dir))
    with running(app) as base:
        yield base
    assert os.listdir(upload_dir) == []


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def direct(tiny_model):
    """Model.transcribe on the same bytes, cached per (audio, options)."""
    cache = {}

    def run(audio: bytes, **options):
        key = (audio, tuple(sorted(options.items())))
        if key not in cache:
            cache[key] = tiny_model.transcribe(audio, **options)
        return cache[key]

    return run


def seconds(h, m, s, ms) -> float:
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def parse_srt(body: str) -> list[tuple[float, float, str]]:
    blocks = body.strip("\n").split("\n\n")
    cues = []
    for i, block in enumerate(blocks, 1):
        m = SRT_CUE.fullmatch(block)
        assert m, f"not an SRT cue: {block!r}"
        assert int(m[1]) == i
        cues.append((seconds(*m.groups()[1:5]), seconds(*m.groups()[5:9]), m[10]))
    return cues


def parse_vtt(body: str) -> list[tuple[float, float, str]]:
    header, _, rest = body.partition("\n\n")
    assert header == "WEBVTT"
    cues = []
    for block in rest.strip("\n").split("\n\n"):
        m = VTT_CUE.fullmatch(block)
        assert m, f"not a WebVTT cue: {block!r}"
        cues.append((seconds(*m.groups()[0:4]), seconds(*m.groups()[4:8]), m[9]))
    return cues


def expected_cues(transcript) -> list[tuple[float, float, str]]:
    return [(round(s.start, 3), round(s.end, 3), s.text.strip())
            for s in transcript.segments if s.text.strip()]


def test_json(client, direct):
    result = client.audio.transcriptions.create(model="fun-asr-nano", file=("a.wav", SHORT, "audio/wav"))
    assert result.text == direct(SHORT).text and result.text


def test_text(client, direct):
    result = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", SHORT, "audio/wav"),
                                                response_format="text")
    assert isinstance(result, str) and result == direct(SHORT).text


@pytest.mark.parametrize("fmt, parse", [("srt", parse_srt), ("vtt", parse_vtt)])
def test_subtitles_parse_and_match_the_segments(client, direct, fmt, parse):
    body = client.audio.transcriptions.create(model="m", file=("long.wav", LONG, "audio/wav"),
                                              response_format=fmt)
    cues = parse(body)
    assert len(cues) >= 2
    expected = expected_cues(direct(LONG))
    assert [t for _, _, t in cues] == [t for _, _, t in expected]
    times = [x for a, b, _ in cues for x in (a, b)]
    assert times == pytest.approx([x for a, b, _ in expected for x in (a, b)], abs=1e-3)
    assert all(a < b for a, b, _ in cues) and all(p[1] <= q[0] for p, q in zip(cues, cues[1:]))


def test_verbose_json(client, direct):
    result = client.audio.transcriptions.create(model="m", file=("long.wav", LONG, "audio/wav"),
                                                response_format="verbose_json",
                                                timestamp_granularities=["segment"])
    reference = direct(LONG)
    assert result.duration == pytest.approx(sf.info(io.BytesIO(LONG)).duration, abs=1e-6) == 31.0
    assert result.text == reference.text
    assert len(result.segments) >= 2
    assert [(s.start, s.end, s.text) for s in result.segments] == [
        (s.start, s.end, s.text) for s in reference.segments if s.text]
    assert [s.tokens for s in result.segments] == [list(s.token_ids) for s in reference.segments if s.text]
    assert all(0 <= s.start < s.end <= result.duration for s in result.segments)
    assert result.usage.seconds == result.duration


def test_verbose_json_language_is_named(client, direct):
    result = client.audio.transcriptions.create(model="m", file=("a.wav", SHORT, "audio/wav"),
                                                response_format="verbose_json", language="en")
    assert result.language == "english" and result.text == direct(SHORT, language="en").text
    assert result.duration == pytest.approx(sf.info(io.BytesIO(SHORT)).duration, abs=1e-6)
    assert [(s.start, s.end) for s in result.segments] == [(0.0, result.duration)]


def test_prompt_and_language_reach_the_engine(client, direct):
    prompt = "A board meeting about the budget."
    result = client.audio.transcriptions.create(model="m", file=("a.wav", SHORT, "audio/wav"),
                                                prompt=prompt, language="ja")
    with_options = direct(SHORT, context=prompt, language="ja")
    assert result.text == with_options.text
    assert with_options.text != direct(SHORT).text  # the options changed the decoder's input


def test_hotwords_and_itn_extras_reach_the_engine(client, direct):
    result = client.audio.transcriptions.create(model="m", file=("a.wav", SHORT, "audio/wav"),
                                                extra_body={"hotwords": "alpha, beta", "itn": "false"})
    assert result.text == direct(SHORT, hotwords=("alpha", "beta"), itn=False).text


def test_stream_events(client, direct):
    stream = client.audio.transcriptions.create(model="m", file=("long.wav", LONG, "audio/wav"), stream=True)
    events = list(stream)
    assert [e.type for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
    assert events[-1].type == "transcript.text.done"
    expected = direct(LONG).text
    assert len(events) - 1 > len([s for s in direct(LONG).segments if s.text.strip()]) >= 2  # and within them
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == expected


def test_client_sees_bad_request_without_retrying(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(model="m", file=("a.wav", SHORT, "audio/wav"), temperature=0.4)
    assert info.value.body["param"] == "temperature"


# --- raw HTTP: error cases ------------------------------------------------------------------------


def post(base, data=None, files=None, key=KEY, **kwargs):
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    files = files if files is not None else {"file": ("a.wav", SHORT, "audio/wav")}
    return httpx.post(base + "/v1/audio/transcriptions", data={"model": "m", **(data or {})}, files=files,
                      headers=headers, timeout=60, **kwargs)


def assert_envelope(response, status, param="any"):
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    if param != "any":
        assert error["param"] == param
    return error


@pytest.mark.parametrize("name, content", [
    ("a.wav", b"RIFF\x24\x00\x00\x00WAVEfmt "),  # a truncated WAV header
    ("a.mp3", b"\xff\xfb\x90\x00" + bytes(300)),
    ("a.wav", b"just some text, not audio"),
    ("a.wav", wav(0.01, 0)),  # shorter than one feature frame
    ("a.wav", b""),
])
@pytest.mark.parametrize("stream", ["false", "true"])
def test_undecodable_audio_is_400(server, name, content, stream):
    response = post(server, {"stream": stream}, files={"file": (name, content, "audio/wav")})
    error = assert_envelope(response, 400, "file")
    assert "nanoasr-upload-" not in error["message"]  # the client's file name, not the temporary one


@pytest.mark.parametrize("data, param", [
    ({"response_format": "xml"}, "response_format"),
    ({"language": "klingon"}, "language"),
    ({"stream": "perhaps"}, "stream"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": "0.2"}, "temperature"),
    ({"temperature": "1"}, "temperature"),
    ({"temperature": "nan"}, "temperature"),
    ({"timestamp_granularities[]": "word"}, "timestamp_granularities"),
    ({"timestamp_granularities[]": ["segment", "word"]}, "timestamp_granularities"),
])
def test_bad_fields_are_400(server, data, param):
    assert_envelope(post(server, data), 400, param)


def test_what_the_model_cannot_do_is_400_before_the_upload_is_decoded(server, tiny_model):
    assert "ko" not in tiny_model.languages  # Korean is one of Fun-ASR-MLT-Nano's, not Fun-ASR-Nano's
    served = httpx.get(server + "/health").json()["served"]
    error = assert_envelope(post(server, {"language": "Korean"}), 400, "language")
    assert "not trained for it" in error["message"]
    words = {"timestamp_granularities[]": "word", "response_format": "verbose_json"}
    error = assert_envelope(post(server, words), 400, "timestamp_granularities")
    assert "CTC branch" in error["message"]
    assert httpx.get(server + "/health").json()["served"] == served  # neither reached the worker


@pytest.mark.parametrize("stream", ["false", "true"])
def test_prompt_over_the_token_limit_is_400_even_when_streaming(server, stream):
    # within the character limit, but each of these characters is several tokens: found only once the
    # model tokenizes the prompt, after the audio is decoded
    error = assert_envelope(post(server, {"prompt": "\U0001d518" * 4000, "stream": stream}), 400)
    assert "4096" in error["message"]


def test_missing_file_and_model_are_400(server):
    assert_envelope(post(server, files={"other": ("a.wav", SHORT, "audio/wav")}), 400, "file")
    response = httpx.post(server + "/v1/audio/transcriptions", files={"file": ("a.wav", SHORT, "audio/wav")},
                          headers={"Authorization": f"Bearer {KEY}"})
    assert_envelope(response, 400, "model")


def test_api_key_is_required_on_v1_routes(server):
    assert_envelope(post(server, key=None), 401)
    assert_envelope(post(server, key="sk-wrong"), 401)
    assert_envelope(httpx.get(server + "/v1/models"), 401)
    assert httpx.get(server + "/health").json()["status"] == "ok"
    listed = httpx.get(server + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert [m["id"] for m in listed["data"]] == ["fun-asr-nano"]


def test_upload_over_the_limit_is_413(server, upload_dir):
    big = wav(LIMIT_MB * 1024 * 1024 / 32000 + 2, 3)  # 16-bit mono: 32000 bytes a second
    error = assert_envelope(post(server, files={"file": ("big.wav", big, "audio/wav")}), 413, "file")
    assert str(LIMIT_MB * 1024 * 1024) in error["message"]
    assert upload_files(upload_dir) == []


class Gated:
    """The tiny engine, held at the start of each call until the test opens the gate."""

    def __init__(self, model):
        self.model, self.entered, self.gate = model, threading.Event(), threading.Event()

    def check_options(self, language=None, word_timestamps=False):
        self.model.check_options(language, word_timestamps)

    def transcribe(self, audio, **kwargs):
        self.entered.set()
        self.gate.wait(30)
        return self.model.transcribe(audio, **kwargs)


def test_full_queue_is_503_with_retry_after(tiny_model, direct, tmp_path):
    model = Gated(tiny_model)
    with running(create_app(model, max_queue=2, upload_dir=str(tmp_path))) as base:
        answers = [None, None]
        threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, post(base, key=None)))
                   for i in range(2)]
        threads[0].start()
        assert model.entered.wait(30)
        threads[1].start()
        deadline = time.monotonic() + 30
        while httpx.get(base + "/health").json()["queued"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        busy = post(base, key=None)
        model.gate.set()
        for t in threads:
            t.join(60)
        error = assert_envelope(busy, 503)
        assert error["code"] == "queue_full" and int(busy.headers["retry-after"]) > 0
        assert [a.json()["text"] for a in answers] == [direct(SHORT).text] * 2
        assert post(base, key=None).status_code == 200  # the slots were given back
    assert os.listdir(tmp_path) == []


# --- the command line ------------------------------------------------------------------------------


def test_serve_command_end_to_end(tiny_dir, tmp_path, default_model):
    args = ["--model", str(tiny_dir), "--api-key", KEY, "--max-queue", "2", "--upload-dir", str(tmp_path)]
    with serving(args, tmp_path / "server.log") as (process, base):
        assert httpx.get(base + "/health").json()["status"] == "ok"
        client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
        text = client.audio.transcriptions.create(model="m", file=("a.wav", SHORT, "audio/wav"),
                                                  response_format="text")
        assert text == default_model.transcribe(SHORT).text  # the command's model, default activations
    # uvicorn shuts down gracefully on SIGTERM and then re-raises it, so the status is 0 or -SIGTERM
    assert process.returncode in (0, -signal.SIGTERM)
    log = (tmp_path / "server.log").read_text()
    assert "Finished server process" in log and "Traceback" not in log
    assert log.index("warming up") < log.index("warmed up in") < log.index("running on")  # warm when ready
    assert [p.name for p in tmp_path.iterdir()] == ["server.log"]


def test_a_killed_servers_uploads_are_removed_by_the_next_server(tiny_dir, tmp_path):
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    args = ["--model", str(tiny_dir), "--upload-dir", str(uploads)]
    with serving(args, tmp_path / "first.log") as (process, base):
        with stalled_upload(base):
            wait_until(lambda: upload_files(uploads), what="the upload file exists")
            process.kill()  # SIGKILL: no chance to clean up
            process.wait(30)
    (left,) = upload_files(uploads)
    with serving(args, tmp_path / "second.log") as (_, base):
        assert not left.parent.exists()
        assert [p.name.startswith("nanoasr-uploads-") for p in uploads.iterdir()] == [True]
        assert httpx.get(base + "/health").json()["status"] == "ok"
    assert list(uploads.iterdir()) == []


@pytest.mark.parametrize("missing", ["fastapi", "uvicorn", "python_multipart"])
def test_serve_without_the_extra_says_what_to_install(missing):
    code = (f"import sys; sys.modules[{missing!r}] = None; sys.argv = ['nanoasr', 'serve', '--model', 'x']; "
            "import runpy; runpy.run_module('nanoasr', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert 'pip install ".[server]" in the nanoasr checkout' in done.stderr and missing in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_help_and_bad_options_need_no_extra():
    code = ("import sys; sys.modules['fastapi'] = None; sys.argv = ['nanoasr', 'serve', '--help']; "
            "import runpy; runpy.run_module('nanoasr', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    for option in ("--max-upload-mb", "--max-queue", "--max-uploads", "--max-duration", "--read-timeout",
                   "--min-upload-rate", "--upload-timeout", "--header-timeout", "--max-header-connections",
                   "--upload-dir"):
        assert option in done.stdout
    for option, value in (("--max-queue", "0"), ("--max-duration", "nan"), ("--read-timeout", "inf"),
                          ("--partial-interval", "0"), ("--partial-interval", "9")):
        bad = subprocess.run([sys.executable, "-m", "nanoasr", "serve", option, value], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and option in bad.stderr


# --- property-based: the published OpenAPI schema, no 5xx ----------------------------------------------
# schemathesis' pytest plugin (from_fixture) does not run under this pytest, so each operation's
# strategy is driven by hypothesis directly.


def test_openapi_schema_no_server_errors(server):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings, strategies as st

    schema = schemathesis.openapi.from_url(server + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {(op.method, op.path) for op in operations} >= {("post", "/v1/audio/transcriptions"),
                                                           ("get", "/v1/models"), ("get", "/health")}
    calls = []
    for op in operations:
        modes = [schemathesis.GenerationMode.POSITIVE]
        if op.method == "post":
            modes.append(schemathesis.GenerationMode.NEGATIVE)
        for mode in modes:
            @given(case=op.as_strategy(generation_mode=mode), real_audio=st.booleans())
            # derandomize: the same examples every run, so the assertions below cannot pass or fail by chance
            @settings(max_examples=15 if op.method == "post" else 3, deadline=None, database=None,
                      derandomize=True, suppress_health_check=list(HealthCheck))
            def check(case, real_audio):
                if real_audio and isinstance(case.body, dict) and "file" in case.body:
                    case.body["file"] = SHORT  # reach the engine with generated fields, not only the decoder
                response = case.call(base_url=server, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
                calls.append((op.path, response.status_code))
                assert response.status_code < 500, (case.body, response.text)
                if response.status_code >= 400:
                    assert set(json.loads(response.content)["error"]) == {"message", "type", "param", "code"}

            check()
    assert any(path == TRANSCRIPTIONS_PATH and status == 200 for path, status in calls)
    assert any(path == TRANSCRIPTIONS_PATH and 400 <= status < 500 for path, status in calls)


TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
