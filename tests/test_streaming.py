"""Text as it is decoded: the settled ids of an unfinished generation, their text, the partial segments of
Model.transcribe, the server's stream=true deltas and the CLI's progress bar during a segment."""
import asyncio
import io
import random

import numpy as np
import pytest
import soundfile as sf

from nanoasr.api import settled_text
from nanoasr.model import decoder
from nanoasr.model.generate import loop_start, settled_length
from nanoasr.transcript import Segment
from tools.lib.synth import speech_like


def wav(seconds: float, seed: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, speech_like(seconds, seed), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


SHORT = wav(3.0, 1)
LONG = wav(31.0, 2)  # over 30 s: two segments


# --- settled ids ------------------------------------------------------------------------------------------

def guarded(draw, steps: int) -> tuple[list[list[int]], list[int]]:
    """The ids after each step of a generation that stops when the repetition guard fires, and the ids kept;
    `draw(n)` is the id chosen after n of them."""
    ids, seen = [], []
    for n in range(steps):
        ids.append(draw(n))
        cut = loop_start(ids)
        if cut is not None:
            return seen, ids[:cut]
        seen.append(list(ids))
    return seen, ids


@pytest.mark.parametrize("seed", range(300))
def test_settled_ids_are_never_taken_back_by_the_repetition_guard(seed):
    rng = random.Random(seed)
    pattern = [rng.randrange(3) for _ in range(rng.randint(1, 60))]
    loop_from = rng.randrange(40)

    def draw(n):  # free ids for a while, then a pattern of up to MAX_PERIOD ids over and over, with slips
        if n < loop_from or rng.random() < 0.02:
            return rng.randrange(4)
        return pattern[(n - loop_from) % len(pattern)]

    seen, kept = guarded(draw, 300)
    for ids in seen:
        assert settled_length(ids) <= len(kept)


def test_settled_ids_are_all_ids_without_a_repeating_tail_or_without_the_guard():
    ids = list(range(100))
    assert settled_length(ids) == 100
    looping = ids + [7, 8] * 5
    assert settled_length(looping) == 100 + 2  # one copy of the pattern stays: the guard keeps it
    assert settled_length(looping, ignore_stop=True) == len(looping)


# --- settled text -----------------------------------------------------------------------------------------

def test_settled_text_is_a_growing_prefix_of_the_final_text(tiny_model):
    tokenizer = tiny_model.tokenizer
    ids = tokenizer.encode("𝔘𝔫𝔦 héllo 你好 /sil 世界 and/or 𝔘 ")
    final = tokenizer.decode(ids)
    texts = [settled_text(tokenizer.decode(ids[:k])) for k in range(len(ids) + 1)]
    assert any("\ufffd" in tokenizer.decode(ids[:k]) for k in range(len(ids)))  # a character split
    assert any(tokenizer.decode(ids[:k]).endswith(("/", "/s", "/si")) for k in range(len(ids)))  # /sil split
    for before, after in zip(texts, texts[1:]):
        assert final.startswith(after) and after.startswith(before)
    assert texts[-1] == final


# --- Model.transcribe and the server ----------------------------------------------------------------------

@pytest.fixture
def steps(monkeypatch):
    """Counts the decoder's steps (one token for every segment decoding)."""
    count = [0]
    step = decoder.Session.step

    def counted(self, *args, **kwargs):
        count[0] += 1
        return step(self, *args, **kwargs)

    monkeypatch.setattr(decoder.Session, "step", counted)
    return count


def test_partial_segments_run_ahead_of_the_finished_ones_in_order(tiny_model, steps):
    calls = []
    transcript = tiny_model.transcribe(LONG, on_partial=lambda s: calls.append(("partial", s, steps[0])),
                                       on_segment=lambda s: calls.append(("finished", s, steps[0])))
    finished = [s for kind, s, _ in calls if kind == "finished"]
    assert tuple(finished) == transcript.segments and len(finished) == 2
    starts = [s.start for s in transcript.segments]
    done = 0
    for kind, segment, _ in calls:
        if kind == "finished":
            done += 1
            continue
        assert starts.index(segment.start) == done  # the earliest segment not finished yet
        assert transcript.segments[done].text.startswith(segment.text)
        assert segment.finish_reason == "decoding"
    first_text = next(n for _, s, n in calls if s.text)
    assert first_text < steps[0] // 2


def test_text_events_send_what_each_partial_or_finished_segment_adds():
    from nanoasr.server.responses import TextEvents

    loop = asyncio.new_event_loop()
    try:
        events, started = asyncio.Queue(), loop.create_future()
        sink = TextEvents(loop, events, started)
        sink.on_partial(Segment(0.0, 1.0, "", "decoding", (1,)))
        loop.run_until_complete(asyncio.sleep(0))
        assert not started.done()  # no text yet: an error now still gets its status code
        for text in ("hel", "hello"):
            sink.on_partial(Segment(0.0, 1.0, text, "decoding", (1,)))
        sink.on_segment(Segment(0.0, 1.0, "hello there", "stop", (1,)))
        sink.on_partial(Segment(1.0, 2.0, "gen", "decoding", (1,)))
        sink.on_segment(Segment(1.0, 2.0, "general", "stop", (1,)))
        loop.run_until_complete(asyncio.sleep(0))
        deltas = [events.get_nowait()["delta"] for _ in range(events.qsize())]
    finally:
        loop.close()
    assert started.done() and deltas == ["hel", "lo", " there", " gen", "eral"]


class CountedModel:
    """The tiny model, its callbacks noting how many decode steps had run when each was called."""

    def __init__(self, model, steps):
        self.model, self.steps, self.texts_at = model, steps, []

    def check_options(self, language=None, word_timestamps=False):
        self.model.check_options(language, word_timestamps)

    def transcribe(self, audio, on_segment=None, on_partial=None, **kwargs):
        def noted(callback):
            def call(segment):
                self.texts_at.append(self.steps[0])
                callback(segment)
            return call
        return self.model.transcribe(audio, on_segment=noted(on_segment), on_partial=noted(on_partial),
                                     **kwargs)


def test_stream_deltas_arrive_while_the_only_segment_decodes(tiny_model, steps):
    openai = pytest.importorskip("openai")
    from nanoasr.server import create_app
    from tests.serverutil import running

    model = CountedModel(tiny_model, steps)
    with running(create_app(model)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        events = list(client.audio.transcriptions.create(model="m", file=("a.wav", SHORT, "audio/wav"),
                                                         stream=True))
    total_steps = steps[0]
    expected = tiny_model.transcribe(SHORT)
    assert len(expected.segments) == 1
    deltas = [e for e in events[:-1] if e.type == "transcript.text.delta"]
    assert len(deltas) == len(events) - 1 >= 3 and events[-1].type == "transcript.text.done"
    assert "".join(e.delta for e in deltas) == events[-1].text == expected.text
    assert model.texts_at[0] < total_steps // 2  # the first text long before the segment's last step


# --- the CLI's progress bar ---------------------------------------------------------------------------------

def test_the_progress_bar_moves_through_a_segment_as_it_is_decoded():
    from nanoasr.cli import transcribe

    stream = io.StringIO()
    progress = transcribe.Progress(stream, bar=True, verbose=False)
    progress.begin(1, 1, "a.wav")
    progress.start(60.0)
    progress.partial(Segment(0.0, 30.0, "some", "decoding", tuple(np.arange(40))))  # 10 s at 4 tokens/s
    assert stream.getvalue().endswith("|####--------------------|  17% 00:10/01:00")
    progress.partial(Segment(0.0, 30.0, "more", "decoding", tuple(np.arange(400))))
    assert stream.getvalue().endswith("|############------------|  50% 00:30/01:00")  # not past its end
