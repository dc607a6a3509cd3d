"""Live sessions (nanoasr.realtime) and the streaming detector (nanoasr.audio.vad).

Finals are checked against `Model.transcribe` of the same audio on the tiny model (token ids); the partial
logic against a scripted model whose hypotheses are chosen to agree, disagree or change late.
"""
import numpy as np
import pytest

from nanoasr.api import Options
from nanoasr.audio.vad import HOP, StreamingVad, silence_limit_ms
from nanoasr.errors import AudioError, ModelError, OptionError
from nanoasr.realtime import (MAX_UTTERANCE_S, TAIL, Committed, Completed, Delta, Failed, Limits, LiveSession,
                              SpeechStarted, SpeechStopped, TurnDetection)
from nanoasr.transcript import Segment, Transcript
from tools.lib.synth import speech_like

SR = 16000
FAST = Options(max_new_tokens=6)  # the tiny model never stops on its own: a short budget keeps tests quick
# The session tests speak in tones (tools/lib/synth.py), which Silero VAD rightly takes for no speech: the
# energy detector endpoints them. tests/test_vad.py tests the Silero detector on synthesized speech.
TONES = "energy"


def utterances_clip(seeds=(1, 2, 3), gap_s=1.5):
    """1 s speech bursts after 0.5 s of quiet, each followed by `gap_s` of quiet; (clip, [(start, end)])."""
    parts, truth, at = [np.zeros(SR // 2, np.float32)], [], SR // 2
    for seed in seeds:
        burst = speech_like(1.2, seed)[SR // 5:]  # speech_like begins with 0.2 s of quiet, then one phrase
        parts += [burst, np.zeros(int(gap_s * SR), np.float32)]
        truth.append((at, at + len(burst)))
        at += len(burst) + int(gap_s * SR)
    clip = np.concatenate(parts)
    return clip + np.random.default_rng(0).standard_normal(len(clip)).astype(np.float32) * 1e-4, truth


def feed(session, clip, chunk):
    events = []
    for i in range(0, len(clip), chunk):
        events += session.feed(clip[i:i + chunk])
    return events + session.finish()


def of(events, kind):
    return [e for e in events if isinstance(e, kind)]


def test_silence_schedule_shrinks_and_the_client_limit_caps_it():
    assert [silence_limit_ms(s) for s in (0, 5, 5.1, 10, 12, 20, 40, 46, 300)] == \
        [2000, 2000, 1500, 1500, 1000, 800, 400, 100, 100]
    assert [silence_limit_ms(s, 500) for s in (1, 20, 40, 60)] == [500, 500, 400, 100]


@pytest.mark.parametrize("chunk", [320, 4800, 10 ** 6])
def test_vad_finds_each_burst_whatever_the_chunk_size(chunk):
    clip, truth = utterances_clip()
    vad = StreamingVad(silence_ms=500)
    found = [t for i in range(0, len(clip), chunk) for t in vad.feed(clip[i:i + chunk])]
    assert [t.speech for t in found] == [True, False] * 3
    for (start, end), on, off in zip(truth, found[::2], found[1::2]):
        assert abs(on.at - start) <= 0.1 * SR and abs(off.at - end) <= 0.1 * SR
        assert on.at % HOP == 0 and off.found - off.at >= 0.5 * SR  # the silence waited out
    assert found == [t for t in StreamingVad(silence_ms=500).feed(clip)]  # chunking changes nothing


def test_vad_ignores_quiet_noise_and_a_click():
    rng = np.random.default_rng(1)
    noise = rng.standard_normal(5 * SR).astype(np.float32) * 1e-3  # -60 dBFS hiss, under the silence floor
    noise[2 * SR:2 * SR + 800] += 0.5  # a 50 ms click
    assert StreamingVad().feed(noise) == []


def test_turn_detection_refuses_a_threshold_out_of_range():
    with pytest.raises(OptionError, match="threshold"):
        TurnDetection(threshold=1.5)
    with pytest.raises(OptionError, match="silence_duration_ms"):
        TurnDetection(silence_duration_ms=-1)


def test_server_vad_finals_are_model_transcribe_of_each_utterance(fast_model):
    clip, truth = utterances_clip()
    events = feed(LiveSession(fast_model, FAST, TurnDetection(silence_duration_ms=500), Limits(vad=TONES)),
                  clip, 4800)
    committed, completed = of(events, Committed), of(events, Completed)
    assert [e.item for e in of(events, SpeechStarted)] == [0, 1, 2] == [e.item for e in completed]
    assert [e.audio_end_ms for e in of(events, SpeechStopped)] == [e.audio_end_ms for e in committed]
    for (start, end), c, done in zip(truth, committed, completed):
        assert c.audio_start_ms * 16 <= start and abs(c.audio_end_ms * 16 - end) < 0.4 * SR
        reference = fast_model.transcribe(clip[c.audio_start_ms * 16:c.audio_end_ms * 16], sample_rate=SR,
                                          max_new_tokens=6)
        assert done.token_ids == reference.segments[0].token_ids and done.transcript == reference.text
        assert done.seconds == pytest.approx((c.audio_end_ms - c.audio_start_ms) / 1000)
    for item, done in enumerate(completed):  # the deltas of an item come before its final, never after
        assert all(events.index(d) < events.index(done) for d in of(events, Delta) if d.item == item)


def test_manual_commits_transcribe_the_audio_held(fast_model):
    clip, truth = utterances_clip(seeds=(4, 5), gap_s=0.5)
    session = LiveSession(fast_model, FAST, turn_detection=None)
    with pytest.raises(AudioError, match="buffer too small. Expected at least 100ms of audio, but buffer "
                                         "only has 0.00ms"):
        session.commit()
    cut = truth[0][1] + SR // 4
    first = session.feed(clip[:cut]) + session.commit()
    second = session.feed(clip[cut:]) + session.commit()
    assert of(first + second, SpeechStarted) == [] and of(first + second, SpeechStopped) == []
    for events, (a, b) in zip((first, second), ((0, cut), (cut, len(clip)))):
        (done,) = of(events, Completed)
        reference = fast_model.transcribe(clip[a:b], sample_rate=SR, max_new_tokens=6)
        assert done.token_ids == reference.segments[0].token_ids
        assert "".join(d.text for d in of(events, Delta)) == done.transcript  # the final as its one delta
    session.feed(clip[:800])  # 50 ms
    with pytest.raises(AudioError, match="but buffer only has 50.00ms"):
        session.commit()
    session.clear()
    assert session.buffered_ms == 0 and session.finish() == []


class Scripted:
    """A Model stand-in: the hypothesis for `n` samples of audio is script(n), token ids; t reads "wt"."""

    def __init__(self, script):
        self.script, self.calls = script, []
        self.tokenizer = self

    def decode(self, ids):
        return " ".join(f"w{t}" for t in ids)

    def check_options(self, language=None, word_timestamps=False):
        pass

    def transcribe(self, wave, sample_rate, **options):
        self.calls.append(len(wave))
        ids = tuple(self.script(len(wave)))
        seconds = len(wave) / sample_rate
        segment = Segment(0.0, seconds, self.decode(ids), "stop", ids)
        return Transcript(self.decode(ids), (segment,), None, seconds)


def speech(seconds):
    """A voiced tone that never pauses: one utterance to the detector."""
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 * np.sin(2 * np.pi * 150 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def live(model, **limits):
    return LiveSession(model, Options(), TurnDetection(silence_duration_ms=300), Limits(vad=TONES, **limits))


def test_partials_send_only_agreed_text_and_spell_the_final():
    model = Scripted(lambda n: range(n // 8000))  # a word per half second, stable as audio grows
    events = feed(live(model), np.concatenate([speech(3.0), np.zeros(SR, np.float32)]), 1600)
    deltas, (done,) = of(events, Delta), of(events, Completed)
    assert len(deltas) >= 3 and "".join(d.text for d in deltas) == done.transcript
    assert all(events.index(d) < events.index(of(events, SpeechStopped)[0]) for d in deltas[:-1])


def test_partials_never_retract_and_a_changed_final_stands_alone():
    # partials agree on w1 w2 at first, then change their minds; the final reads something else again
    def script(n):
        return (9, 9, 9) if n > 3.2 * SR else (1, 2, n) if n < 2 * SR else (1, 5, 6)
    events = feed(live(Scripted(script)), np.concatenate([speech(3.0), np.zeros(SR, np.float32)]), 1600)
    deltas, (done,) = of(events, Delta), of(events, Completed)
    assert "".join(d.text for d in deltas) == "w1 w2" and done.transcript == "w9 w9 w9"


def test_partial_window_is_bounded():
    model = Scripted(lambda n: range(n // 8000))
    events = feed(live(model, partial_window_s=2.0), np.concatenate([speech(7.0), np.zeros(SR, np.float32)]),
                  1600)
    final = model.calls.pop(-1)
    assert max(model.calls) <= 2.0 * SR + 0.48 * SR + 1600 and final >= 7 * SR
    text = "".join(d.text for d in of(events, Delta))
    assert text.split()[:4] == ["w0", "w1", "w2", "w3"]  # the first window's words, in order


def test_an_utterance_is_cut_at_the_limit_and_memory_stays_bounded():
    model = Scripted(lambda n: (1,))
    session = live(model, max_utterance_s=2.0, partials=False)
    events = feed(session, speech(5.0), 1600)
    starts = of(events, SpeechStarted)
    first = starts[0].audio_start_ms
    assert len(starts) == 3 and [e.audio_start_ms for e in starts[1:]] == [first + 2000, first + 4000]
    assert max(model.calls) == 2 * SR
    for _ in range(100):  # 100 s of quiet: only the pre-roll is held
        session.feed(np.zeros(SR, np.float32))
    assert len(session.audio.data) <= 8 * SR and session.audio.end - session.audio.start <= 3 * SR
    with pytest.raises(OptionError, match="max_utterance_s"):
        Limits(max_utterance_s=MAX_UTTERANCE_S + 1)


def pending_ends_match_the_ends(vad, clip, piece) -> int:
    """Feed `clip` in pieces: each speech end's `at` is what pending_end said before the piece that found it,
    and there is no pending end outside speech; -> the number of speech ends."""
    pending, ends = None, 0
    for i in range(0, len(clip), piece):
        for t in vad.feed(clip[i:i + piece]):
            if not t.speech:
                assert pending == t.at
                ends += 1
        pending = vad.pending_end()
        assert vad.in_speech or pending is None
    return ends


def test_the_energy_detector_tells_where_a_silence_would_end_the_speech():
    clip, truth = utterances_clip()
    assert pending_ends_match_the_ends(StreamingVad(silence_ms=500), clip, HOP) == len(truth)


def test_the_final_is_decoded_while_its_endpoint_silence_goes_on():
    model = Scripted(lambda n: (n // 160,))  # the audio's length in 10 ms: a final of other audio differs
    session = LiveSession(model, Options(), TurnDetection(silence_duration_ms=1000), Limits(vad=TONES))
    quiet = np.zeros(int(0.6 * SR), np.float32)  # a pause under the silence that ends the utterance
    clip = np.concatenate([speech(2.0), quiet, speech(1.0), quiet, quiet, quiet])
    events = []
    for i in range(0, len(clip), 1600):
        calls = len(model.calls)
        new = session.feed(clip[i:i + 1600])
        if of(new, Completed):
            assert len(model.calls) == calls  # the endpoint found its final decoded already
        events += new
    (committed,), (done,) = of(events, Committed), of(events, Completed)
    length = (committed.audio_end_ms - committed.audio_start_ms) * 16
    assert done.token_ids == (length // 160,) and model.calls[-1] == length
    # at the pause the final was decoded ahead too, up to the pause's start and the tail: speech came back
    at_pause = 2 * SR + TAIL - committed.audio_start_ms * 16
    assert any(abs(n - at_pause) <= 0.03 * SR for n in model.calls)


def test_a_partial_decoded_elsewhere_is_cancelled_when_its_utterance_ends():
    """The server's way: feed(partial=False), next_partial() hands the partial out, partial_done takes it
    back. Given back in time, it gives the deltas feed gives; out when the endpoint comes, it is cancelled,
    given back late it changes nothing, and the final is the same."""
    model = Scripted(lambda n: range(n // 8000))
    clip = np.concatenate([speech(3.0), np.zeros(SR, np.float32)])
    alone = feed(live(model), clip, 1600)
    session, events, out = live(model), [], None
    for i in range(0, len(clip), 1600):
        events += session.feed(clip[i:i + 1600], partial=False)
        if out is None:
            out = session.next_partial()
            if out is not None and i < 2 * SR:  # a prompt decode: given back at once
                events += session.partial_done(out, model.transcribe(out.wave, SR))
                out = None
        else:
            assert session.next_partial() is None  # one out at a time
    assert out is not None and out.cancelled.is_set()
    assert session.partial_done(out, model.transcribe(out.wave, SR)) == []
    assert of(events, Completed) == of(alone, Completed)
    sent = "".join(d.text for d in of(events, Delta))
    assert of(alone, Completed)[0].transcript.startswith(sent) and len(of(events, Delta)) >= 2


def test_bad_samples_are_refused():
    session = live(Scripted(lambda n: ()))
    with pytest.raises(AudioError, match="float32"):
        session.feed(np.zeros(10, np.int16))
    with pytest.raises(AudioError, match="finite"):
        session.feed(np.full(10, np.nan, np.float32))


def test_a_session_started_mid_stream_keeps_the_stream_clock():
    clip, truth = utterances_clip(seeds=(1,))
    offset = 5 * SR + 37  # any sample, not a whole frame
    model = Scripted(lambda n: (1,))
    session = LiveSession(model, Options(), TurnDetection(silence_duration_ms=500),
                          Limits(partials=False, vad=TONES), start=offset)
    events = feed(session, clip, 1600)
    (started,), (committed,) = of(events, SpeechStarted), of(events, Committed)
    alone = feed(live(Scripted(lambda n: (1,)), partials=False), clip, 1600)
    assert started.audio_start_ms - of(alone, SpeechStarted)[0].audio_start_ms == offset * 1000 // SR
    assert abs(committed.audio_end_ms - (offset + truth[0][1]) * 1000 // SR) <= 400
    assert model.calls == [(committed.audio_end_ms - committed.audio_start_ms) * 16]


def test_a_final_the_model_refuses_is_failed_and_the_session_goes_on():
    def script(n):
        if n < SR:
            raise ModelError("the decoder's logits hold NaN or Inf")
        return (3,)
    session = LiveSession(Scripted(script), Options(), turn_detection=None)
    session.feed(np.zeros(SR // 2, np.float32))
    (committed, failed) = session.commit()
    assert isinstance(failed, Failed) and failed.item == committed.item == 0 and "NaN" in failed.message
    session.feed(np.zeros(SR, np.float32))
    assert session.commit()[-1] == Completed(1, "w3", (3,), 1.0)
