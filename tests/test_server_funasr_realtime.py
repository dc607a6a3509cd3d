"""/funasr/realtime: FunASR's Nano realtime protocol (text commands, binary PCM16, its result JSON) on the
tiny model, with a raw WebSocket client. Sentences are compared with `Model.transcribe` of their audio."""
import asyncio
import json

import numpy as np
import pytest

websockets = pytest.importorskip("websockets")
pytest.importorskip("fastapi")

from nanoasr.realtime import Limits  # noqa: E402
from nanoasr.server import create_app  # noqa: E402
from tests.test_realtime import utterances_clip  # noqa: E402
from tests.test_realtime import TONES  # noqa: E402
from tests.test_server_realtime import RECV_TIMEOUT_S, running  # noqa: E402

RESULT_KEYS = {"sentences", "partial", "partial_start_ms", "duration_ms", "is_final"}


@pytest.fixture(scope="module")
def url(fast_model):
    app = create_app(fast_model)
    # the tiny model's partials are noise; sentences are exact
    app.state.live_limits = Limits(partials=False, vad=TONES)
    with running(app) as base:
        yield base.replace("http", "ws") + "/funasr/realtime"


async def next_message(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S))


async def until_stopped(ws, limit=200) -> list[dict]:
    messages = []
    for _ in range(limit):
        messages.append(await next_message(ws))
        if messages[-1].get("event") == "stopped":
            return messages
    raise AssertionError("no 'stopped' event")


def test_a_session_of_three_utterances(url, fast_model):
    clip, _ = utterances_clip(gap_s=2.5)  # FunASR's schedule: a short utterance ends after 2 s of silence
    pcm = (np.clip(clip, -1, 32767 / 32768) * 32768).astype("<i2")
    wave = pcm.astype(np.float32) / 32768.0

    async def run():
        async with websockets.connect(url) as ws:
            await ws.send(pcm[:1600].tobytes())  # before START: ignored
            await ws.send("START")
            started = await next_message(ws)
            await ws.send("LANGUAGE:en")
            language = await next_message(ws)
            data = pcm.tobytes()
            for i in range(0, len(data), 1921):  # odd sizes: samples split across messages
                await ws.send(data[i:i + 1921])
            await ws.send("STOP")
            return started, language, await until_stopped(ws)

    started, language, messages = asyncio.run(run())
    assert started == {"event": "started"} and language == {"event": "language_set", "language": "en"}
    results = messages[:-1]
    assert all(set(r) == RESULT_KEYS for r in results) and results[-1]["is_final"] is True
    assert not any(r["is_final"] for r in results[:-1])
    sentences = results[-1]["sentences"]
    assert len(sentences) == 3 and results[-1]["duration_ms"] == len(pcm) * 1000 // 16000
    for sentence in sentences:
        audio = wave[sentence["start"] * 16:sentence["end"] * 16]
        assert sentence["text"] == fast_model.transcribe(audio, sample_rate=16000, language="en").text


def test_commands_out_of_place_get_errors_and_commit_ends_an_utterance(url, fast_model):
    clip, _ = utterances_clip(seeds=(5,), gap_s=0.2)
    pcm = (np.clip(clip, -1, 32767 / 32768) * 32768).astype("<i2")

    async def run():
        async with websockets.connect(url) as ws:
            replies = []
            for command in ("COMMIT", "DANCE", "LANGUAGE:klingon"):
                await ws.send(command)
                replies.append(await next_message(ws))
            await ws.send("STOP")
            replies.append(await next_message(ws))
            await ws.send("START")
            await next_message(ws)
            await ws.send("HOTWORDS:nanoasr, numba")
            replies.append(await next_message(ws))
            await ws.send(pcm.tobytes())
            await ws.send("COMMIT")
            replies.append(await next_message(ws))
            return replies

    not_active, unknown, language, stopped, hotwords, committed = asyncio.run(run())
    assert not_active == {"event": "error", "error": "Session is not active; send START first"}
    assert unknown["event"] == "error" and "unknown command 'DANCE'" in unknown["error"]
    assert language["event"] == "error" and "klingon" in language["error"]
    assert stopped == {"event": "stopped"}
    assert hotwords == {"event": "hotwords_set", "hotwords": ["nanoasr", "numba"]}
    assert committed["is_final"] is True and len(committed["sentences"]) == 1
    (sentence,) = committed["sentences"]
    audio = pcm[sentence["start"] * 16:sentence["end"] * 16].astype(np.float32) / 32768
    expected = fast_model.transcribe(audio, sample_rate=16000, hotwords=["nanoasr", "numba"])
    assert sentence["text"] == expected.text
