"""Voice activity on a live stream, and FunASR's endpointing rule (the silence that ends an utterance shrinks
as the utterance grows). Two detectors with one interface (`feed` -> Transitions, `pending_end`, `restart`,
`end_speech`):

- `SileroVad` (the default, "silero"): Silero VAD's speech probability per 32 ms chunk (nanoasr.audio.silero).
  A chunk is speech at `threshold` or above and silence under `threshold - NEG_OFFSET` (Silero's own
  hysteresis; chunks between keep the current state). Speech starts when speech chunks have lasted
  SILERO_MIN_SPEECH_MS; it ends when the chunks since the last speech chunk, none of them speech, span
  `silence_limit_ms`. Transitions fall on 32 ms steps.
- `StreamingVad` ("energy", the fallback): the energy detector of nanoasr.audio.segment, run frame by frame.

The offline segmenter sees the whole recording before it sets its threshold; here the threshold is set from
the last HISTORY_S seconds of frames (the same rule: a noise-floor percentile plus a margin, capped below the
loud end, never under the silence floor), so it follows the room as it changes. Frames are 25 ms every 10 ms;
speech starts when a run of speech frames, bridged over pauses shorter than MIN_PAUSE_S, has lasted
MIN_SPEECH_S and once risen HYSTERESIS_DB above the threshold (clicks and hiss do not start speech); it ends
when the frames have stayed under the threshold for `silence_limit_ms`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nanoasr.audio import SAMPLE_RATE, silero
from nanoasr.audio.segment import (FRAME_S, HOP_S, HYSTERESIS_DB, MIN_PAUSE_S, MIN_SPEECH_S, frame_db,
                                   speech_threshold)
from nanoasr.errors import OptionError

FRAME = round(FRAME_S * SAMPLE_RATE)  # 400 samples
HOP = round(HOP_S * SAMPLE_RATE)  # 160 samples: event times fall on 10 ms steps
HISTORY_S = 10.0  # the threshold's frames: long enough to hold pauses, short enough to follow a room
DB_PER_THRESHOLD = 20.0  # OpenAI's server_vad threshold (0..1, default 0.5): each 0.1 moves the level 2 dB
DEFAULT_THRESHOLD = 0.5
VADS = ("silero", "energy")
DEFAULT_VAD = "silero" if silero.WEIGHTS.is_file() else "energy"  # a package without the weights falls back
NEG_OFFSET = 0.15  # Silero's hysteresis: speech ends only under threshold - 0.15
CHUNK_MS = silero.CHUNK * 1000 // SAMPLE_RATE  # 32
SILERO_MIN_SPEECH_MS = 96  # three chunks: a lone chunk (a click, a cough's edge) does not start speech
# FunASR's Nano realtime server (DynamicStreamingVAD): the silence that ends an utterance, by how long the
# utterance already is. Short ones wait out a long pause; long ones are cut at the first short one, so an
# utterance rarely reaches the decoder's 30 s limit.
SILENCE_SCHEDULE = ((5.0, 2000), (10.0, 1500), (15.0, 1000), (30.0, 800), (45.0, 400))
LAST_SILENCE_MS = 100


def silence_limit_ms(utterance_s: float, requested_ms: int | None = None) -> int:
    """Milliseconds of silence that end an utterance of `utterance_s` seconds: FunASR's schedule, never more
    than the client's `silence_duration_ms` where it set one."""
    scheduled = next((ms for upto, ms in SILENCE_SCHEDULE if utterance_s <= upto), LAST_SILENCE_MS)
    return scheduled if requested_ms is None else min(scheduled, requested_ms)


@dataclass(frozen=True)
class Transition:
    """Speech began (`speech`) or ended (not `speech`) at sample `at` of the stream, found once the stream
    reached sample `found` (the end of the deciding frame). Both fall on whole milliseconds."""

    speech: bool
    at: int
    found: int


def streaming_vad(kind: str = DEFAULT_VAD, threshold: float = DEFAULT_THRESHOLD,
                  silence_ms: int | None = None, origin: int = 0):
    """The detector named `kind` ("silero" or "energy"), with the same settings either way."""
    if kind not in VADS:
        raise OptionError(f"vad must be one of {', '.join(VADS)}; got {kind!r}", "vad")
    return (SileroVad if kind == "silero" else StreamingVad)(threshold, silence_ms, origin)


class SileroVad:
    """Speech start and end of a 16 kHz stream fed in pieces of any size, from Silero VAD's probabilities;
    memory is constant."""

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, silence_ms: int | None = None, origin: int = 0):
        """`threshold` and `silence_ms` as nanoasr.realtime.TurnDetection checks them (threshold 0..1, silence
        0..10000 ms); `origin`: the stream sample the first sample fed will be (transitions count from the
        stream's start)."""
        self.threshold, self.silence_ms, self.origin = threshold, silence_ms, origin
        self.probabilities = silero.SileroStream()
        self.in_speech = False
        self.speech_start = 0  # chunk where the current speech began
        self.run_start: int | None = None  # first chunk of the current run of speech chunks
        self.last_speech: int | None = None  # the latest speech chunk

    def feed(self, samples) -> list[Transition]:
        """The transitions found in `samples` ([N] float32 at 16 kHz, continuing the stream), in order."""
        first = self.probabilities.chunks
        out = []
        for k, p in enumerate(self.probabilities.feed(samples).tolist(), first):
            transition = self._chunk(k, p)
            if transition is not None:
                out.append(transition)
        return out

    def _chunk(self, k: int, p: float) -> Transition | None:
        if p >= self.threshold:
            self.last_speech = k
            if self.run_start is None:
                self.run_start = k
            if not self.in_speech and (k - self.run_start + 1) * CHUNK_MS >= SILERO_MIN_SPEECH_MS:
                self.in_speech, self.speech_start = True, self.run_start
                return Transition(True, self._sample(self.run_start), self._sample(k + 1))
            return None
        if p < self.threshold - NEG_OFFSET:
            self.run_start = None
            if self.in_speech and (k - self.last_speech) * CHUNK_MS >= self.silence_needed_ms(k):
                self.in_speech = False
                return Transition(False, self._sample(self.last_speech + 1), self._sample(k + 1))
        return None

    def pending_end(self) -> int | None:
        """While speech is under way and the latest chunk is not speech: the stream sample where the speech
        ends if the silence goes on (the `at` of the Transition that would end it); else None."""
        chunks = self.probabilities.chunks
        if not self.in_speech or self.last_speech is None or chunks - 1 <= self.last_speech:
            return None
        return self._sample(self.last_speech + 1)

    def _sample(self, chunk: int) -> int:  # the stream sample where `chunk` begins
        return self.origin + chunk * silero.CHUNK

    def silence_needed_ms(self, chunk: int) -> int:
        return silence_limit_ms((chunk - self.speech_start) * silero.CHUNK / SAMPLE_RATE, self.silence_ms)

    def restart(self, at: int) -> None:
        """The current speech is cut at sample `at` (an utterance at its length limit); it goes on as new
        speech from there, so the schedule starts over."""
        self.speech_start = (at - self.origin) // silero.CHUNK

    def end_speech(self) -> None:
        """The current speech was ended from outside (a manual commit or a clear): what follows must start
        speech anew, from chunks after this point."""
        self.in_speech, self.last_speech, self.run_start = False, None, None


class StreamingVad:
    """Speech start and end of a 16 kHz stream fed in chunks of any size; memory is bounded by HISTORY_S."""

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, silence_ms: int | None = None, origin: int = 0):
        """`threshold` and `silence_ms` as nanoasr.realtime.TurnDetection checks them (threshold 0..1, silence
        0..10000 ms); `origin`: the stream sample the first sample fed will be (transitions count from the
        stream's start)."""
        self.offset_db = (threshold - DEFAULT_THRESHOLD) * DB_PER_THRESHOLD
        self.silence_ms, self.origin = silence_ms, origin
        self.tail = np.zeros(0, np.float32)  # samples not yet in a whole frame
        self.frames = 0  # frames measured so far: frame k covers samples [k * HOP, k * HOP + FRAME)
        self.history = np.zeros(0)  # the last HISTORY_S seconds of frame energies, dB
        self.in_speech = False
        self.speech_start = 0  # frame where the current speech began
        self.region_start = 0  # first frame of the current run of speech frames (pauses bridged)
        self.region_peak = -np.inf
        self.last_speech: int | None = None  # the latest speech frame

    def feed(self, samples) -> list[Transition]:
        """The transitions found in `samples` ([N] float32 at 16 kHz, continuing the stream), in order."""
        wave = np.concatenate((self.tail, np.asarray(samples, np.float32)))
        if len(wave) < FRAME:
            self.tail = wave
            return []
        db = frame_db(wave, FRAME, HOP)
        self.tail = wave[len(db) * HOP:]
        self.history = np.concatenate((self.history, db))[-round(HISTORY_S / HOP_S):]
        threshold = speech_threshold(self.history) + self.offset_db
        out = []
        for level in db.tolist():
            transition = self._frame(level, threshold)
            if transition is not None:
                out.append(transition)
            self.frames += 1
        return out

    def _frame(self, level: float, threshold: float) -> Transition | None:
        k = self.frames
        if level > threshold:
            if self.last_speech is None or k - self.last_speech >= round(MIN_PAUSE_S / HOP_S):
                self.region_start, self.region_peak = k, -np.inf
            self.last_speech, self.region_peak = k, max(self.region_peak, level)
            if (not self.in_speech and k - self.region_start + 1 >= round(MIN_SPEECH_S / HOP_S)
                    and self.region_peak > threshold + HYSTERESIS_DB):
                self.in_speech, self.speech_start = True, self.region_start
                return Transition(True, self._sample(self.region_start), self._sample(k) + FRAME)
            return None
        if self.in_speech and (k - self.last_speech) * HOP_S * 1e3 >= self.silence_needed_ms(k):
            self.in_speech = False
            return Transition(False, self._sample(self.last_speech) + FRAME, self._sample(k) + FRAME)
        return None

    def pending_end(self) -> int | None:
        """While speech is under way and the latest frame is not speech: the stream sample where the speech
        ends if the silence goes on (the `at` of the Transition that would end it); else None."""
        if not self.in_speech or self.last_speech is None or self.frames - 1 <= self.last_speech:
            return None
        return self._sample(self.last_speech) + FRAME

    def _sample(self, frame: int) -> int:  # the stream sample where `frame` begins
        return self.origin + frame * HOP

    def silence_needed_ms(self, frame: int) -> int:
        return silence_limit_ms((frame - self.speech_start) * HOP_S, self.silence_ms)

    def restart(self, at: int) -> None:
        """The current speech is cut at sample `at` (an utterance at its length limit); it goes on as new
        speech from there, so the schedule starts over."""
        self.speech_start = (at - self.origin) // HOP

    def end_speech(self) -> None:
        """The current speech was ended from outside (a manual commit or a clear): what follows must start
        speech anew, from frames after this point."""
        self.in_speech, self.last_speech = False, None
