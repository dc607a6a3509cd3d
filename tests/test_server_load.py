"""Load on loopback: concurrent clients, mixed valid, invalid and hostile uploads, against `nanoasr serve`
in a subprocess with the tiny model.

Hostile clients send a playlist naming a file on the server, a decompression bomb, uploads that stall
halfway, and oversized hotwords and prompts. Every valid request must come back with the text
`Model.transcribe` gives for the same audio (run here, in this process), every other one with its 4xx in
the error envelope; the server must have run each admitted request exactly once, leave no upload behind,
and its resident memory must be back within 10% of the level it had after a warm-up.
"""
import io
import json
import os
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")

from tests.serverutil import response_head, serving, stalled_upload, upload_files  # noqa: E402
from tools.lib.synth import speech_like  # noqa: E402

LIMIT_MB = 1
MAX_DURATION_S = 60
READ_TIMEOUT_S = 3
RSS_TOLERANCE = 0.10


def wav(seconds: float, seed: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, speech_like(seconds, seed), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def flac_bomb(seconds: int) -> bytes:
    """Silence that compresses a thousandfold: a few hundred KiB that decode to `seconds` of samples."""
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", 16000, 1, format="FLAC", subtype="PCM_16") as f:
        for _ in range(seconds // 600):
            f.write(np.zeros(16000 * 600, np.int16))
    return buf.getvalue()


CLIPS = [wav(s, seed) for seed, s in enumerate((1.5, 2.0, 2.5, 3.0))]
TOO_BIG = wav(LIMIT_MB * 1024 * 1024 / 32000 + 1, 9)
BOMB = flac_bomb(7200)
# HLS: ffmpeg would fetch the segment it names, a file on the server, and transcribe it
PLAYLIST = "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:3.0,\n{path}\n#EXT-X-ENDLIST\n"
FORMATS = ("json", "text", "verbose_json", "srt", "vtt", "stream")


def invalid_requests(sentinel) -> list[tuple]:
    """(fields, file part or None, expected status, whether it reaches the worker); a part is (name, bytes).

    The worker decodes the upload, so only requests whose form is valid reach it.
    """
    return [
        ({}, ("a.wav", b"definitely not audio"), 400, True),
        ({}, ("a.wav", CLIPS[0][:40]), 400, True),  # a WAV header cut short
        ({}, ("a.wav", b""), 400, False),
        ({"temperature": "0.8"}, ("a.wav", CLIPS[0]), 400, False),
        ({"timestamp_granularities[]": "word", "response_format": "verbose_json"}, ("a.wav", CLIPS[0]), 400,
         False),
        ({"response_format": "docx"}, ("a.wav", CLIPS[0]), 400, False),
        ({"language": "xx-nowhere"}, ("a.wav", CLIPS[0]), 400, False),
        ({}, None, 400, False),
        ({}, ("big.wav", TOO_BIG), 413, False),
        # hostile
        ({}, ("list.m3u8", PLAYLIST.format(path=sentinel).encode()), 400, True),
        ({"stream": "true"}, ("bomb.flac", BOMB), 413, True),
        ({"hotwords": ",".join(f"word{i}" for i in range(5000))}, ("a.wav", CLIPS[0]), 400, False),
        ({"hotwords": "x" * 60_000}, ("a.wav", CLIPS[0]), 400, False),
        ({"prompt": "y" * 60_000}, ("a.wav", CLIPS[0]), 400, False),
    ]


@pytest.fixture(scope="module")
def expected(default_model):  # `nanoasr serve --model tiny` loads it with the default activations
    return [default_model.transcribe(clip) for clip in CLIPS]


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory):
    """Speech on the server's disk that a playlist names; the server must never read it."""
    path = tmp_path_factory.mktemp("private") / "sentinel.mp3"
    sf.write(path, speech_like(3.0, 7), 16000, format="MP3")
    return path


def plan(clients: int, per_client: int, invalid: list, seed: int = 0) -> list[list[tuple]]:
    """Per client, its requests: ("valid", clip index, format), ("invalid", index) or ("stall",)."""
    rng = random.Random(seed)
    out = []
    for _ in range(clients):
        jobs = []
        for _ in range(per_client):
            draw = rng.random()
            if draw < 0.5:
                jobs.append(("valid", rng.randrange(len(CLIPS)), rng.choice(FORMATS)))
            elif draw < 0.95:
                jobs.append(("invalid", rng.randrange(len(invalid))))
            else:
                jobs.append(("stall",))
        out.append(jobs)
    return out


def stall(base: str) -> tuple:
    """An upload that stops halfway: the server must answer 408 once its read timeout passes."""
    with stalled_upload(base) as sock:
        status, _ = response_head(sock, READ_TIMEOUT_S + 30)
    return ("stall",), status, "", ""


def send(http: httpx.Client, job, invalid: list) -> tuple:
    """One request; returns (job, status, content type, text or error body)."""
    if job[0] == "stall":
        return stall(str(http.base_url).rstrip("/"))
    if job[0] == "valid":
        _, clip, fmt = job
        data = {"model": "fun-asr-nano"}
        if fmt == "stream":
            data["stream"] = "true"
        else:
            data["response_format"] = fmt
        files = {"file": ("clip.wav", CLIPS[clip], "audio/wav")}
    else:
        fields, part, _, _ = invalid[job[1]]
        data = {"model": "fun-asr-nano", **fields}
        files = {"file": (part[0], part[1], "audio/wav")} if part is not None else None
    response = http.post("/v1/audio/transcriptions", data=data, files=files)
    return job, response.status_code, response.headers.get("content-type", ""), response.text


def check(job, status, content_type, body, expected, invalid) -> None:
    if job[0] == "stall":
        assert status == 408, job
        return
    if job[0] == "invalid":
        assert status == invalid[job[1]][2], (job, status, body)
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


def run_load(tiny_dir, tmp_path, expected, sentinel, clients: int, per_client: int) -> dict:
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    invalid = invalid_requests(sentinel)
    args = ["--model", str(tiny_dir), "--max-upload-mb", str(LIMIT_MB), "--max-queue", str(2 * clients),
            "--max-duration", str(MAX_DURATION_S), "--read-timeout", str(READ_TIMEOUT_S),
            "--upload-dir", str(uploads), "--threads", "1"]
    with serving(args, tmp_path / "server.log") as (process, base):
        server = psutil.Process(process.pid)
        with httpx.Client(base_url=base, timeout=120) as http:
            # warm-up: compiled kernels, allocator pools, every path
            warm_up = [("stall",)] + [("invalid", i) for i in range(len(invalid))]
            warm_up += plan(1, 30, invalid, seed=1)[0]
            for job in warm_up:
                check(*send(http, job, invalid), expected, invalid)
            before = rss(server)
            served_before = http.get("/health").json()["served"]

        jobs = plan(clients, per_client, invalid)

        def client(mine):
            with httpx.Client(base_url=base, timeout=120) as http:
                return [send(http, job, invalid) for job in mine]

        start = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            answers = [a for per_client_answers in pool.map(client, jobs) for a in per_client_answers]
        wall = time.perf_counter() - start
        for answer in answers:
            check(*answer, expected, invalid)
        sent = [job for mine in jobs for job in mine]
        assert len(answers) == len(sent)
        health = httpx.get(base + "/health").json()
        valid = sum(job[0] == "valid" for job in sent)
        decoded_bad = sum(job[0] == "invalid" and invalid[job[1]][3] for job in sent)
        assert health["queued"] == 0
        assert health["served"] - served_before == valid + decoded_bad  # each admitted request run once
        after = rss(server)
        assert upload_files(uploads) == []
    # uvicorn shuts down gracefully on SIGTERM and then re-raises it, so the status is 0 or -SIGTERM
    assert process.returncode in (0, -signal.SIGTERM)
    assert "Finished server process" in (tmp_path / "server.log").read_text()
    assert os.listdir(uploads) == []
    assert abs(after - before) <= RSS_TOLERANCE * before, (before, after)
    figures = {"requests": len(sent), "valid": valid, "stalled": sum(job[0] == "stall" for job in sent),
               "wall_s": round(wall, 1), "rss_before_mb": round(before / 2**20, 1),
               "rss_after_mb": round(after / 2**20, 1)}
    print("load:", figures)
    return figures


def test_load_8_clients_x_12(tiny_dir, tmp_path, expected, sentinel):
    run_load(tiny_dir, tmp_path, expected, sentinel, clients=8, per_client=12)
