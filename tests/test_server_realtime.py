"""/v1/realtime?intent=transcription with the official openai SDK's realtime client, unmodified, on the tiny
model. Every server event is validated against the SDK's own pydantic types (GA, or beta where the client
spoke the beta shape); finals are compared with `Model.transcribe` of each utterance's audio, converted to
16 kHz the way the server documents it (soxr of the whole stream, which a chunked soxr stream equals).
"""
import asyncio
import base64
import json
import threading
import warnings

import numpy as np
import pytest
import soxr

openai = pytest.importorskip("openai")
websockets = pytest.importorskip("websockets")
pytest.importorskip("fastapi")

from openai.types.beta.realtime import (ConversationItemCreatedEvent,  # noqa: E402
                                        TranscriptionSessionUpdatedEvent)
from openai.types.realtime import RealtimeServerEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

from nanoasr.realtime import Limits  # noqa: E402
from nanoasr.server import create_app  # noqa: E402
from nanoasr.server.live_audio import G711, Converter  # noqa: E402
from nanoasr.server import realtime as server_realtime  # noqa: E402
from nanoasr.server.realtime import MAX_APPEND_BYTES, WS_MAX_BYTES  # noqa: E402
from tests import serverutil  # noqa: E402
from tests.serverutil import serving  # noqa: E402
from tests.test_realtime import TONES, utterances_clip  # noqa: E402

KEY = "sk-local-test"
GA_EVENT = TypeAdapter(RealtimeServerEvent)
BETA_EVENTS = {"transcription_session.updated": TranscriptionSessionUpdatedEvent,
               "conversation.item.created": ConversationItemCreatedEvent}
RECV_TIMEOUT_S = 120  # the tiny model decodes slowly on a loaded machine; every wait is bounded by this


def running(app):
    """`app` served as `nanoasr serve` serves it, WebSocket messages up to WS_MAX_BYTES."""
    return serverutil.running(app, ws_max_bytes=WS_MAX_BYTES)


@pytest.fixture(scope="module")
def app(fast_model):
    app = create_app(fast_model, api_key=KEY)
    app.state.live_limits = Limits(vad=TONES)
    return app


@pytest.fixture(scope="module")
def base(app):
    with running(app) as url:
        yield url


def connect(base, key=KEY):
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    return client.realtime.connect(model="fun-asr-nano", extra_query={"intent": "transcription"},
                                   max_retries=0)


async def receive(conn, beta=False) -> dict:
    """The next server event, validated against the SDK's types."""
    raw = json.loads(await asyncio.wait_for(conn.recv_bytes(), RECV_TIMEOUT_S))
    assert isinstance(raw["event_id"], str) and raw["event_id"]
    if beta and raw["type"] in BETA_EVENTS:
        BETA_EVENTS[raw["type"]].model_validate(raw)
    else:
        GA_EVENT.validate_python(raw)
    return raw


async def until(conn, kind: str, count: int = 1, beta=False, limit: int = 400) -> list[dict]:
    """Events up to and including the count-th of type `kind` (at most `limit` events)."""
    events = []
    for _ in range(limit):
        events.append(await receive(conn, beta))
        if sum(e["type"] == kind for e in events) == count:
            return events
    raise AssertionError(f"{count} {kind} events did not arrive within {limit} events")


def pcm16(wave) -> bytes:
    return (np.clip(wave, -1, 32767 / 32768) * 32768).astype("<i2").tobytes()


def at_16k(data: bytes):
    """The 16 kHz audio the server makes of 24 kHz PCM16 bytes."""
    return soxr.resample(np.frombuffer(data, "<i2").astype(np.float32) / 32768.0, 24000, 16000, "HQ")


async def append(conn, data: bytes, chunk: int = 4800):
    for i in range(0, len(data), chunk):
        await conn.input_audio_buffer.append(audio=base64.b64encode(data[i:i + chunk]).decode())


def ga_session(turn_detection) -> dict:
    return {"type": "transcription",
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                "transcription": {"model": "fun-asr-nano", "language": "en"},
                                "turn_detection": turn_detection}}}


def clip_24k():
    clip, _ = utterances_clip()
    return pcm16(soxr.resample(clip, 16000, 24000, "HQ"))


def of(events, kind):
    return [e for e in events if e["type"] == kind]


def check_finals(events, fast_model, audio_of, **options):
    """Each completed transcript is Model.transcribe of its item's audio with the session's options
    (`options`, language "en" unless given); its deltas spell a prefix of it."""
    options = {"language": "en", **options}
    for done in of(events, "conversation.item.input_audio_transcription.completed"):
        expected = fast_model.transcribe(audio_of(done["item_id"]), sample_rate=16000, **options)
        assert done["transcript"] == expected.text and done["content_index"] == 0
        deltas = "".join(e["delta"] for e in of(events, "conversation.item.input_audio_transcription.delta")
                         if e["item_id"] == done["item_id"])
        assert expected.text.startswith(deltas) and done["usage"]["type"] == "duration"


def test_server_vad_three_utterances(app, base, fast_model):
    # the tiny model's partials are noise; finals are exact
    app.state.live_limits = Limits(partials=False, vad=TONES)
    data = clip_24k()
    wave = at_16k(data)

    async def run():
        async with connect(base) as conn:
            created = await receive(conn)
            assert created["type"] == "session.created" and created["session"]["type"] == "transcription"
            await conn.session.update(session=ga_session({"type": "server_vad", "silence_duration_ms": 500}))
            updated = await receive(conn)
            assert updated["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 500
            await append(conn, data)
            return await until(conn, "conversation.item.done", 3)

    events = asyncio.run(run())
    started = {e["item_id"]: e["audio_start_ms"] for e in of(events, "input_audio_buffer.speech_started")}
    stopped = {e["item_id"]: e["audio_end_ms"] for e in of(events, "input_audio_buffer.speech_stopped")}
    committed = of(events, "input_audio_buffer.committed")
    assert list(started) == list(stopped) == [e["item_id"] for e in committed]
    assert [e["previous_item_id"] for e in committed] == [None] + [e["item_id"] for e in committed[:-1]]
    assert [e["item"]["id"] for e in of(events, "conversation.item.added")] == list(started)
    check_finals(events, fast_model, lambda item: wave[started[item] * 16:stopped[item] * 16])


def test_manual_commits_and_an_empty_commit(app, base, fast_model):
    app.state.live_limits = Limits(vad=TONES)
    data = clip_24k()
    cut = len(data) // 2 // 2 * 2

    async def run():
        async with connect(base) as conn:
            await receive(conn)
            session = ga_session(None)
            transcription = session["audio"]["input"]["transcription"]
            transcription.update(prompt="A talk about numba.", keywords=["nanoasr"])
            await conn.session.update(session=session)
            updated = (await receive(conn))["session"]["audio"]["input"]
            assert updated["turn_detection"] is None and updated["transcription"]["keywords"] == ["nanoasr"]
            await conn.input_audio_buffer.commit(event_id="evt_empty")
            refused = await receive(conn)
            await append(conn, data[:cut])
            await conn.input_audio_buffer.commit()
            first = await until(conn, "conversation.item.done")
            await append(conn, data[cut:])
            await conn.input_audio_buffer.commit()
            return refused, first, first + await until(conn, "conversation.item.done")

    refused, first, events = asyncio.run(run())
    assert refused["type"] == "error" and refused["error"]["event_id"] == "evt_empty"
    assert refused["error"]["type"] == "invalid_request_error"
    assert refused["error"]["code"] == "input_audio_buffer_commit_empty"
    assert "buffer too small. Expected at least 100ms of audio" in refused["error"]["message"]
    assert of(events, "input_audio_buffer.speech_started") == []
    items = [e["item_id"] for e in of(events, "input_audio_buffer.committed")]
    audio = dict(zip(items, (at_16k(data[:cut]), at_16k(data[cut:]))))
    check_finals(events, fast_model, audio.__getitem__, context="A talk about numba.", hotwords=["nanoasr"])
    assert len(of(events, "conversation.item.input_audio_transcription.completed")) == 2


def g711_reference():
    """Python's audioop (up to 3.12): an independent G.711 codec."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pytest.importorskip("audioop")


def test_g711_tables_match_audioop():
    audioop = g711_reference()
    every_byte = bytes(range(256))
    assert np.array_equal(G711["audio/pcmu"], np.frombuffer(audioop.ulaw2lin(every_byte, 2), "<i2"))
    assert np.array_equal(G711["audio/pcma"], np.frombuffer(audioop.alaw2lin(every_byte, 2), "<i2"))


def test_converter_is_chunk_independent_and_keeps_an_odd_byte():
    data = clip_24k()
    whole = Converter("audio/pcm")
    once = np.concatenate([whole.convert(data), whole.flush()])
    pieces = Converter("audio/pcm")
    cuts = [pieces.convert(data[i:i + 4801]) for i in range(0, len(data), 4801)]  # odd sizes split samples
    assert np.array_equal(np.concatenate(cuts + [pieces.flush()]), once)
    assert np.array_equal(once, at_16k(data))


def test_beta_session_with_mu_law(app, base, fast_model):
    app.state.live_limits = Limits(vad=TONES)
    audioop = g711_reference()
    clip, _ = utterances_clip(seeds=(6,))
    mu_law = audioop.lin2ulaw(pcm16(soxr.resample(clip, 16000, 8000, "HQ")), 2)
    expected = soxr.resample(np.frombuffer(audioop.ulaw2lin(mu_law, 2), "<i2").astype(np.float32) / 32768.0,
                             8000, 16000, "HQ")

    async def run():
        async with connect(base) as conn:
            await receive(conn)
            await conn.send({"type": "transcription_session.update",
                             "session": {"input_audio_format": "g711_ulaw", "turn_detection": None,
                                         "input_audio_transcription": {"language": "en"}}})
            updated = await receive(conn, beta=True)
            await append(conn, mu_law, 1600)
            await conn.input_audio_buffer.commit()
            completed = "conversation.item.input_audio_transcription.completed"
            return updated, await until(conn, completed, beta=True)

    updated, events = asyncio.run(run())
    assert updated["type"] == "transcription_session.updated"
    assert updated["session"]["input_audio_format"] == "g711_ulaw"
    assert updated["session"]["turn_detection"] is None
    assert [e["type"] for e in events][:2] == ["input_audio_buffer.committed", "conversation.item.created"]
    check_finals(events, fast_model, lambda item: expected)


def test_hostile_events_get_openai_errors_and_the_session_goes_on(base):
    async def run():
        async with connect(base) as conn:
            await receive(conn)
            replies = []
            big = base64.b64encode(bytes(MAX_APPEND_BYTES + 2)).decode()
            for event in ({"type": "input_audio_buffer.append", "audio": big, "event_id": "evt_big"},
                          {"type": "input_audio_buffer.append", "audio": "not base64!",
                           "event_id": "evt_b64"},
                          {"type": "response.create", "event_id": "evt_unknown"},
                          {"type": "session.update", "session": {"type": "realtime"}, "event_id": "evt_conv"},
                          {"type": "session.update", "event_id": "evt_lang",
                           "session": {"type": "transcription",
                                       "audio": {"input": {"transcription": {"language": "xx"}}}}}):
                await conn.send(event)
                replies.append(await receive(conn))
            await conn.input_audio_buffer.clear()
            replies.append(await receive(conn))
            return replies

    replies = asyncio.run(run())
    assert [r["type"] for r in replies] == ["error"] * 5 + ["input_audio_buffer.cleared"]
    assert [r["error"]["event_id"] for r in replies[:5]] == ["evt_big", "evt_b64", "evt_unknown", "evt_conv",
                                                             "evt_lang"]
    assert [r["error"]["code"] for r in replies[:3]] == ["audio_too_large", "invalid_base64", "invalid_event"]
    assert replies[3]["error"]["param"] == "session.type"
    assert replies[4]["error"]["param"] == "session.audio.input.transcription.language"


def test_raw_frames_that_are_not_events(base):
    async def run():
        url = base.replace("http", "ws") + "/v1/realtime?intent=transcription"
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            replies = []
            for frame in (b"\x00\x01", "{not json", "[1, 2]"):
                await ws.send(frame)
                replies.append(json.loads(await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S)))
            return replies

    replies = asyncio.run(run())
    assert [r["error"]["code"] for r in replies] == ["invalid_message", "invalid_json", "invalid_event"]
    for reply in replies:
        GA_EVENT.validate_python(reply)


@pytest.mark.parametrize("key, query, status", [("sk-wrong", {"intent": "transcription"}, 401),
                                                (KEY, {}, 400)])
def test_refused_handshakes(base, key, query, status):
    async def run():
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
        async with client.realtime.connect(model="fun-asr-nano", extra_query=query, max_retries=0) as conn:
            await conn.recv_bytes()

    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        asyncio.run(run())
    assert refused.value.response.status_code == status
    body = json.loads(refused.value.response.body)
    assert body["error"]["type"] == "invalid_request_error"


def test_partials_arrive_while_the_speaker_goes_on(app, base, fast_model):
    # partials even when the loaded test machine lags
    app.state.live_limits = Limits(catch_up_s=30.0, vad=TONES)
    clip, _ = utterances_clip(seeds=(9,))
    speech = clip[:int(2.2 * 16000)]  # quiet, 1 s of speech, then quiet up to the commit
    data = pcm16(soxr.resample(speech, 16000, 24000, "HQ"))

    async def run():
        async with connect(base) as conn:
            await receive(conn)
            await conn.session.update(session=ga_session({"type": "server_vad"}))
            await receive(conn)
            for i in range(0, len(data), 4800):  # 100 ms chunks, paced as live: the session keeps up
                await conn.input_audio_buffer.append(audio=base64.b64encode(data[i:i + 4800]).decode())
                await asyncio.sleep(0.1)
            await conn.input_audio_buffer.commit()  # before the 2 s of the silence schedule pass
            return await until(conn, "conversation.item.done")

    events = asyncio.run(run())
    kinds = [e["type"] for e in events]
    assert "input_audio_buffer.speech_stopped" not in kinds  # the commit ended it
    first_delta = kinds.index("conversation.item.input_audio_transcription.delta")
    assert first_delta < kinds.index("input_audio_buffer.committed")
    (started,) = of(events, "input_audio_buffer.speech_started")
    (done,) = of(events, "conversation.item.input_audio_transcription.completed")
    expected = fast_model.transcribe(at_16k(data)[started["audio_start_ms"] * 16:], sample_rate=16000,
                                     language="en")
    assert done["transcript"] == expected.text


async def slots_free(app, seconds: float = 5.0):
    """Waits (at most `seconds`) until the server has handled the closes and every queue slot is free."""
    for _ in range(int(seconds / 0.05)):
        if app.state.service.queue.pending == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{app.state.service.queue.pending} queue slots still held")


def test_sessions_hold_queue_slots_and_give_them_back(fast_model):
    app = create_app(fast_model, max_queue=2)

    async def run(base):
        async with connect(base) as first, connect(base) as second:
            await receive(first)
            await receive(second)
            with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
                async with connect(base) as third:
                    await third.recv_bytes()
            assert refused.value.response.status_code == 503
        await slots_free(app)
        async with connect(base) as again:
            return await receive(again)

    with running(app) as base:
        assert asyncio.run(run(base))["type"] == "session.created"


def test_a_silent_client_is_closed_and_its_slot_returned(fast_model, monkeypatch):
    monkeypatch.setattr(server_realtime, "IDLE_TIMEOUT_S", 0.5)
    app = create_app(fast_model, max_queue=1)
    clip, _ = utterances_clip(seeds=(2,), gap_s=0.2)

    async def run(base):
        async with connect(base) as conn:
            await receive(conn)
            await conn.session.update(session=ga_session(None))
            await append(conn, pcm16(soxr.resample(clip, 16000, 24000, "HQ")))
            await conn.input_audio_buffer.commit()  # its final takes longer than the idle limit: not idle
            events = await until(conn, "conversation.item.done")
            assert of(events, "error") == []
            ended = await receive(conn)  # then nothing is sent: the idle limit passes
            with pytest.raises(websockets.exceptions.ConnectionClosedOK):
                await asyncio.wait_for(conn.recv_bytes(), RECV_TIMEOUT_S)
        await slots_free(app)
        async with connect(base) as again:  # the one slot is free again
            return ended, await receive(again)

    with running(app) as base:
        ended, created = asyncio.run(run(base))
    assert ended["error"]["code"] == "session_idle" and created["type"] == "session.created"


def test_a_session_that_stays_behind_is_ended(fast_model, monkeypatch):
    """A session whose backlog stays full (its socket unread) for MAX_BEHIND_S gets `session_behind`, then a
    normal close, and its slot back."""
    monkeypatch.setattr(server_realtime, "MAX_BACKLOG_S", 0.2)
    monkeypatch.setattr(server_realtime, "MAX_BEHIND_S", 0.5)
    stuck, feed = threading.Event(), server_realtime.LiveSession.feed

    def slow_feed(self, samples, partial=True):  # decoding that never keeps up, until the test ends
        stuck.wait(RECV_TIMEOUT_S)
        return feed(self, samples, partial)
    monkeypatch.setattr(server_realtime.LiveSession, "feed", slow_feed)
    app = create_app(fast_model, max_queue=1)
    app.state.live_limits = Limits(vad=TONES)

    async def run(base):
        async with connect(base) as conn:
            await receive(conn)
            await append(conn, pcm16(np.zeros(12000, np.float32)))  # 0.5 s: more than the backlog allows
            ended = await until(conn, "error")
            with pytest.raises(websockets.exceptions.ConnectionClosedOK):
                await asyncio.wait_for(conn.recv_bytes(), RECV_TIMEOUT_S)
        stuck.set()
        await slots_free(app)
        return ended[-1]

    try:
        with running(app) as base:
            ended = asyncio.run(run(base))
    finally:
        stuck.set()
    assert ended["error"]["code"] == "session_behind"


def test_nanoasr_serve_takes_a_full_size_append(tiny_dir, tmp_path):
    """`nanoasr serve` reads messages up to WS_MAX_BYTES (uvicorn's own limit is 16 MiB), so an append just
    over 15 MiB, 20 MiB in base64, is answered with OpenAI's error rather than a closed socket."""
    big = base64.b64encode(bytes(MAX_APPEND_BYTES + 2)).decode()

    async def run(base):
        async with connect(base) as conn:
            await receive(conn)
            await conn.send({"type": "input_audio_buffer.append", "audio": big, "event_id": "evt_big"})
            return await receive(conn)

    with serving(["--model", str(tiny_dir), "--api-key", KEY], tmp_path / "serve.log") as (_, base):
        refused = asyncio.run(run(base))
    assert refused["error"]["code"] == "audio_too_large" and refused["error"]["event_id"] == "evt_big"


def test_twenty_sessions_at_once(fast_model):
    """Twenty clients commit a quarter second of room noise each at the same time: every one gets its own
    item and the final Model.transcribe gives that audio (no speech: empty), and every slot is given back."""
    app = create_app(fast_model, max_queue=20)
    rng = np.random.default_rng(11)
    noises = [pcm16(rng.standard_normal(6000).astype(np.float32) * 1e-4) for _ in range(20)]

    async def one(base, noise):
        async with connect(base) as conn:
            await receive(conn)
            await conn.session.update(session=ga_session(None))
            await receive(conn)
            await append(conn, noise)
            await conn.input_audio_buffer.commit()
            return await until(conn, "conversation.item.done", limit=10)

    async def run(base):
        sessions = await asyncio.gather(*(one(base, noise) for noise in noises))
        await slots_free(app)
        return sessions

    with running(app) as base:
        sessions = asyncio.run(run(base))
    finals = [of(events, "conversation.item.input_audio_transcription.completed")[0] for events in sessions]
    assert len({f["item_id"] for f in finals}) == 20
    for noise, final in zip(noises, finals):
        expected = fast_model.transcribe(at_16k(noise), sample_rate=16000, language="en")
        assert final["transcript"] == expected.text


def test_a_client_that_stops_reading_is_given_up(fast_model):
    """A client floods the server with events that each get an error reply and never reads: once the
    socket's buffers are full the server's sends wait, the client answers no keepalive ping either, and the
    server's WebSocket keepalive (uvicorn's default: a ping every 20 s, 20 s to answer) ends the session and
    frees its slot; another session is then served."""
    app = create_app(fast_model, max_queue=1)
    junk = json.dumps({"type": "x" * 60, "event_id": "e" * 300})

    async def flood(url):
        async with websockets.connect(url, max_queue=1) as ws:
            for _ in range(200_000):  # bounded; the server gives up long before
                try:
                    await asyncio.wait_for(ws.send(junk), 2.0)
                except (asyncio.TimeoutError, websockets.exceptions.ConnectionClosed):
                    break
            await slots_free(app, seconds=60)

    async def run(base):
        await flood(base.replace("http", "ws") + "/v1/realtime?intent=transcription")
        async with connect(base) as other:
            return await receive(other)

    with running(app) as base:
        assert asyncio.run(run(base))["type"] == "session.created"
