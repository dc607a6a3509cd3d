"""The Silero detectors on synthesized speech: the streaming one (nanoasr.audio.vad.SileroVad) finds each
sentence, waits out the silence schedule, gives the same transitions however the stream is cut, and endpoints
a live session by default; the segmenter's vad="silero" keeps speech in loud noise and skips the pauses."""
import inspect

import numpy as np
import pytest

from nanoasr.audio import silero
from nanoasr.audio.segment import split
from nanoasr.audio.vad import DEFAULT_VAD, SileroVad, StreamingVad, streaming_vad
from nanoasr.errors import OptionError
from nanoasr.realtime import Committed, Limits, LiveSession, SpeechStarted, TurnDetection
from nanoasr.api import Options
from tests.test_realtime import Scripted, feed, of, pending_ends_match_the_ends, speech
from tests.test_silero import SENTENCES, espeak, needs_espeak

SR = 16000


def sentences_clip(folder):  # -> (clip, [(start, end)] of each sentence's voiced samples)
    rng = np.random.default_rng(5)
    parts, truth, at = [np.zeros(SR, np.float32)], [], SR
    for i, text in enumerate(SENTENCES):
        voice = espeak(text, folder, f"v{i}")
        voiced = np.flatnonzero(np.abs(voice) > 0.01)
        truth.append((at + voiced[0], at + voiced[-1] + 1))
        parts += [voice, np.zeros(2 * SR, np.float32)]
        at += len(voice) + 2 * SR
    clip = np.concatenate(parts)
    return clip + rng.standard_normal(len(clip)).astype(np.float32) * 3e-3, truth


def test_the_default_is_silero_when_its_weights_ship():
    assert silero.WEIGHTS.is_file() and DEFAULT_VAD == "silero"
    assert isinstance(streaming_vad(), SileroVad) and isinstance(streaming_vad("energy"), StreamingVad)


def test_bad_settings_are_refused():
    with pytest.raises(OptionError, match="vad must be one of silero, energy"):
        streaming_vad("webrtc")
    with pytest.raises(OptionError, match="vad must be one of"):
        Limits(vad="webrtc")
    with pytest.raises(OptionError, match="threshold"):
        TurnDetection(threshold=-0.1)
    with pytest.raises(OptionError, match="silence_duration_ms"):
        TurnDetection(silence_duration_ms=-1)


@needs_espeak
@pytest.mark.parametrize("chunk", [320, 4800, 10 ** 6])
def test_each_sentence_is_found_whatever_the_chunk_size(tmp_path, chunk):
    clip, truth = sentences_clip(tmp_path)
    vad = SileroVad(silence_ms=500)
    found = [t for i in range(0, len(clip), chunk) for t in vad.feed(clip[i:i + chunk])]
    assert [t.speech for t in found] == [True, False] * len(truth)
    for (start, end), on, off in zip(truth, found[::2], found[1::2]):
        assert abs(on.at - start) <= 0.15 * SR and abs(off.at - end) <= 0.25 * SR
        assert on.at % silero.CHUNK == 0 and off.found - off.at >= 0.5 * SR  # the silence waited out
    assert found == SileroVad(silence_ms=500).feed(clip)


@needs_espeak
def test_silero_tells_where_a_silence_would_end_the_speech(tmp_path):
    clip, truth = sentences_clip(tmp_path)
    assert pending_ends_match_the_ends(SileroVad(silence_ms=500), clip, silero.CHUNK) == len(truth)


@needs_espeak
def test_the_schedule_waits_two_seconds_after_a_short_utterance(tmp_path):
    clip, _ = sentences_clip(tmp_path)
    found = SileroVad().feed(np.concatenate((clip, np.zeros(SR, np.float32))))
    offs = [t for t in found if not t.speech]
    assert offs and all(2.0 * SR <= t.found - t.at <= 2.0 * SR + 2 * silero.CHUNK for t in offs)


def test_silence_and_a_tone_start_no_speech():
    t = np.arange(3 * SR) / SR
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    assert SileroVad().feed(np.concatenate((np.zeros(SR, np.float32), tone))) == []


@needs_espeak
def test_a_live_session_endpoints_speech_by_default(tmp_path):
    clip, truth = sentences_clip(tmp_path)
    events = feed(LiveSession(Scripted(lambda n: (1,)), Options(), TurnDetection(silence_duration_ms=500),
                              Limits(partials=False)), clip, 1600)
    assert len(of(events, SpeechStarted)) == len(truth)
    for (start, end), c in zip(truth, of(events, Committed)):
        assert c.audio_start_ms * 16 <= start and abs(c.audio_end_ms * 16 - end) < 0.5 * SR


@needs_espeak
def test_the_segmenter_with_silero_keeps_speech_in_loud_noise_and_skips_the_pauses(tmp_path):
    clip, truth = sentences_clip(tmp_path)
    speech_power = np.mean(np.concatenate([clip[a:b] for a, b in truth]) ** 2)
    noise = np.random.default_rng(9).standard_normal(len(clip)).astype(np.float32)
    wave = clip + noise * np.float32(np.sqrt(speech_power / 10 ** (3 / 10)))  # 3 dB SNR
    spans = split(wave, vad="silero")
    covered = np.zeros(len(wave), bool)
    for s in spans:
        covered[s.start:s.end] = True
    for start, end in truth:
        assert covered[start + SR // 10:end - SR // 10].all()
    for (_, end), (start, _) in zip(truth, truth[1:]):
        assert not covered[(end + start) // 2]  # the middle of each 2 s pause
    assert not covered[:SR // 2].any()


def test_the_segmenter_refuses_an_unknown_detector_and_silero_off_16k():
    with pytest.raises(OptionError, match="vad must be one of energy, silero"):
        split(np.zeros(SR, np.float32), vad="webrtc")
    with pytest.raises(OptionError, match="vad must be one of"):
        Options(vad="webrtc")
    with pytest.raises(OptionError, match="16 kHz"):
        split(np.sin(np.arange(SR, dtype=np.float32)), sample_rate=8000, vad="silero")


def test_transcribe_hands_its_detector_to_the_segmenter(fast_model):
    tone = speech(3.0)  # a voiced tone: loud enough for the energy detector, no speech to Silero
    assert len(fast_model.transcribe(tone, sample_rate=SR, max_new_tokens=2).segments) == 1
    assert fast_model.transcribe(tone, sample_rate=SR, max_new_tokens=2, vad="silero").segments == ()


def test_every_entry_point_has_the_same_defaults():
    """Offline: the segmenter's energy detector (docs/reports/vad.md says why); live: Silero."""
    from nanoasr.api import Model
    from nanoasr.cli import serve, stream, transcribe

    assert inspect.signature(Model.transcribe).parameters["vad"].default == Options().vad == "energy"
    assert inspect.signature(split).parameters["vad"].default == "energy"
    assert transcribe.build_parser().parse_args(["a.wav"]).vad == "energy"
    live = (Limits().vad, stream.build_parser().parse_args([]).vad, serve.build_parser().parse_args([]).vad)
    assert live == ("silero",) * 3
