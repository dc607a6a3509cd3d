"""`/v1/realtime?intent=transcription`: OpenAI's Realtime API in transcription mode over a WebSocket, on the
server's one model (nanoasr.realtime.LiveSession does the listening; live_config.py reads the session
settings; live_audio.py converts the audio).

A connection holds one slot of the server's queue while it is open (so sessions and uploads together stay
within --max-queue) and runs its session on the server's session threads (Service.live); the session's
decodes go to the server's DecodeScheduler, which decodes the sessions' partials and finals together on the
worker thread, in turn with the HTTP requests. A partial decodes there while the session goes on listening
(LiveSession.next_partial), at most one per session at a time, so an endpoint heard meanwhile cancels it and
its final does not wait for it. Audio waits in the connection's backlog while the session is busy; the
backlog is fed to the session at once when it is free (so a session that falls behind gets fewer partials,
not a queue of them, and none while more than Limits.catch_up_s of audio waits; the scheduler drops a
partial it has no room for), and past MAX_BACKLOG_S the connection stops reading the socket until
the session catches up (TCP holds the client back). A session whose socket stays unread for MAX_BEHIND_S is
ended with an `error` (session_behind).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
import uuid

import numpy as np
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from nanoasr.audio import SAMPLE_RATE
from nanoasr.errors import AudioError, OptionError
from nanoasr.realtime import (Committed, Completed, Delta, Failed, Limits, LiveSession, PartialJob,
                              SpeechStarted, SpeechStopped)
from nanoasr.server.errors import ApiError
from nanoasr.server.live_audio import Converter
from nanoasr.server.live_config import ClientError, SessionConfig, updated_beta, updated_ga

REALTIME = "/v1/realtime"
MIB = 1024 * 1024
MAX_APPEND_BYTES = 15 * MIB  # OpenAI's limit on one append's audio
WS_MAX_BYTES = 24 * MIB  # one message: a 15 MiB append in base64 fits; a longer one closes the socket (1009)
MAX_BACKLOG_S = 30.0  # audio received and not yet decoded, at most, before the socket is no longer read
MAX_BEHIND_S = 120.0  # a session whose socket is not read for this long (its backlog full) is ended
IDLE_TIMEOUT_S = 120.0  # a session with no client event for this long is closed: it holds a queue slot
MAX_SESSION_S = 3600.0  # OpenAI's longest session, 60 minutes
log = logging.getLogger(__name__)
router = APIRouter()


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:22]}"


def client_event_id(event) -> str | None:
    """The client's own id of an event, named back in errors about it (a string, or none)."""
    event_id = event.get("event_id") if isinstance(event, dict) else None
    return event_id if isinstance(event_id, str) else None


@router.websocket(REALTIME)
async def realtime(websocket: WebSocket):
    await open_session(websocket, Connection, intent="transcription")


async def open_session(websocket: WebSocket, connection, intent: str | None = None) -> None:
    """Checks the handshake, holds a queue slot, and runs `connection(websocket, service, limits)` to its
    end."""
    service = websocket.app.state.service
    refusal = _refusal(websocket, service.api_key, intent)
    if refusal is None:
        try:
            service.queue.admit_job()
        except ApiError as exc:
            refusal = exc
    if refusal is not None:
        await _deny(websocket, refusal)
        return
    try:
        offered = websocket.scope.get("subprotocols", [])
        await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
        await connection(websocket, service, getattr(websocket.app.state, "live_limits", Limits())).run()
    finally:
        service.queue.leave()


def _refusal(websocket: WebSocket, api_key: str | None, intent: str | None) -> ApiError | None:
    """Why the handshake is refused (a key the HTTP routes would refuse, another intent), or None."""
    if api_key is not None:
        offered = websocket.scope.get("subprotocols", [])
        if (websocket.headers.get("authorization", "") != f"Bearer {api_key}"
                and f"openai-insecure-api-key.{api_key}" not in offered):
            return ApiError(401, "Incorrect or missing API key", code="invalid_api_key")
    if intent is not None and websocket.query_params.get("intent") != intent:
        return ApiError(400, f"this server runs {intent} sessions only: connect to "
                             f"{websocket.url.path}?intent={intent}", param="intent", code="invalid_intent")
    return None


async def _deny(websocket: WebSocket, err: ApiError) -> None:
    """An HTTP response with OpenAI's error body where the server can send one, else a policy close."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        from fastapi.responses import JSONResponse

        await websocket.send_denial_response(JSONResponse(err.body(), status_code=err.status))
    else:
        await websocket.close(code=1008, reason=err.message[:120])


def _listen(live: LiveSession, samples, decode: bool) -> tuple[list, PartialJob | None]:
    """Feed `samples` to the session (on its thread): its events, and the partial due when `decode`."""
    events = live.feed(samples, partial=False)
    return events, live.next_partial() if decode else None


class Connection:
    """One WebSocket: reads client events, feeds the LiveSession on its thread, sends OpenAI's events."""

    def __init__(self, websocket: WebSocket, service, limits: Limits):
        self.ws, self.service, self.limits = websocket, service, limits
        self.session_id = new_id("sess")
        self.config = SessionConfig()
        self.converter = Converter(self.config.format)
        self.options = self.config.options(service.model)
        self.live = LiveSession(service.model, self.options, self.config.turn_detection, limits,
                                scheduler=service.scheduler)
        self.beta = False  # the client spoke the beta shape: items are announced as conversation.item.created
        self.ops: asyncio.Queue = asyncio.Queue()  # (kind, payload, client event id), in arrival order
        self.held = None  # an op taken out of the queue while gathering audio, run next
        self.backlog = 0  # samples received and not yet fed
        self.caught_up = asyncio.Event()
        self.caught_up.set()
        self.generation = 0  # LiveSessions replaced by session updates; their items get their own ids
        self.item_ids: dict[tuple[int, int], str] = {}
        self.last_item_id: str | None = None
        self.previous_of: dict[str, str | None] = {}  # item id -> the item committed before it
        self.working = False  # the pump has work in hand or queued
        self.partials: set[PartialJob] = set()  # decoding on the scheduler, their answers not taken yet

    async def greet(self) -> None:
        await self.send({"type": "session.created", "session": self.config.ga(self.session_id)})

    async def run(self) -> None:
        await self.greet()
        tasks = [asyncio.create_task(self.receive()), asyncio.create_task(self.pump())]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for job in self.partials:  # nobody will read them
            job.cancelled.set()
        failure = next((t.exception() for t in done if t.exception() is not None), None)
        if failure is not None and not isinstance(failure, (WebSocketDisconnect, OSError)):
            # a fault of the server's (not a client that left): the client is told, and the socket closed
            log.error("realtime session %s failed", self.session_id, exc_info=failure)
            await self._close_after(self.error(f"internal error: {type(failure).__name__}", None,
                                               "internal_error", None, "server_error"))

    async def _close_after(self, sending) -> None:
        try:
            await sending
            await self.ws.close(code=1011)
        except (WebSocketDisconnect, RuntimeError):  # the client is gone already
            pass

    async def receive(self) -> None:
        """Client events until the client goes, falls silent or reaches the session's time limit; reading
        pauses while the backlog is full."""
        opened = time.monotonic()
        while True:
            try:
                await asyncio.wait_for(self.caught_up.wait(), MAX_BEHIND_S)
            except asyncio.TimeoutError:
                await self._end(f"the session fell behind real time: more than {MAX_BACKLOG_S:g} s of audio "
                                f"waited to be decoded for {MAX_BEHIND_S:g} s", "session_behind")
                return
            try:
                message = await asyncio.wait_for(self.ws.receive(), IDLE_TIMEOUT_S)
            except asyncio.TimeoutError:
                if self.working:  # the client waits for its transcripts: not idle
                    continue
                await self._end(f"no event for {IDLE_TIMEOUT_S:g} s: the session is closed", "session_idle")
                return
            if message["type"] == "websocket.disconnect":
                return
            if time.monotonic() - opened > MAX_SESSION_S:
                await self._end(f"the session reached its limit of {MAX_SESSION_S / 60:g} minutes",
                                "session_expired")
                return
            if message.get("text") is None:
                await self.on_binary(message.get("bytes") or b"")
                continue
            await self.handle(message["text"])

    async def on_binary(self, data: bytes) -> None:
        await self.error("binary frames are not part of the protocol: send JSON text events", None,
                         "invalid_message", None)

    async def _end(self, message: str, code: str) -> None:
        """The server ends the session: an error event, then a normal close."""
        await self.error(message, None, code, None)
        await self.ws.close(code=1000)

    async def handle(self, text: str) -> None:
        try:
            event = json.loads(text)
        except ValueError as exc:
            await self.error(f"the event is not valid JSON: {exc}", None, "invalid_json", None)
            return
        event_id = client_event_id(event)
        try:
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise ClientError("an event must be a JSON object with a string `type`", "type",
                                  "invalid_event")
            handler = HANDLERS.get(event["type"])
            if handler is None:
                raise ClientError(f"unknown event type {event['type'][:64]!r} for a transcription session; "
                                  f"accepted: {', '.join(HANDLERS)}", "type", "invalid_event")
            await handler(self, event)
        except ClientError as exc:
            await self.error(exc.message, exc.param, exc.code, event_id)

    async def send(self, event: dict) -> None:
        await self.ws.send_text(json.dumps({"event_id": new_id("event"), **event}, ensure_ascii=False))

    async def error(self, message: str, param, code, event_id, type_: str = "invalid_request_error") -> None:
        await self.send({"type": "error", "error": {"type": type_, "code": code, "message": message,
                                                    "param": param, "event_id": event_id}})

    # --- client events -----------------------------------------------------------------------------------

    async def session_update(self, event: dict) -> None:
        await self._update(updated_ga(self.config, event.get("session")), beta=False)

    async def transcription_session_update(self, event: dict) -> None:
        await self._update(updated_beta(self.config, event.get("session")), beta=True)

    async def _update(self, config: SessionConfig, beta: bool) -> None:
        try:
            options = config.options(self.service.model)
        except OptionError as exc:
            field = {"language": "language", "context": "prompt", "hotwords": "keywords"}.get(exc.field)
            where = "session.input_audio_transcription" if beta else "session.audio.input.transcription"
            raise ClientError(str(exc), f"{where}.{field}" if field else None) from None
        if config.format != self.config.format:
            self.converter = Converter(config.format)
        self.config, self.beta = config, beta
        await self.ops.put(("update", (config, options, beta), None))

    async def append(self, event: dict) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise ClientError("input_audio_buffer.append needs `audio`, a base64 string", "audio")
        if len(audio) // 4 * 3 > MAX_APPEND_BYTES + 2:  # refused before it is decoded
            raise ClientError(f"an append carries at most {MAX_APPEND_BYTES // MIB} MiB of audio; got about "
                              f"{len(audio) // 4 * 3 / MIB:.1f} MiB", "audio", "audio_too_large")
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise ClientError("`audio` is not valid base64", "audio", "invalid_base64") from None
        if len(data) > MAX_APPEND_BYTES:
            raise ClientError(f"an append carries at most {MAX_APPEND_BYTES // MIB} MiB of audio; got "
                              f"{len(data) / MIB:.1f} MiB", "audio", "audio_too_large")
        await self._queue_audio(self.converter.convert(data))

    async def commit(self, event: dict) -> None:
        await self._queue_audio(self.converter.flush())  # the committed buffer holds every sample sent
        await self.ops.put(("commit", None, client_event_id(event)))

    async def clear(self, event: dict) -> None:
        self.converter.flush()
        await self.ops.put(("clear", None, client_event_id(event)))

    async def _queue_audio(self, samples) -> None:
        if len(samples):
            self.backlog += len(samples)
            if self.backlog > MAX_BACKLOG_S * SAMPLE_RATE:
                self.caught_up.clear()
            await self.ops.put(("audio", samples, None))

    # --- the session, on its thread ------------------------------------------------------------------------

    async def pump(self) -> None:
        """Runs the queued work in order, each step on the session's thread; audio waiting together is fed at
        once."""
        while True:
            self.working = self.held is not None or not self.ops.empty() or bool(self.partials)
            kind, payload, event_id = await self._next()
            self.working = True
            try:
                events = await self._step(kind, payload)
            except AudioError as exc:  # a commit of too little audio
                await self.refused_commit(exc, event_id)
                continue
            await self.deliver(events, kind)

    async def _step(self, kind: str, payload) -> list:
        """One op on the session: its events."""
        if kind == "audio":
            behind = len(payload) > self.limits.catch_up_s * SAMPLE_RATE
            live = self.live
            events, job = await self._work(_listen, live, payload, not behind)
            self.backlog -= len(payload)
            if self.backlog <= MAX_BACKLOG_S * SAMPLE_RATE:
                self.caught_up.set()
            if job is not None:
                self._decode_partial(live, job)
            return events
        if kind == "partial":
            live, job, answer = payload
            self.partials.discard(job)
            return await self._work(live.partial_answered, job, answer) if live is self.live else []
        if kind == "commit":
            return await self._work(self.live.commit)
        if kind == "finish":
            return await self._work(self.live.finish)
        if kind == "clear":
            await self._work(self.live.clear)
            return []
        return await self._replace(*payload)

    async def refused_commit(self, exc: AudioError, event_id) -> None:
        await self.error(f"Error committing input audio buffer: {exc}", None,
                         "input_audio_buffer_commit_empty", event_id)

    async def deliver(self, events: list, kind: str) -> None:
        """The session's events after an op of `kind`, as this protocol's messages."""
        if kind == "clear":
            await self.send({"type": "input_audio_buffer.cleared"})
        for event in events:
            for message in self.translate(event):
                await self.send(message)

    async def _next(self):
        op = self.held or await self.ops.get()
        self.held = None
        if op[0] != "audio":
            return op
        chunks = [op[1]]
        while not self.ops.empty():
            following = self.ops.get_nowait()
            if following[0] != "audio":
                self.held = following
                break
            chunks.append(following[1])
        return "audio", np.concatenate(chunks), None

    def _decode_partial(self, live: LiveSession, job: PartialJob) -> None:
        """Hand `job` to the scheduler; its answer comes back as a "partial" op, in turn with the others."""
        answer = live.submit_partial(job)
        self.partials.add(job)
        loop = asyncio.get_running_loop()

        def answered(_) -> None:
            try:
                loop.call_soon_threadsafe(self.ops.put_nowait, ("partial", (live, job, answer), None))
            except RuntimeError:  # the server has stopped: nobody waits for it
                pass
        answer.add_done_callback(answered)

    def _work(self, call, *args):
        return asyncio.get_running_loop().run_in_executor(self.service.live, call, *args)

    async def _replace(self, config: SessionConfig, options, beta: bool, start: int | None = None) -> list:
        """A session update: new options or turn detection start a new LiveSession at the stream's present
        sample (audio held and not committed is dropped; `start`: at that sample instead, even with the same
        settings); the format alone changes only the converter."""
        if start is not None or (options, config.turn_detection) != (self.options, self.live.turn_detection):
            at = self.live.audio.end if start is None else start
            self.live.cancel_partial()
            self.live = LiveSession(self.service.model, options, config.turn_detection, self.limits, at,
                                    self.service.scheduler)
            self.options, self.generation = options, self.generation + 1
        await self.confirm_update(config, beta)
        return []

    async def confirm_update(self, config: SessionConfig, beta: bool) -> None:
        if beta:
            await self.send({"type": "transcription_session.updated",
                             "session": config.beta(self.session_id)})
        else:
            await self.send({"type": "session.updated", "session": config.ga(self.session_id)})

    # --- server events -------------------------------------------------------------------------------------

    def item_id(self, item: int) -> str:
        return self.item_ids.setdefault((self.generation, item), new_id("item"))

    def translate(self, event) -> list[dict]:
        """A LiveSession event as OpenAI's server events."""
        item_id = self.item_id(event.item)
        if isinstance(event, SpeechStarted):
            return [{"type": "input_audio_buffer.speech_started", "audio_start_ms": event.audio_start_ms,
                     "item_id": item_id}]
        if isinstance(event, SpeechStopped):
            return [{"type": "input_audio_buffer.speech_stopped", "audio_end_ms": event.audio_end_ms,
                     "item_id": item_id}]
        if isinstance(event, Committed):
            previous, self.last_item_id = self.last_item_id, item_id
            self.previous_of[item_id] = previous
            added = "conversation.item.created" if self.beta else "conversation.item.added"
            return [{"type": "input_audio_buffer.committed", "item_id": item_id,
                     "previous_item_id": previous},
                    {"type": added, "item": user_item(item_id, None), "previous_item_id": previous}]
        if isinstance(event, Delta):
            return [{"type": "conversation.item.input_audio_transcription.delta", "item_id": item_id,
                     "content_index": 0, "delta": event.text}]
        if isinstance(event, Failed):
            return [{"type": "conversation.item.input_audio_transcription.failed", "item_id": item_id,
                     "content_index": 0, "error": {"type": "server_error", "code": "transcription_failed",
                                                   "message": event.message, "param": None}}]
        return self._completed(item_id, event)

    def _completed(self, item_id: str, event: Completed) -> list[dict]:
        out = [{"type": "conversation.item.input_audio_transcription.completed", "item_id": item_id,
                "content_index": 0, "transcript": event.transcript,
                "usage": {"type": "duration", "seconds": round(event.seconds, 3)}}]
        if not self.beta:
            out.append({"type": "conversation.item.done", "item": user_item(item_id, event.transcript),
                        "previous_item_id": self.previous_of.pop(item_id, None)})
        return out


def user_item(item_id: str, transcript: str | None) -> dict:
    """The conversation item of one utterance: a user message holding its audio (not sent back)."""
    return {"id": item_id, "type": "message", "role": "user", "object": "realtime.item",
            "status": "completed", "content": [{"type": "input_audio", "transcript": transcript}]}


HANDLERS = {"session.update": Connection.session_update,
            "transcription_session.update": Connection.transcription_session_update,
            "input_audio_buffer.append": Connection.append,
            "input_audio_buffer.commit": Connection.commit,
            "input_audio_buffer.clear": Connection.clear}
