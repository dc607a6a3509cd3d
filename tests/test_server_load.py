"""Load on loopback: concurrent clients, mixed valid and invalid uploads, against `nanoasr serve` in a
subprocess with the tiny model.

Every valid request must come back with the text `Model.transcribe` gives for the same audio (run here,
in this process), every invalid one with a 4xx in the error envelope; the server must have run each
admitted request exactly once, leave no upload behind, and its resident memory must be back within 10%
of the level it had after a warm-up.
"""
import io
import json
import os
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import soundfile as sf

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")

from tests.serverutil import serving  # noqa: E402
from tools.synth import speech_like  # noqa: E402

LIMIT_MB = 1
RSS_TOLERANCE = 0.10


def wav(seconds: float, seed: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, speech_like(seconds, seed), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


CLIPS = [wav(s, seed) for seed, s in enumerate((1.5, 2.0, 2.5, 3.0))]
TOO_BIG = wav(LIMIT_MB * 1024 * 1024 / 32000 + 1, 9)
# (fields, file part or None, expected status); the file part is (name, bytes)
INVALID = [
    ({}, ("a.wav", b"definitely not audio"), 400),
    ({}, ("a.wav", CLIPS[0][:40]), 400),  # a WAV header cut short
    ({}, ("a.wav", b""), 400),
    ({"temperature": "0.8"}, ("a.wav", CLIPS[0]), 400),
    ({"timestamp_granularities[]": "word", "response_format": "verbose_json"}, ("a.wav", CLIPS[0]), 400),
    ({"response_format": "docx"}, ("a.wav", CLIPS[0]), 400),
    ({"language": "xx-nowhere"}, ("a.wav", CLIPS[0]), 400),
    ({}, None, 400),
    ({}, ("big.wav", TOO_BIG), 413),
]
REACH_THE_WORKER = 2  # the first INVALID entries pass validation and fail in the decoder
FORMATS = ("json", "text", "verbose_json", "srt", "vtt", "stream")


@pytest.fixture(scope="module")
def expected(tiny_model):
    return [tiny_model.transcribe(clip) for clip in CLIPS]


def plan(clients: int, per_client: int, seed: int = 0) -> list[list[tuple]]:
    """Per client, its requests: ("valid", clip index, format) or ("invalid", INVALID index)."""
    rng = random.Random(seed)
    out = []
    for _ in range(clients):
        jobs = []
        for _ in range(per_client):
            if rng.random() < 0.5:
                jobs.append(("valid", rng.randrange(len(CLIPS)), rng.choice(FORMATS)))
            else:
                jobs.append(("invalid", rng.randrange(len(INVALID))))
        out.append(jobs)
    return out


def send(http: httpx.Client, job) -> tuple:
    """One request; returns (job, status, text or error body)."""
    if job[0] == "valid":
        _, clip, fmt = job
        data = {"model": "fun-asr-nano"}
        if fmt == "stream":
            data["stream"] = "true"
        else:
            data["response_format"] = fmt
        files = {"file": ("clip.wav", CLIPS[clip], "audio/wav")}
    else:
        fields, part, _ = INVALID[job[1]]
        data = {"model": "fun-asr-nano", **fields}
        files = {"file": (part[0], part[1], "audio/wav")} if part is not None else None
    response = http.post("/v1/audio/transcriptions", data=data, files=files)
    return job, response.status_code, response.headers.get("content-type", ""), response.text


def check(job, status, content_type, body, expected) -> None:
    if job[0] == "invalid":
        assert status == INVALID[job[1]][2], (job, status, body)
        assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
        return
    _, clip, fmt = job
    assert status == 200, (job, body)
    transcript = expected[clip]
    if fmt == "json":
        assert json.loads(body) == {"text": transcript.text}
    elif fmt == "verbose_json":
        got = json.loads(body)
        assert got["text"] == transcript.text and got["duration"] == transcript.duration_s
    elif fmt == "text":
        assert body == transcript.text
    elif fmt in ("srt", "vtt"):
        cues = [s.text.strip() for s in transcript.segments if s.text.strip()]
        assert [line for line in body.split("\n") if line and "-->" not in line and not line.isdigit()
                and line != "WEBVTT"] == cues
    else:
        assert content_type.startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in body.split("\n") if line.startswith("data: ")]
        assert events[-1] == {"type": "transcript.text.done", "text": transcript.text}
        assert "".join(e["delta"] for e in events[:-1]) == transcript.text


def rss(process: psutil.Process) -> int:
    return process.memory_info().rss


def run_load(tiny_dir, tmp_path, expected, clients: int, per_client: int) -> dict:
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    args = ["--model", str(tiny_dir), "--max-upload-mb", str(LIMIT_MB), "--max-queue", str(2 * clients),
            "--upload-dir", str(uploads), "--threads", "1"]
    with serving(args, tmp_path / "server.log") as (process, base):
        server = psutil.Process(process.pid)
        with httpx.Client(base_url=base, timeout=120) as http:
            for job in plan(1, 40, seed=1)[0]:  # warm-up: compiled kernels, allocator pools, every path
                check(*send(http, job), expected)
            before = rss(server)
            served_before = http.get("/health").json()["served"]

        jobs = plan(clients, per_client)

        def client(mine):
            with httpx.Client(base_url=base, timeout=120) as http:
                return [send(http, job) for job in mine]

        start = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            answers = [a for per_client_answers in pool.map(client, jobs) for a in per_client_answers]
        wall = time.perf_counter() - start
        for answer in answers:
            check(*answer, expected)
        sent = [job for mine in jobs for job in mine]
        assert len(answers) == len(sent)
        health = httpx.get(base + "/health").json()
        valid = sum(job[0] == "valid" for job in sent)
        decoded_bad = sum(job[0] == "invalid" and job[1] < REACH_THE_WORKER for job in sent)
        assert health["queued"] == 0
        assert health["served"] - served_before == valid + decoded_bad  # each admitted request run once
        after = rss(server)
        assert os.listdir(uploads) == []
    # uvicorn shuts down gracefully on SIGTERM and then re-raises it, so the status is 0 or -SIGTERM
    assert process.returncode in (0, -signal.SIGTERM)
    assert "Finished server process" in (tmp_path / "server.log").read_text()
    assert abs(after - before) <= RSS_TOLERANCE * before, (before, after)
    figures = {"requests": len(sent), "valid": valid, "wall_s": round(wall, 1),
               "rss_before_mb": round(before / 2**20, 1), "rss_after_mb": round(after / 2**20, 1)}
    print("load:", figures)
    return figures


def test_load_8_clients_x_25(tiny_dir, tmp_path, expected):
    run_load(tiny_dir, tmp_path, expected, clients=8, per_client=25)
