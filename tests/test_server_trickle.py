"""Slow clients against the server's time limits, on loopback with deadlines of a second or two: an upload
trickled a byte at a time, one over its whole deadline, and connections that never finish their headers.
Each must be cut off with its slot and file given back while other clients are still answered."""
import io
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("fastapi")

from nanoasr.server import create_app  # noqa: E402
from nanoasr.transcript import Transcript  # noqa: E402
from tests.serverutil import (HALF_HEADER, closed_by_server, half_header, response_head,  # noqa: E402
                              running, serving, stalled_upload, trickle_until_closed, upload_files,
                              wait_until)


class EchoModel:
    def check_options(self, language=None, word_timestamps=False):
        """Accepts everything."""

    def transcribe(self, audio, on_segment=None, **kwargs):
        return Transcript("hello", (), None, 0.5, {})


def post(base: str) -> httpx.Response:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(8000, np.float32), 16000, format="WAV", subtype="PCM_16")
    return httpx.post(base + "/v1/audio/transcriptions", data={"model": "fun-asr-nano"},
                      files={"file": ("a.wav", buf.getvalue(), "audio/wav")}, timeout=30)


def error_code(response: bytes) -> tuple[int, str]:
    """(status, error code) of a raw error response."""
    head, body = response.split(b"\r\n\r\n", 1)
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"]["code"]


def health(base: str) -> dict:
    return httpx.get(base + "/health").json()


def trickling(socks: list[socket.socket], pool: ThreadPoolExecutor) -> list:
    """Each of `socks` sent a byte every 0.2 s on its own thread; the futures of what the server sent back."""
    return [pool.submit(trickle_until_closed, sock, 0.2) for sock in socks]


def test_a_trickled_upload_gets_408_and_holds_no_queue_slot_meanwhile(tmp_path):
    """A byte every 0.2 s never trips the read timeout; the minimum rate cuts it off after about 3 s. While
    it lasts it holds an upload slot but not the one queue slot, so a complete upload is transcribed."""
    app = create_app(EchoModel(), max_queue=1, read_timeout_s=3, min_upload_kib_s=1, upload_dir=str(tmp_path))
    with running(app) as base, ThreadPoolExecutor(1) as pool:
        with stalled_upload(base, sent=1) as sock:
            (answer,) = trickling([sock], pool)
            assert post(base).json() == {"text": "hello"}
            assert health(base)["uploading"] == 1
            assert error_code(answer.result()) == (408, "upload_too_slow")
        assert upload_files(tmp_path) == []
        assert health(base) == {"status": "ok", "uploading": 0, "queued": 0, "served": 1}


def test_tricklers_filling_every_upload_slot_are_cut_off_and_the_slots_freed(tmp_path):
    app = create_app(EchoModel(), max_uploads=4, read_timeout_s=3, min_upload_kib_s=1,
                     upload_dir=str(tmp_path))
    with running(app) as base, ThreadPoolExecutor(4) as pool:
        tricklers = [stalled_upload(base, sent=1) for _ in range(4)]
        answers = trickling(tricklers, pool)
        wait_until(lambda: health(base)["uploading"] == 4, what="four uploads are in progress")
        busy = post(base)
        assert busy.status_code == 503 and busy.json()["error"]["code"] == "uploads_full"
        assert [error_code(answer.result()) for answer in answers] == [(408, "upload_too_slow")] * 4
        for sock in tricklers:
            sock.close()
        assert upload_files(tmp_path) == []
        assert post(base).json() == {"text": "hello"}


def test_an_upload_past_its_deadline_gets_408_however_fast_it_is(tmp_path):
    """4 KiB every 0.1 s is 40 times the minimum rate; the 1.5 s deadline still ends it."""
    app = create_app(EchoModel(), read_timeout_s=1, min_upload_kib_s=1, upload_timeout_s=1.5,
                     max_upload_mb=10, upload_dir=str(tmp_path))
    with running(app) as base:
        with stalled_upload(base, sent=1, length=9_000_000) as sock:
            response = trickle_until_closed(sock, every_s=0.1, chunk=bytes(4096))
        assert error_code(response) == (408, "upload_timeout")
        assert upload_files(tmp_path) == []
        assert health(base)["uploading"] == 0


def test_half_sent_headers_are_closed_and_do_not_crowd_out_a_request():
    """50 connections stop halfway through their headers against room for 20: the oldest are closed as new
    ones arrive, a complete request is answered meanwhile, and the rest are closed at the 3 s deadline."""
    with running(create_app(EchoModel()), header_timeout_s=3, max_header_connections=20) as base:
        opened = time.monotonic()
        half_open = [half_header(base) for _ in range(50)]
        assert post(base).json() == {"text": "hello"}
        assert all(closed_by_server(sock, 1) for sock in half_open[:30])  # made room for newer ones
        assert time.monotonic() - opened < 3, "too slow a machine for this test's deadline"
        assert not any(closed_by_server(sock, 0.01) for sock in half_open[31:])  # the newest wait
        assert all(closed_by_server(sock, 6) for sock in half_open[30:])
        for sock in half_open:
            sock.close()


def test_headers_sent_a_byte_at_a_time_are_closed_on_a_new_or_kept_alive_connection():
    """Bytes arriving do not extend the header deadline, and a kept-alive connection gets the same deadline
    for its next request's headers."""
    with running(create_app(EchoModel()), header_timeout_s=1) as base:
        with half_header(base, b"GET /health HTTP/1.1\r\n") as sock:
            assert trickle_until_closed(sock, every_s=0.2, limit_s=10, chunk=b"X") == b""
        with half_header(base, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n") as sock:
            assert response_head(sock, 5)[0] == 200
            sock.sendall(HALF_HEADER)
            trickle_until_closed(sock, every_s=0.2, limit_s=10, chunk=b"X")  # the rest of the first answer


def test_serve_has_the_time_limits_and_logs_the_model_and_each_request(tiny_dir, tmp_path):
    args = ["--model", str(tiny_dir), "--header-timeout", "1", "--read-timeout", "1",
            "--min-upload-rate", "1", "--upload-dir", str(tmp_path)]
    with serving(args, tmp_path / "server.log") as (_, base):
        with half_header(base) as sock:
            assert closed_by_server(sock, 10)
        with stalled_upload(base, sent=1) as sock:
            assert error_code(trickle_until_closed(sock, every_s=0.2)) == (408, "upload_too_slow")
        assert health(base)["uploading"] == 0
    log = (tmp_path / "server.log").read_text()
    assert f"model: {tiny_dir} (safetensors) bf16 x " in log
    assert '"GET /health" 200 in ' in log and '"POST /v1/audio/transcriptions" 408 in ' in log
