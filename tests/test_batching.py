"""Live sessions sharing a DecodeScheduler (nanoasr.batching): their decodes are batched, each session gets
the events it gets decoding alone, decodes asked for during a batch share one decode step per token, and a
full queue drops partials, never finals.

The references are sessions decoding alone (LiveSession without a scheduler, whose finals are
Model.transcribe's: tests/test_draft.py) and Model.transcribe of each request alone."""
import threading

import numpy as np
import pytest

from nanoasr.api import Options
from nanoasr.batching import DecodeScheduler
from nanoasr.errors import AudioError
from nanoasr.model import decoder
from nanoasr.realtime import Delta, Limits, LiveSession
from tests.test_realtime import TONES, utterances_clip
from tools.lib.synth import speech_like

SR = 16000
CHUNK = SR // 10


class Gate:
    """An `execute` that holds each batch until the test lets it run, recording the batches' requests."""

    def __init__(self):
        self.batches, self.open = [], threading.Event()
        self.held = threading.Semaphore(0)

    def __call__(self, fn, requests, stop):
        self.batches.append(requests)
        self.held.release()
        self.open.wait()
        return fn(requests, stop)


def in_thread(fn, *args) -> tuple[threading.Thread, list]:
    out = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)))
    thread.start()
    return thread, out


def wait_until(condition) -> None:
    ready = threading.Event()
    while not condition():
        ready.wait(0.001)


def steps_counted(monkeypatch) -> list:
    calls, forward = [], decoder.forward

    def spy(x, *args, **kwargs):
        calls.append("prefill" if x.shape[1] > 1 else "step")
        return forward(x, *args, **kwargs)
    monkeypatch.setattr(decoder, "forward", spy)
    return calls


class InStep:
    """An `execute` that holds each batch until every session inside a call waits for a decode (queued, or in
    this batch), so that the decodes that sessions fed in step ask for together share the next batch."""

    def __init__(self):
        self.inside, self.sizes, self.scheduler = 0, [], None
        self.lock = threading.Lock()

    def __call__(self, fn, requests, stop):
        wait_until(lambda: self.inside == len(self.scheduler._queue) + len(requests))
        self.sizes.append(len(requests))
        return fn(requests, stop)

    def call(self, method, *args) -> list:
        with self.lock:
            self.inside += 1
        try:
            return method(*args)
        finally:
            with self.lock:
                self.inside -= 1


def run_sessions(sessions, clips, step: InStep) -> list[list]:
    """Feed each session its clip 0.1 s at a time, every session on its own thread, all in step; their
    events."""
    events = [[] for _ in sessions]
    rounds = max(len(clip) for clip in clips) // CHUNK + 1
    barrier = threading.Barrier(len(sessions))

    def run(i):
        for r in range(rounds):
            chunk = clips[i][r * CHUNK:(r + 1) * CHUNK]
            if len(chunk):
                events[i] += step.call(sessions[i].feed, chunk)
            barrier.wait()
        events[i] += step.call(sessions[i].finish)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(sessions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return events


def test_sessions_sharing_a_scheduler_get_the_events_they_get_alone(fast_model):
    clips = [utterances_clip(seeds, gap_s)[0] for seeds, gap_s in (((1, 2), 1.0), ((3, 4, 5), 0.8),
                                                                   ((6,), 1.2))]
    limits = Limits(partial_interval_s=0.3, vad=TONES)
    alone = []
    for clip in clips:
        session = LiveSession(fast_model, limits=limits)
        alone.append([e for i in range(0, len(clip), CHUNK) for e in session.feed(clip[i:i + CHUNK])]
                     + session.finish())
    step = InStep()
    scheduler = step.scheduler = DecodeScheduler(fast_model, execute=step)
    try:
        together = run_sessions([LiveSession(fast_model, limits=limits, scheduler=scheduler) for _ in clips],
                                clips, step)
    finally:
        scheduler.close()
    assert together == alone
    assert scheduler.dropped == 0 and max(step.sizes) >= 2  # one decode runs, the others share the next


def test_decodes_asked_for_during_a_batch_share_its_successors_steps(fast_model, monkeypatch):
    """Four decodes: the first runs alone; the three asked for meanwhile go through one step per token."""
    options = Options(max_new_tokens=12, ignore_stop=True)
    waves = [speech_like(1.0 + 0.4 * seed, seed) for seed in range(4)]
    gate = Gate()
    scheduler = DecodeScheduler(fast_model, execute=gate)
    calls = steps_counted(monkeypatch)
    try:
        first = in_thread(scheduler.decode, waves[0], options, None, False)
        gate.held.acquire()  # the first batch is taken, and held
        others = [in_thread(scheduler.decode, wave, options, None, False) for wave in waves[1:]]
        wait_until(lambda: len(scheduler._queue) == 3)
        gate.open.set()
        for thread, _ in [first] + others:
            thread.join()
    finally:
        scheduler.close()
    assert [len(batch) for batch in gate.batches] == [1, 3]
    assert calls.count("prefill") == 4 and calls.count("step") == 2 * 11  # one step per token per batch
    for wave, (_, out) in zip(waves, [first] + others):
        alone = fast_model.transcribe(wave, sample_rate=SR, max_new_tokens=12, ignore_stop=True)
        assert out[0].segments == alone.segments


def test_a_full_queue_drops_partials_and_finals_go_first(fast_model):
    wave, options = speech_like(1.0, 1), Options(max_new_tokens=4)
    gate = Gate()
    scheduler = DecodeScheduler(fast_model, rows=1, max_queue=2, execute=gate)
    try:
        running = in_thread(scheduler.decode, wave, options, None, True)
        gate.held.acquire()
        queued = [in_thread(scheduler.decode, wave[:SR // 2 + k * SR // 10], options, None, False)
                  for k in range(2)]
        wait_until(lambda: len(scheduler._queue) == 2)
        assert scheduler.decode(wave, options, None, False) is None  # the queue is full: dropped at once
        final = in_thread(scheduler.decode, wave[:SR * 3 // 4], options, None, True)  # the newest's place
        queued[1][0].join()
        assert queued[1][1] == [None] and scheduler.dropped == 2
        gate.open.set()
        for thread, _ in [running, queued[0], final]:
            thread.join()
    finally:
        scheduler.close()
    assert [len(wave) for [(wave, _, _)] in gate.batches] == [SR, SR * 3 // 4, SR // 2]  # finals first
    assert final[1][0].segments == fast_model.transcribe(wave[:SR * 3 // 4], sample_rate=SR,
                                                         max_new_tokens=4).segments


def held_at_first_step(monkeypatch) -> tuple[list, threading.Event, threading.Event]:
    """decoder.forward spied on (as steps_counted), and held at the first decode step until `go` is set;
    `stepping` is set once it is held."""
    calls, forward = [], decoder.forward
    stepping, go = threading.Event(), threading.Event()

    def spy(x, *args, **kwargs):
        calls.append("prefill" if x.shape[1] > 1 else "step")
        if calls[-1] == "step" and not stepping.is_set():
            stepping.set()
            go.wait()
        return forward(x, *args, **kwargs)
    monkeypatch.setattr(decoder, "forward", spy)
    return calls, stepping, go


def test_a_final_stops_the_partials_decoding_and_goes_first(fast_model, monkeypatch):
    options = Options(max_new_tokens=12, ignore_stop=True)
    wave = speech_like(1.5, 1)
    calls, stepping, go = held_at_first_step(monkeypatch)
    scheduler = DecodeScheduler(fast_model)
    try:
        partial = scheduler.submit(wave, options, None, False)
        stepping.wait()
        final = in_thread(scheduler.decode, wave[:SR], options, None, True)
        wait_until(lambda: len(scheduler._queue) == 1)
        go.set()
        assert partial.result() is None  # dropped: its session decodes a partial again at its next feed
        final[0].join()
    finally:
        scheduler.close()
    assert scheduler.stopped == 1
    assert calls == ["prefill", "step", "prefill"] + ["step"] * 11  # the partial stopped after one step
    alone = fast_model.transcribe(wave[:SR], sample_rate=SR, max_new_tokens=12, ignore_stop=True)
    assert final[1][0].segments == alone.segments


def test_partials_no_longer_wanted_are_dropped_queued_or_decoding(fast_model, monkeypatch):
    options = Options(max_new_tokens=12, ignore_stop=True)
    wave = speech_like(1.5, 1)
    calls, stepping, go = held_at_first_step(monkeypatch)
    scheduler = DecodeScheduler(fast_model, rows=1)
    decoding, queued = threading.Event(), threading.Event()
    try:
        first = scheduler.submit(wave, options, None, False, decoding)
        stepping.wait()
        second = scheduler.submit(wave[:SR], options, None, False, queued)
        queued.set()
        decoding.set()
        go.set()
        assert first.result() is None and second.result() is None
    finally:
        scheduler.close()
    assert calls == ["prefill", "step"] and scheduler.stopped == 1 and scheduler.dropped == 2


def test_a_refused_decode_fails_its_own_session_only(fast_model):
    scheduler = DecodeScheduler(fast_model, execute=Gate())
    gate = scheduler.execute
    wave, bad = speech_like(1.0, 1), np.full(SR, np.nan, np.float32)
    try:
        first = in_thread(scheduler.decode, wave, Options(max_new_tokens=4))
        gate.held.acquire()
        good = in_thread(scheduler.decode, wave, Options(max_new_tokens=4))
        refused = in_thread(lambda: pytest.raises(AudioError, scheduler.decode, bad, Options()))
        wait_until(lambda: len(scheduler._queue) == 2)
        gate.open.set()
        for thread, _ in (first, good, refused):
            thread.join()
    finally:
        scheduler.close()
    assert len(gate.batches[1]) == 2  # tried together, then each alone
    assert good[1][0].text == first[1][0].text and refused[1][0].match("NaN|finite")


class Dropping:
    """A scheduler stand-in that drops the first partial it is asked for and decodes the rest alone."""

    def __init__(self, model):
        self.model, self.asked = model, []

    def decode(self, wave, options, draft=None, final=True):
        self.asked.append(final)
        if self.asked == [False]:
            return None
        return self.model.transcribe(wave, sample_rate=SR, draft=draft, max_new_tokens=8)


def test_a_dropped_partial_is_decoded_at_the_next_feed(fast_model):
    clip = utterances_clip((1,), 1.0)[0]
    scheduler = Dropping(fast_model)
    session = LiveSession(fast_model, limits=Limits(partial_interval_s=0.3, vad=TONES), scheduler=scheduler)
    fed = 0
    while scheduler.asked != [False]:
        assert not [e for e in session.feed(clip[fed:fed + CHUNK]) if isinstance(e, Delta)]
        fed += CHUNK
    due = session.partial.due
    session.feed(clip[fed:fed + CHUNK])
    assert scheduler.asked == [False, False] and session.partial.due > due
