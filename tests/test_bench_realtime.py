"""tools/bench/bench_realtime.py's bookkeeping: the clip's speech times and the figures made of event arrival
times. No timing is judged here."""
import asyncio
import json

import numpy as np
import pytest

from tools.bench import bench_realtime as bench


def test_clip_truth_marks_the_loud_stretches():
    clip, truth = bench.speaker_clip(12.0, seed=3)
    wave = np.frombuffer(clip, "<i2").astype(np.float32) / 32768
    assert len(truth) >= 2 and len(wave) / bench.WIRE_RATE >= 12.0
    for (start, end), (next_start, _) in zip(truth, truth[1:] + [(len(wave) / bench.WIRE_RATE + 1, 0)]):
        assert 2.0 - 0.5 < end - start <= 6.0 and next_start - end >= bench.TAIL_S
        quiet = wave[int((end + 0.05) * bench.WIRE_RATE):int((end + bench.TAIL_S - 0.05) * bench.WIRE_RATE)]
        assert np.abs(quiet).max() < 0.01


def event(kind, item, **fields):
    return {"type": kind, "item_id": item, **fields}


def test_latencies_are_matched_to_the_utterance_each_item_covers():
    run = {"truth": [(1.0, 3.0), (6.0, 9.0), (12.0, 14.0)], "arrivals": [
        (1.5, event("conversation.item.input_audio_transcription.delta", "a")),
        (2.0, event("conversation.item.input_audio_transcription.delta", "a")),
        (3.1, event("input_audio_buffer.speech_stopped", "a", audio_end_ms=3300)),
        (3.9, event("conversation.item.input_audio_transcription.delta", "a")),
        (4.0, event("conversation.item.input_audio_transcription.completed", "a")),
        (9.5, event("input_audio_buffer.speech_stopped", "b", audio_end_ms=9200)),
        (10.5, event("conversation.item.input_audio_transcription.completed", "b"))]}
    a, b, missed = bench.utterance_times(run)
    assert a == {"latency": pytest.approx(1.0), "first_delta": 0.5, "cadence": 0.5}  # 3.9: the last delta
    assert b == {"latency": 1.5, "first_delta": None, "cadence": None}
    assert missed == {"latency": None, "first_delta": None, "cadence": None}
    summary = bench.summarize([run], 15.0, 3.0, 40.0, max_latency=1.2)
    assert summary["end_of_speech_to_completed_s"]["n"] == 2 and summary["completed"] == 2
    assert summary["real_time"] is False and summary["cpu_s_per_audio_s"] == 0.2
    first, second = summary["end_of_speech_to_completed_by_half_s"]  # utterance a; b and the missed one
    assert first == {"p50": 1.0, "p95": 1.0, "n": 1} and second == {"p50": 1.5, "p95": 1.5, "n": 1}


class Paced:
    """A WebSocket stand-in: each event arrives `at` seconds after the first recv, then silence."""

    def __init__(self, timed):
        self.timed, self.start = list(timed), None

    async def recv(self):  # a recv given up (timed out) takes nothing: the event waits for the next one
        loop = asyncio.get_running_loop()
        self.start = loop.time() if self.start is None else self.start
        if not self.timed:
            await asyncio.sleep(3600)
        await asyncio.sleep(max(0.0, self.start + self.timed[0][0] - loop.time()))
        return json.dumps(self.timed.pop(0)[1])


def test_the_reader_waits_for_a_session_behind_to_end_the_clips_last_utterance(monkeypatch):
    """Quiet with every started item completed is not the end while the server has not yet stopped an
    utterance at the clip's last speech: a session behind real time decodes before it answers."""
    monkeypatch.setattr(bench, "QUIET_S", 0.05)
    first = [event("input_audio_buffer.speech_started", "a"),
             event("input_audio_buffer.speech_stopped", "a", audio_end_ms=3300),
             event("conversation.item.input_audio_transcription.completed", "a")]
    last = [event("input_audio_buffer.speech_started", "b"),
            event("input_audio_buffer.speech_stopped", "b", audio_end_ms=9200),
            event("conversation.item.input_audio_transcription.completed", "b")]
    ws = Paced([(0.0, e) for e in first] + [(0.3, e) for e in last])

    async def read():
        sent = asyncio.Event()
        sent.set()
        arrivals = []
        await asyncio.wait_for(bench._read(ws, arrivals, 0.0, sent, 9.0), 5.0)
        return [e for _, e in arrivals]
    assert asyncio.run(read()) == first + last


def test_the_baseline_model_decodes_without_drafts(fast_model, monkeypatch):
    from nanoasr.api import Options
    from nanoasr.model import generate
    from tools.lib.synth import speech_like

    seen, plain = [], generate.generate

    def spy(*args, drafts=None, **kwargs):
        seen.append(drafts)
        return plain(*args, drafts=drafts, **kwargs)
    monkeypatch.setattr(generate, "generate", spy)
    baseline = bench.baseline_model(drafts=False)(fast_model.checkpoint, threads=1)
    wave = speech_like(1.0, 2)
    baseline.transcribe(wave, sample_rate=bench.SR, max_new_tokens=3, draft=[100, 101])
    fast_model.transcribe(wave, sample_rate=bench.SR, max_new_tokens=3, draft=[100, 101])
    assert seen == [None, {0: [100, 101]}]
    baseline.transcribe_together([(wave, Options(max_new_tokens=3), [100, 101])])
    assert seen[-1] == {}  # no row has a draft


def test_the_unbatched_baseline_decodes_one_at_a_time(fast_model):
    assert fast_model.together_rows == 8
    assert bench.baseline_model(batch=False)(fast_model.checkpoint, threads=1).together_rows == 1


def test_finals_are_capped_at_the_given_tokens_per_second(tiny_dir):
    capped = bench.final_times(str(tiny_dir), 2, 1, tokens_per_second=1.0)
    assert capped["utterances"] == 2 and 1 <= capped["tokens"]["p95"] <= 6  # utterances of 2-6 s
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--model", str(tiny_dir), "--finals", "1", "--tokens-per-second", "0"])
    assert stopped.value.code == 2


def test_the_capped_model_decodes_at_most_the_rate_of_its_audio(fast_model):
    from nanoasr.api import Options
    from tools.lib.synth import speech_like

    capped = bench.baseline_model(tokens_per_second=2.0)(fast_model.checkpoint, threads=1)
    wave = speech_like(1.5, 4)
    alone = capped.transcribe(wave, sample_rate=bench.SR)
    together = capped.transcribe_together([(wave, Options(), None)])[0]
    plain = fast_model.transcribe(wave, sample_rate=bench.SR)
    ids = [[t for s in r.segments for t in s.token_ids] for r in (alone, together, plain)]
    assert ids[0] == ids[1] == ids[2][:3] and len(ids[2]) > 3  # 2 tokens a second of 1.5 s: 3
