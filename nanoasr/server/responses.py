"""The transcript as a response: json, text, srt, vtt or verbose_json, or server-sent events that carry the
text as the decoder settles it, then the whole text (or an error)."""

import asyncio
import gzip
import json

from nanoasr.server.errors import ApiError, internal_error

MEDIA_TYPES = {"text": "text/plain; charset=utf-8", "srt": "application/x-subrip; charset=utf-8",
               "vtt": "text/vtt; charset=utf-8"}


def transcript_response(transcript, response_format: str, granularities=()):
    from fastapi.responses import JSONResponse, PlainTextResponse

    from nanoasr import writers

    if response_format == "json":
        return JSONResponse({"text": transcript.text})
    if response_format == "verbose_json":
        return JSONResponse(verbose_json(transcript, granularities))
    body = transcript.text if response_format == "text" else writers.render(transcript, response_format)
    return PlainTextResponse(body, media_type=MEDIA_TYPES[response_format])


def verbose_json(transcript, granularities=()) -> dict:
    """OpenAI's TranscriptionVerbose: `segments` unless only 'word' was asked for; `words` with 'word'."""
    from nanoasr.api import language_name

    segments = [
        {"id": i, "seek": int(round(s.start * 100)), "start": s.start, "end": s.end, "text": s.text,
         "tokens": list(s.token_ids), "temperature": 0.0, "avg_logprob": s.avg_logprob,
         "compression_ratio": compression_ratio(s.text), "no_speech_prob": 0.0}
        for i, s in enumerate(x for x in transcript.segments if x.text)
    ]
    language = language_name(transcript.language) if transcript.language else "auto"
    out = {"task": "transcribe", "language": language, "duration": transcript.duration_s,
           "text": transcript.text}
    if granularities != ("word",):
        out["segments"] = segments
    if "word" in granularities:
        out["words"] = [{"word": w.word, "start": w.start, "end": w.end}
                        for s in transcript.segments for w in s.words or ()]
    return dict(out, usage={"type": "duration", "seconds": transcript.duration_s})


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(gzip.compress(data)) if data else 0.0


class TextEvents:
    """The worker thread's callbacks (Model.transcribe's on_segment and on_partial): the text that each
    finished segment, or the settled tokens of the earliest unfinished one, add to the joined transcript
    goes out as a transcript.text.delta event; `started` is set at the first text, or the first finished
    segment."""

    def __init__(self, loop, events: asyncio.Queue, started: asyncio.Future):
        self.loop, self.events, self.started = loop, events, started
        self.finished = ""  # the finished segments' texts, joined
        self.sent = ""  # the deltas sent so far, joined: always a prefix of the final text

    def on_segment(self, segment) -> None:
        from nanoasr.api import join_texts

        self.finished = join_texts([self.finished, segment.text])
        self._send(self.finished)
        self.loop.call_soon_threadsafe(settle, self.started)

    def on_partial(self, segment) -> None:
        from nanoasr.api import join_texts

        self._send(join_texts([self.finished, segment.text]))  # joining adds one text at a time

    def _send(self, joined: str) -> None:
        delta, self.sent = joined[len(self.sent):], joined
        if delta:
            self.loop.call_soon_threadsafe(self.events.put_nowait,
                                           {"type": "transcript.text.delta", "delta": delta})
            self.loop.call_soon_threadsafe(settle, self.started)


def settle(future: asyncio.Future) -> None:
    if not future.done():  # set once; a request cancelled while waiting leaves it cancelled
        future.set_result(None)


async def stream_events(events: asyncio.Queue, job: asyncio.Future):
    """SSE: a delta as text becomes final, then transcript.text.done (or an error event)."""
    while not (job.done() and events.empty()):
        getter = asyncio.ensure_future(events.get())
        done, _ = await asyncio.wait({getter, job}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            yield sse(getter.result())
        else:
            getter.cancel()
    try:
        final = {"type": "transcript.text.done", "text": job.result().text}
    except ApiError as err:
        final = {"type": "error", **err.body()}
    except Exception as exc:
        final = {"type": "error", **internal_error(exc).body()}
    yield sse(final)


def sse(event: dict) -> str:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"


async def event_stream_response(service, form, options):
    """SSE, answered once decoding gives its first text: a failure before it (bad audio, a prompt over the
    token limit) gets its own status code, as without streaming."""
    from fastapi.responses import StreamingResponse

    loop = asyncio.get_running_loop()
    events, started = asyncio.Queue(), loop.create_future()
    job = service.start(form, options, TextEvents(loop, events, started))
    await asyncio.wait({started, job}, return_when=asyncio.FIRST_COMPLETED)
    if not started.done():
        job.result()  # the job ended with no segment: a failure raises here, before anything was sent
    return StreamingResponse(stream_events(events, job), media_type="text/event-stream")
