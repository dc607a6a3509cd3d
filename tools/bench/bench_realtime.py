"""Live transcription under load: N simulated speakers stream synthesized speech at real-time pace to
`/v1/realtime?intent=transcription` over loopback, and each event's arrival is timed.

    python tools/bench/bench_realtime.py --model MODEL [--sessions 1,2,4] [--seconds 30] [--threads 2]
                                   [--silence-ms 500] [--max-latency 1.2] [--no-draft] [--no-batch]
                                   [--tokens-per-second 4] [--partial-interval 0.48] [--json out.json]
    python tools/bench/bench_realtime.py --url ws://127.0.0.1:8000 --api-key KEY ...   (a running server)
    python tools/bench/bench_realtime.py --model MODEL --finals 5 [--threads 2] [--tokens-per-second 4]
                                                                           (final decodes alone)

Each speaker sends its own clip (utterances of 2-6 s with speech-like pauses inside, 3 s of silence after
each, so the server's VAD ends each one) as 24 kHz PCM16 in 40 ms appends, paced by the clock, with
server VAD's silence_duration_ms at --silence-ms (the end-of-speech latency includes that wait). Per
utterance: end of speech (its last loud sample) to `completed` (also over the first and the second half of
each clip: a session falling behind real time has a lag that grows), and start of speech to the first delta;
per item, the mean gap between deltas (partial cadence). With --model the server runs in this process, so its
CPU seconds and resident memory are measured and reported per session. A session count stays real time when
every utterance was completed and the p95 end-of-speech latency is within --max-latency. --no-draft serves a
model that decodes finals and partials without their drafts (the previous partial's token ids), the baseline
that draft verification is measured against. With --model each round also reports how the sessions' decodes
were batched (nanoasr.batching: decodes per batch, partials dropped); --no-batch serves a model that
decodes each of them alone, the baseline that batching is measured against.

--finals N times, instead, the final decode of N utterances (2-6 s) alone, in this process after a warm-up (as
the server has): Model.transcribe without a draft, and with its own token ids as the draft, which is what a
final gets from a last partial that read the same words (the transcript of a trained model holds still as the
audio grows; a random checkpoint's does not, so over the server its drafts are rejected early and the rounds
above show no gain from them). A random checkpoint also decodes until its token budget or repetition guard;
--tokens-per-second R caps each decode (the finals of --finals, and the served sessions' partials and finals)
at R tokens per second of its audio (max_new_tokens), a stand-in for the length of a trained model's
transcript.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.lib.synth import speech_like  # noqa: E402

SR, WIRE_RATE = 16000, 24000
APPEND_S = 0.04
LOUD = 1e-3  # above the synthesized noise floor (1e-4): speech
TAIL_S = 3.0  # silence after each utterance: longer than any silence the server's schedule waits for
QUIET_S = 2.0  # no event for this long after the clip is sent, every item completed: the session is done


def speaker_clip(seconds: float, seed: int):
    """(24 kHz PCM16 bytes, [(speech start s, speech end s)]): utterances of 2-6 s, each then TAIL_S quiet."""
    import soxr

    rng = np.random.default_rng(seed)
    parts, truth, at = [], [], 0.0
    while at < seconds:
        burst = speech_like(rng.uniform(2.0, 6.0), int(rng.integers(1 << 30)))
        loud = np.flatnonzero(np.abs(burst) > LOUD)
        truth.append((at + loud[0] / SR, at + (loud[-1] + 1) / SR))
        parts += [burst, np.zeros(int(TAIL_S * SR), np.float32)]
        at += len(burst) / SR + TAIL_S
    wave = soxr.resample(np.concatenate(parts), SR, WIRE_RATE, "HQ")
    return (np.clip(wave, -1, 32767 / 32768) * 32768).astype("<i2").tobytes(), truth


async def speak(url: str, headers: dict, clip: bytes, truth, silence_ms: int, settle_s: float) -> dict:
    """Stream `clip` at real-time pace; the arrival times of the events, relative to the first sample."""
    import websockets

    async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
        json.loads(await ws.recv())  # session.created
        vad = {"type": "server_vad", "silence_duration_ms": silence_ms}
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {"turn_detection": vad}}}}))
        arrivals: list[tuple[float, dict]] = []
        start, sent = time.monotonic(), asyncio.Event()
        reader = asyncio.create_task(_read(ws, arrivals, start, sent, truth[-1][1]))
        step = int(APPEND_S * WIRE_RATE) * 2
        for k, i in enumerate(range(0, len(clip), step)):
            await asyncio.sleep(max(0.0, start + k * APPEND_S - time.monotonic()))
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(clip[i:i + step]).decode()}))
        sent.set()
        try:
            await asyncio.wait_for(reader, settle_s)  # the last finals
        except asyncio.TimeoutError:
            pass
    return {"arrivals": arrivals, "truth": truth}


async def _read(ws, arrivals: list, start: float, sent: asyncio.Event, last_end_s: float) -> None:
    """Events until the clip is sent, the server has ended an utterance at the clip's last speech
    (`last_end_s`), every item that started is completed and the server has been quiet for QUIET_S (the
    detector may split an utterance at a pause inside it, so items are not counted ahead; a session behind
    real time may be silent for longer than QUIET_S while it decodes the audio it has not answered yet)."""
    import websockets

    started = completed = 0
    heard_to = 0.0  # the latest end of an utterance the server has stopped
    while True:
        try:
            event = json.loads(await asyncio.wait_for(ws.recv(), QUIET_S))
        except asyncio.TimeoutError:
            if sent.is_set() and completed == started and heard_to >= last_end_s:
                return
            continue
        except websockets.exceptions.ConnectionClosed:  # the server ended the session: what came is kept
            return
        arrivals.append((time.monotonic() - start, event))
        started += event["type"] == "input_audio_buffer.speech_started"
        completed += event["type"] == "conversation.item.input_audio_transcription.completed"
        if event["type"] == "input_audio_buffer.speech_stopped":
            heard_to = max(heard_to, event["audio_end_ms"] / 1000)


def utterance_times(run: dict) -> list[dict]:
    """Per spoken utterance: end of speech to completed, start of speech to first delta (s), and the mean gap
    between its partial deltas (those before speech_stopped); None where there is nothing to measure."""
    stops = [(t, e) for t, e in run["arrivals"] if e["type"] == "input_audio_buffer.speech_stopped"]
    stopped = {e["item_id"]: e["audio_end_ms"] / 1000 for _, e in stops}
    stopped_at = {e["item_id"]: t for t, e in stops}
    done = {e["item_id"]: t for t, e in run["arrivals"]
            if e["type"] == "conversation.item.input_audio_transcription.completed"}
    deltas: dict[str, list[float]] = {}
    for t, e in run["arrivals"]:
        if e["type"] == "conversation.item.input_audio_transcription.delta":
            deltas.setdefault(e["item_id"], []).append(t)
    out = []
    for start, end in run["truth"]:
        item = min(stopped, key=lambda i: abs(stopped[i] - end), default=None)
        if item is None or abs(stopped[item] - end) > 1.0:
            out.append({"latency": None, "first_delta": None, "cadence": None})
            continue
        times = deltas.get(item, [])
        gaps = np.diff([t for t in times if t < stopped_at[item]])  # the partials, not the final's remainder
        out.append({"latency": done[item] - end if item in done else None,
                    "first_delta": times[0] - start if times else None,
                    "cadence": float(gaps.mean()) if len(gaps) else None})
    return out


def percentiles(values) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"p50": None, "p95": None, "n": 0}
    p50, p95 = (round(float(np.percentile(values, q)), 3) for q in (50, 95))
    return {"p50": p50, "p95": p95, "n": len(values)}


def summarize(runs: list[dict], audio_s: float, cpu_s, rss_mb, max_latency: float) -> dict:
    """The round's figures; `cpu_s` and `rss_mb` are the server process's (None when it runs elsewhere)."""
    per_run = [utterance_times(run) for run in runs]
    times = [u for run in per_run for u in run]
    halves = [[u for run in per_run for u in run[:len(run) // 2]],
              [u for run in per_run for u in run[len(run) // 2:]]]
    latency = percentiles(u["latency"] for u in times)
    completed = sum(u["latency"] is not None for u in times)
    real_time = completed == len(times) and latency["p95"] is not None and latency["p95"] <= max_latency
    return {"sessions": len(runs), "utterances": len(times), "completed": completed,
            "end_of_speech_to_completed_s": latency,
            # a session that keeps real time has the same latency late in its clip as early on
            "end_of_speech_to_completed_by_half_s": [percentiles(u["latency"] for u in h) for h in halves],
            "speech_start_to_first_delta_s": percentiles(u["first_delta"] for u in times),
            "partial_cadence_s": percentiles(u["cadence"] for u in times),
            "cpu_s_per_audio_s": None if cpu_s is None else round(cpu_s / audio_s, 3),
            "rss_mb_per_session": None if rss_mb is None else round(rss_mb / len(runs), 1),
            "real_time": real_time}


def batch_counts(service) -> tuple[int, int, int]:
    """The server's scheduler's batches, decodes and dropped partials so far (zeros without a server here)."""
    scheduler = None if service is None else service.scheduler
    return (0, 0, 0) if scheduler is None else (scheduler.batches, scheduler.decoded, scheduler.dropped)


def batching(before: tuple, after: tuple) -> dict:
    """A round's batching: the sessions' decodes per batch (mean, up to the scheduler's rows) and the
    partials its full queue dropped."""
    batches, decoded, dropped = (b - a for a, b in zip(before, after))
    return {"decodes_per_batch": round(decoded / batches, 2) if batches else None,
            "partials_dropped": dropped}


def cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2 ** 20


async def round_of(url: str, headers: dict, sessions: int, args):
    clips = [speaker_clip(args.seconds, seed) for seed in range(sessions)]
    audio_s = sum(len(clip) / 2 / WIRE_RATE for clip, _ in clips)
    runs = await asyncio.gather(*(speak(url, headers, clip, truth, args.silence_ms, args.settle)
                                  for clip, truth in clips))
    return runs, audio_s


def token_budget(tokens_per_second: float, seconds: float) -> int:
    """max_new_tokens for `seconds` of audio at `tokens_per_second` (at least 1)."""
    return max(1, round(tokens_per_second * seconds))


def baseline_model(drafts: bool = True, batch: bool = True, tokens_per_second: float | None = None):
    """Model, less its `draft` (every decode from the prompt alone) unless `drafts`, decoding the live
    sessions' decodes one at a time unless `batch`, and each decode capped at `tokens_per_second` of its
    audio where given."""
    import dataclasses

    from nanoasr.api import Model

    def budget(wave) -> int:  # the live sessions' waves are at 16 kHz
        return token_budget(tokens_per_second, len(wave) / SR)

    class Baseline(Model):
        def transcribe(self, audio, *, draft=None, **options):
            if tokens_per_second:
                options["max_new_tokens"] = budget(audio)
            return super().transcribe(audio, draft=draft if drafts else None, **options)

        def transcribe_together(self, requests, stop=None):
            if tokens_per_second:
                requests = [(w, dataclasses.replace(o, max_new_tokens=budget(w)), d) for w, o, d in requests]
            return super().transcribe_together([(w, o, d if drafts else None) for w, o, d in requests], stop)

        @property
        def together_rows(self) -> int:
            return super().together_rows if batch else 1
    return Baseline


def serve_here(model: str, threads: int | None, drafts: bool = True, batch: bool = True,
               tokens_per_second: float | None = None, partial_interval_s: float | None = None):
    """The server on 127.0.0.1 in this process: (its ws:// URL, a function that stops it, its Service)."""
    import uvicorn

    from nanoasr.api import Model
    from nanoasr.server import create_app
    from nanoasr.server.realtime import WS_MAX_BYTES

    from nanoasr.realtime import Limits

    plain = drafts and batch and not tokens_per_second
    kind = Model if plain else baseline_model(drafts, batch, tokens_per_second)
    loaded = kind.load(model, threads=threads)
    app = create_app(loaded, max_queue=256, warm_up=True)  # as `nanoasr serve`: no compiling in a round
    cadence = {} if partial_interval_s is None else {"partial_interval_s": partial_interval_s}
    app.state.live_limits = Limits(vad="energy", **cadence)  # the speakers are tones: Silero hears no speech
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           ws_max_size=WS_MAX_BYTES))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 600  # the warm-up compiles the kernels where none are cached
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]

    def stop():
        server.should_exit = True
        thread.join(30)

    return f"ws://127.0.0.1:{port}", stop, app.state.service


def final_times(model_path: str, utterances: int, threads: int | None,
                tokens_per_second: float | None = None) -> dict:
    """Seconds of Model.transcribe per utterance without a draft and with a right one (its own ids), p50 and
    p95, each final capped at tokens_per_second of its audio where given; the drafted transcripts are checked
    to be the plain ones."""
    from nanoasr.api import Model

    model = Model.load(model_path, threads=threads)
    model.warm_up()  # as `nanoasr serve` does: no compiling in a timed final
    rng = np.random.default_rng(0)
    plain_s, drafted_s, tokens = [], [], []
    for _ in range(utterances):
        seconds = rng.uniform(2.0, 6.0)
        wave = speech_like(seconds, int(rng.integers(1 << 30)))
        budget = {"max_new_tokens": token_budget(tokens_per_second, seconds)} if tokens_per_second else {}
        start = time.perf_counter()
        plain = model.transcribe(wave, sample_rate=SR, **budget)
        plain_s.append(time.perf_counter() - start)
        ids = [t for segment in plain.segments for t in segment.token_ids]
        start = time.perf_counter()
        drafted = model.transcribe(wave, sample_rate=SR, draft=ids, **budget)
        drafted_s.append(time.perf_counter() - start)
        if drafted.segments != plain.segments:
            raise AssertionError("a drafted final differs from the plain one")
        tokens.append(len(ids))
    return {"utterances": utterances, "tokens": percentiles(tokens),
            "final_without_draft_s": percentiles(plain_s), "final_with_right_draft_s": percentiles(drafted_s)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="run the server here, on this model")
    parser.add_argument("--url", help="a running server's ws://host:port instead")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--sessions", default="1", help="comma-separated session counts, one round each")
    parser.add_argument("--seconds", type=float, default=30.0, help="audio per speaker")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--silence-ms", type=int, default=500)
    parser.add_argument("--max-latency", type=float, default=1.2)
    parser.add_argument("--settle", type=float, default=30.0,
                        help="seconds a speaker waits for its last finals after its audio ends")
    parser.add_argument("--no-draft", action="store_true",
                        help="decode without drafts (with --model): the baseline of draft verification")
    parser.add_argument("--no-batch", action="store_true",
                        help="decode each session's decodes alone (with --model): the baseline of batching")
    parser.add_argument("--finals", type=int, default=None,
                        help="time N final decodes alone, with and without a right draft (with --model)")
    parser.add_argument("--tokens-per-second", type=float, default=None,
                        help="with --model: cap each decode at this many tokens per second of its audio")
    parser.add_argument("--partial-interval", type=float, default=None,
                        help="with --model: seconds of new audio between a session's partials (the server's "
                             "--partial-interval)")
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args(argv)
    logging.getLogger("nanoasr").setLevel(logging.ERROR)  # a random model's budget warnings, once a decode
    if (args.model is None) == (args.url is None):
        parser.error("give --model (a server in this process) or --url (a running server)")
    if args.tokens_per_second is not None and (args.tokens_per_second <= 0 or args.model is None):
        parser.error("--tokens-per-second takes a positive rate and --model")
    if args.finals is not None:
        if args.model is None or args.finals < 1:
            parser.error("--finals takes a positive count and --model")
        results = [final_times(args.model, args.finals, args.threads, args.tokens_per_second)]
        print(json.dumps(results[0]), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        return 0
    url, stop, service = (serve_here(args.model, args.threads, not args.no_draft, not args.no_batch,
                                     args.tokens_per_second, args.partial_interval)
                          if args.model else (args.url.rstrip("/"), None, None))
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    results = []
    try:
        for sessions in (int(n) for n in args.sessions.split(",")):
            cpu, rss, counts = cpu_seconds(), rss_mb(), batch_counts(service)
            runs, audio_s = asyncio.run(round_of(f"{url}/v1/realtime?intent=transcription", headers, sessions,
                                                 args))
            here = stop is not None  # the server's CPU and memory are this process's
            summary = summarize(runs, audio_s, cpu_seconds() - cpu if here else None,
                                max(0.0, rss_mb() - rss) if here else None, args.max_latency)
            if here:
                summary.update(batching(counts, batch_counts(service)))
            results.append(summary)
            print(json.dumps(summary), flush=True)
    finally:
        if stop is not None:
            stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
