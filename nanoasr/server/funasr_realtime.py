"""`/funasr/realtime`: the protocol of FunASR's Fun-ASR-Nano realtime server (funasr/bin/realtime_ws.py), for
clients written against it, on the same live sessions, queue and worker as /v1/realtime.

The client sends text commands and binary PCM16 (16 kHz, mono, little-endian): `START` begins a session (the
stream's clock starts at 0), `LANGUAGE:xx` and `HOTWORDS:a,b` set the language and hotwords, `COMMIT` ends the
utterance under way, `STOP` ends the session with a final result; audio before `START` is ignored. Each
answer is an event (`{"event": "started" | "language_set" | "hotwords_set" | "stopped" | "error", ...}`) or a
result: `{"sentences": [{"text", "start", "end"}], "partial", "partial_start_ms", "duration_ms",
"is_final"}`, where `sentences` are the finished utterances of the session (times in ms; empty texts left
out, the last MAX_SENTENCES kept), `partial` the text of the utterance under way that its partials agree on,
and `is_final` marks the answer to COMMIT and STOP.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from fastapi import APIRouter, WebSocket

from nanoasr.errors import OptionError
from nanoasr.realtime import Committed, Completed, Delta, SpeechStarted
from nanoasr.server.realtime import MAX_APPEND_BYTES, MIB, Connection, open_session

FUNASR_REALTIME = "/funasr/realtime"
MAX_SENTENCES = 1000  # a session's finished utterances kept (and sent with every result)
router = APIRouter()


@router.websocket(FUNASR_REALTIME)
async def funasr_realtime(websocket: WebSocket):
    await open_session(websocket, FunAsrConnection)


class FunAsrConnection(Connection):
    """FunASR's commands and results over the OpenAI route's machinery (backlog, worker, limits)."""

    def __init__(self, websocket, service, limits):
        super().__init__(websocket, service, limits)
        self.active = False
        self.odd = b""  # a PCM16 byte that waits for its pair
        self.sentences: list[dict] = []
        self.spans: dict[int, tuple[int, int]] = {}  # item -> (start, end) ms, once committed
        self.partial, self.partial_start = "", None

    async def greet(self) -> None:
        """FunASR's server says nothing until START."""

    async def on_binary(self, data: bytes) -> None:
        if not self.active:
            return
        if len(data) > MAX_APPEND_BYTES:
            await self.error(f"a message carries at most {MAX_APPEND_BYTES // MIB} MiB of audio; got "
                             f"{len(data) / MIB:.1f} MiB", None, None, None)
            return
        data, self.odd = self.odd + data, b""
        if len(data) % 2:
            data, self.odd = data[:-1], data[-1:]
        await self._queue_audio(np.frombuffer(data, "<i2").astype(np.float32) / 32768.0)

    async def handle(self, text: str) -> None:
        command = text.strip()
        name, _, value = command.partition(":")
        name = name.upper()
        if command.upper() == "START":
            await self._start()
        elif name == "LANGUAGE":
            language = value.strip()
            await self._set("language", language or None, {"event": "language_set", "language": language})
        elif name == "HOTWORDS":
            words = tuple(w.strip() for w in value.split(",") if w.strip())
            await self._set("keywords", words, {"event": "hotwords_set", "hotwords": list(words)})
        elif command.upper() == "COMMIT":
            await self._when_active(("commit", None, None))
        elif command.upper() == "STOP":
            if self.active:
                self.active = False
                await self.ops.put(("finish", None, None))
            else:
                await self.send_json({"event": "stopped"})
        else:
            await self.error(f"unknown command {command[:40]!r}; accepted: START, LANGUAGE:, HOTWORDS:, "
                             "COMMIT, STOP, and binary PCM16", None, None, None)

    async def _start(self) -> None:
        self.active, self.odd, self.sentences, self.spans = True, b"", [], {}
        self.partial, self.partial_start = "", None
        await self.ops.put(("update", (self.config, self.options, False, 0), None))  # the clock starts at 0
        await self.send_json({"event": "started"})

    async def _set(self, field: str, value, answer: dict) -> None:
        config = dataclasses.replace(self.config, **{field: value})
        try:
            options = config.options(self.service.model)
        except OptionError as exc:
            await self.error(str(exc), None, None, None)
            return
        self.config = config
        await self.ops.put(("update", (config, options, False), None))
        await self.send_json(answer)

    async def _when_active(self, op) -> None:
        if not self.active:
            await self.error("Session is not active; send START first", None, None, None)
        else:
            await self.ops.put(op)

    async def confirm_update(self, config, beta: bool) -> None:
        """Commands are answered when they arrive, as FunASR's server does."""

    async def refused_commit(self, exc, event_id) -> None:
        await self.send_json(self.result(final=True))  # nothing to commit: the result as it stands

    async def error(self, message: str, param, code, event_id, type_: str = "invalid_request_error") -> None:
        await self.send_json({"event": "error", "error": message})

    async def send_json(self, message: dict) -> None:
        await self.ws.send_json(message)

    async def deliver(self, events: list, kind: str) -> None:
        for event in events:
            self.note(event)
        final = kind in ("commit", "finish")
        if final or any(isinstance(e, (Delta, Completed)) for e in events):
            await self.send_json(self.result(final))
        if kind == "finish":
            await self.send_json({"event": "stopped"})

    def note(self, event) -> None:
        """Keep what a result shows: finished sentences, and the agreed text of the utterance under way."""
        if isinstance(event, SpeechStarted):
            self.partial, self.partial_start = "", event.audio_start_ms
        elif isinstance(event, Committed):
            self.spans[event.item] = event.audio_start_ms, event.audio_end_ms
        elif isinstance(event, Delta):
            self.partial += event.text
        elif isinstance(event, Completed):
            start, end = self.spans.pop(event.item)
            if event.transcript.strip():
                sentence = {"text": event.transcript, "start": start, "end": end}
                self.sentences = (self.sentences + [sentence])[-MAX_SENTENCES:]
            self.partial, self.partial_start = "", None

    def result(self, final: bool) -> dict:
        duration = self.live.stream_ms
        if final:
            return {"sentences": self.sentences, "partial": "", "partial_start_ms": 0,
                    "duration_ms": duration, "is_final": True}
        start = self.partial_start if self.partial_start is not None else duration
        return {"sentences": self.sentences, "partial": self.partial, "partial_start_ms": start,
                "duration_ms": duration, "is_final": False}
