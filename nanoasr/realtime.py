"""Live transcription: a session fed audio as it arrives, on a shared Model, giving speech starts and stops,
partial text while an utterance goes on, and the exact final text of each utterance.

- Endpointing (nanoasr.audio.vad): Silero VAD's speech probability every 32 ms (or, as `Limits.vad`
  "energy", the energy detector frame by frame), with FunASR's silence schedule (the silence that ends an
  utterance shrinks as it grows), never longer than the client's silence_duration_ms.
  Without turn detection the client ends each utterance with `commit`.
- Partials: every PARTIAL_INTERVAL_S of new audio the utterance is decoded again, over at most
  PARTIAL_WINDOW_S seconds (past that the window starts afresh where the last partial ended, and the text of
  that partial is kept as read), so a partial costs the same however long the utterance grows. Only text that
  two consecutive partials agree on goes out (LocalAgreement-2), as append-only deltas. Each partial gives the
  previous partial's token ids to the decoder as a draft (Model.transcribe's `draft`): it is exact greedy
  decoding of its window still, just cheaper where the draft holds.
- Finals: the text of an utterance is `Model.transcribe` of its audio with the session's options, exactly
  (the same token ids). The ids of the partials that cover the utterance from its start (the closed windows'
  and the last one's) are its draft: verified in the prompt's forward, they cost one prefill where they are
  right, and the final decodes on from the first token that differs. Where the final differs from text
  already sent as deltas, the deltas stand (they are never retracted) and `Completed` carries the
  authoritative text; otherwise its remainder goes out as a last delta, so the deltas spell the final.
- Finals ahead: while the detector hears silence after speech (its `pending_end`), the audio that silence's
  endpoint would finalize is known once the silence has lasted TAIL_MS; the feed's decode is then that final
  instead of a partial, and the endpoint finds it decoded. Speech that comes back makes it a wasted decode,
  in place of a partial that would have read the pause.
- Memory: an utterance is cut, and finalized, at MAX_UTTERANCE_S; between utterances only the pre-roll is
  kept. A session holds at most MAX_UTTERANCE_S + PREROLL_S seconds of audio, whatever the stream's length.

The session is single-threaded: each call runs the decodes it needs before it returns, at most one partial
(or final ahead) per `feed`, so a caller that batches audio when decoding falls behind gets fewer partials,
never a growing queue of them. Sessions that share a model may share a nanoasr.batching.DecodeScheduler
(`scheduler`), which decodes their partials and finals together, each with the same token ids; a partial
the scheduler drops (its queue is full, or a final needed the weights) is decoded again at the next feed.
A caller may instead decode partials elsewhere while the session goes on listening (the server does):
`feed(samples, partial=False)`, then `next_partial()` hands out the partial due as a PartialJob, whose
transcript goes back to `partial_done`. A partial out when its utterance ends, or when its final is decoded
ahead, is cancelled (`PartialJob.cancelled`), so the final does not wait for it.
"""
from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from nanoasr.api import Model, Options, join_texts
from nanoasr.audio import SAMPLE_RATE
from nanoasr.audio.vad import DEFAULT_THRESHOLD, DEFAULT_VAD, VADS, Transition, streaming_vad
from nanoasr.errors import AudioError, NanoasrError, OptionError
from nanoasr.transcript import Transcript

PARTIAL_INTERVAL_S = 0.48  # FunASR's decode interval: a first word about half a second after speech starts
PARTIAL_WINDOW_S = 8.0  # FunASR 1.4.16's partial window: re-encoding costs O(window^2), so it is bounded
MAX_UTTERANCE_S = 30.0  # the decoder reads at most 30 s at once; longer speech is cut and finalized here
MIN_COMMIT_MS = 100  # OpenAI refuses a commit of less audio
TAIL_MS = 300  # audio kept after an utterance's last speech frame: word tails under the threshold
TAIL = TAIL_MS * SAMPLE_RATE // 1000
PREROLL_S = 2.0  # audio kept between utterances beyond the prefix padding: speech is confirmed after it began
PIECE = SAMPLE_RATE // 10  # endpointed 0.1 s at a time: an utterance is cut within 0.1 s of its limit


@dataclass(frozen=True)
class TurnDetection:
    """OpenAI's server_vad settings. `silence_duration_ms` None: FunASR's schedule alone."""

    threshold: float = DEFAULT_THRESHOLD
    prefix_padding_ms: int = 300
    silence_duration_ms: int | None = None

    def __post_init__(self):
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) \
                or not 0.0 <= self.threshold <= 1.0:
            raise OptionError(f"threshold must be a number between 0 and 1; got {self.threshold!r}",
                              "threshold")
        for name in ("prefix_padding_ms", "silence_duration_ms"):
            value = getattr(self, name)
            if value is None and name == "silence_duration_ms":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10_000:
                raise OptionError(f"{name} must be a whole number of milliseconds from 0 to 10000; got "
                                  f"{value!r}", name)


@dataclass(frozen=True)
class Limits:
    """What one session may do: partial cadence and window, the longest utterance, the detector that endpoints
    it (`vad`: "silero" or "energy"). `catch_up_s`: a caller that gathers audio while decoding runs (the
    server) skips the partial of a feed holding more than this, so a session that has fallen behind catches
    up before it decodes partials again."""

    partial_interval_s: float = PARTIAL_INTERVAL_S
    partial_window_s: float = PARTIAL_WINDOW_S
    max_utterance_s: float = MAX_UTTERANCE_S
    partials: bool = True
    catch_up_s: float = 1.0
    vad: str = DEFAULT_VAD

    def __post_init__(self):
        if self.vad not in VADS:
            raise OptionError(f"vad must be one of {', '.join(VADS)}; got {self.vad!r}", "vad")
        if not 0 < self.partial_interval_s <= self.partial_window_s:
            raise OptionError("partial_interval_s must be positive and at most partial_window_s; got "
                              f"{self.partial_interval_s} and {self.partial_window_s}", "partial_interval_s")
        if not 1.0 <= self.max_utterance_s <= MAX_UTTERANCE_S:
            raise OptionError(f"max_utterance_s must be between 1 and {MAX_UTTERANCE_S}; got "
                              f"{self.max_utterance_s}", "max_utterance_s")


# --- events: what a session reports, in order; items are numbered from 0 ----------------------------------

@dataclass(frozen=True)
class SpeechStarted:
    item: int
    audio_start_ms: int  # since the session's first sample, prefix padding included


@dataclass(frozen=True)
class SpeechStopped:
    item: int
    audio_end_ms: int  # the end of the utterance's audio: its last speech frame and a short tail


@dataclass(frozen=True)
class Committed:
    item: int
    audio_start_ms: int
    audio_end_ms: int


@dataclass(frozen=True)
class Delta:
    item: int
    text: str


@dataclass(frozen=True)
class Failed:
    item: int
    message: str


@dataclass(frozen=True)
class Completed:
    item: int
    transcript: str
    token_ids: tuple[int, ...]
    seconds: float  # the utterance's audio


class _Audio:
    """The stream's recent samples: [start, end) of the stream, in a buffer that grows by doubling."""

    def __init__(self, start: int):
        self.data = np.zeros(SAMPLE_RATE, np.float32)
        self.start = self.end = start

    def append(self, samples) -> None:
        used = self.end - self.start
        if used + len(samples) > len(self.data):
            grown = np.zeros(max(2 * len(self.data), used + len(samples)), np.float32)
            grown[:used] = self.data[:used]
            self.data = grown
        self.data[used:used + len(samples)] = samples
        self.end += len(samples)

    def span(self, a: int, b: int):  # stream samples [a, b) -> a copy
        return self.data[a - self.start:b - self.start].copy()

    def drop_before(self, at: int) -> None:
        at = min(max(at, self.start), self.end)
        kept = self.end - at
        self.data[:kept] = self.data[at - self.start:self.end - self.start]
        self.start = at
        if len(self.data) > 4 * max(kept, SAMPLE_RATE):  # an utterance's room is given back after it
            self.data = self.data[:2 * max(kept, SAMPLE_RATE)].copy()


def ms(sample: int) -> int:
    return sample * 1000 // SAMPLE_RATE


def _check_samples(samples):
    samples = np.asarray(samples)
    if samples.ndim != 1 or samples.dtype != np.float32:
        raise AudioError(f"a live session takes 1-D float32 samples at {SAMPLE_RATE} Hz; got {samples.dtype} "
                         f"of shape {samples.shape}")
    if not np.isfinite(samples).all():
        raise AudioError("a live session takes finite samples; got NaN or infinity")
    return samples


class LiveSession:
    """One live stream over a shared Model. `feed`, `commit`, `clear` and `finish` return the events they
    cause, in order; `turn_detection` None means the client commits each utterance itself."""

    def __init__(self, model: Model, options: Options | None = None,
                 turn_detection: TurnDetection | None = TurnDetection(), limits: Limits = Limits(),
                 start: int = 0, scheduler=None):
        """`start`: the stream sample the first sample fed will be (a session that replaces another one on
        the same stream keeps its clock). `scheduler`: a DecodeScheduler of `model` that decodes this
        session's utterances together with other sessions' (None: each decode runs alone here)."""
        self.model, self.options, self.limits = model, options or Options(), limits
        self.scheduler = scheduler
        model.check_options(self.options.language, self.options.word_timestamps)
        self.turn_detection = turn_detection
        self.vad = None if turn_detection is None else streaming_vad(
            limits.vad, turn_detection.threshold, turn_detection.silence_duration_ms, start)
        self.audio = _Audio(start)
        self.items = 0  # items numbered so far
        self.item: int | None = None  # the utterance under way (server VAD), with its start sample
        self.item_start = 0
        self.partial = _Partials(0, 0)
        self.ahead: _Ahead | None = None  # the final decoded before its endpoint, for the utterance under way
        self.out: PartialJob | None = None  # the partial handed out by next_partial, not given back yet

    @property
    def stream_ms(self) -> int:
        """The stream's length so far (the clock of every event's times)."""
        return ms(self.audio.end)

    @property
    def buffered_ms(self) -> int:
        """Audio a commit would take now."""
        start = self.item_start if self.item is not None else self.audio.start
        return ms(self.audio.end - start)

    def feed(self, samples, partial: bool = True) -> list:
        """Endpoint `samples` ([N] float32, 16 kHz, continuing the stream); at most one decode besides the
        finals of utterances that ended (a partial, or a final decoded ahead), none when not `partial` (a
        caller that has fallen behind catches up first, or one that decodes partials elsewhere)."""
        samples = _check_samples(samples)
        events = []
        for i in range(0, len(samples), PIECE):
            events += self._piece(samples[i:i + PIECE])
        if partial:
            job = self.next_partial()
            if job is not None:
                try:
                    transcript = self._transcribe(job.wave, job.draft, final=False)
                except BaseException:
                    self.cancel_partial()
                    raise
                events += self.partial_done(job, transcript)
        return events

    def commit(self) -> list:
        """End the utterance now (or take the audio held since the last one): AudioError under 100 ms."""
        if self.buffered_ms < MIN_COMMIT_MS:
            raise AudioError(f"buffer too small. Expected at least {MIN_COMMIT_MS}ms of audio, but buffer "
                             f"only has {self.buffered_ms:.2f}ms of audio.")
        if self.item is None:
            self._begin(self.audio.start)
        if self.vad is not None:
            self.vad.end_speech()
        return self._finalize(self.audio.end, stopped=False)

    def clear(self) -> None:
        """Drop the audio held and the utterance under way (it gets no final)."""
        self.cancel_partial()
        self.audio.drop_before(self.audio.end)
        self.item = None
        if self.vad is not None:
            self.vad.end_speech()

    def finish(self) -> list:
        """The stream ended: the utterance under way is finalized (manual mode: the audio held, when it is
        enough to commit)."""
        if self.item is not None or (self.vad is None and self.buffered_ms >= MIN_COMMIT_MS):
            return self.commit()
        return []

    def _begin(self, at: int) -> None:
        """A new item starts at stream sample `at`."""
        self.item_start, self.item, self.items = at, self.items, self.items + 1
        self.partial = _Partials(at, at + int(self.limits.partial_interval_s * SAMPLE_RATE))
        self.ahead = None
        self.cancel_partial()

    def _piece(self, samples) -> list:
        self.audio.append(samples)
        events = []
        if self.vad is None:
            if self.audio.end - self.audio.start >= self._max_samples:
                self._begin(self.audio.start)
                events += self._finalize(self.audio.start + self._max_samples, stopped=False)
            return events
        for transition in self.vad.feed(samples):
            events += self._transition(transition)
        if self.item is not None and self.audio.end - self.item_start >= self._max_samples:
            cut = self.item_start + self._max_samples
            events += self._finalize(cut, stopped=True)
            self.vad.restart(cut)
            events.append(self._start(cut))
        if self.item is None:
            pad = self.turn_detection.prefix_padding_ms * SAMPLE_RATE // 1000
            self.audio.drop_before(self.audio.end - pad - int(PREROLL_S * SAMPLE_RATE))
        return events

    @property
    def _max_samples(self) -> int:
        return int(self.limits.max_utterance_s * SAMPLE_RATE)

    def _transition(self, t: Transition) -> list:
        if t.speech:
            pad = self.turn_detection.prefix_padding_ms * SAMPLE_RATE // 1000
            return [self._start(max(self.audio.start, t.at - pad))]
        if self.item is None:  # the speech was committed or cleared already
            return []
        return self._finalize(max(self.item_start, min(t.at + TAIL, t.found)), stopped=True)

    def _start(self, at: int) -> SpeechStarted:
        self._begin(at)
        return SpeechStarted(self.item, ms(at))

    def _finalize(self, end: int, stopped: bool) -> list:
        """The utterance [item_start, end) ends: stopped, committed, its final; the audio after it stays."""
        item, start = self.item, self.item_start
        self.cancel_partial()
        events = [SpeechStopped(item, ms(end))] if stopped else []
        events.append(Committed(item, ms(start), ms(end)))
        try:
            events += self._final(item, start, end)
        except NanoasrError as exc:  # the model refused this audio; the session goes on
            events.append(Failed(item, str(exc)))
        finally:
            self.audio.drop_before(end)
            self.item = None
        return events

    def _final(self, item: int, start: int, end: int) -> list:
        ahead, self.ahead = self.ahead, None
        transcript = None
        if ahead is not None and (ahead.item, ahead.end) == (item, end):
            transcript = ahead.transcript  # the same audio and options: the same transcript
        if transcript is None:
            transcript = self._final_transcript(start, end)
        text, ids = "", ()
        if transcript is not None:
            text = transcript.text
            ids = tuple(t for segment in transcript.segments for t in segment.token_ids)
        sent = self.partial.sent
        tail = [Delta(item, text[len(sent):])] if text.startswith(sent) and len(text) > len(sent) else []
        return tail + [Completed(item, text, ids, (end - start) / SAMPLE_RATE)]

    def _final_transcript(self, start: int, end: int) -> Transcript | None:
        """The transcript of stream samples [start, end) of the utterance under way, with the partials' draft;
        None for less than MIN_COMMIT_MS of audio, which is no speech (a cut at the limit)."""
        if end - start < MIN_COMMIT_MS * SAMPLE_RATE // 1000:
            return None
        return self._transcribe(self.audio.span(start, end), self.partial.draft(), final=True)

    def _transcribe(self, wave, draft, final: bool):  # -> Transcript, or None: a partial that was dropped
        if self.scheduler is not None:
            return self.scheduler.decode(wave, self.options, draft, final)
        return self.model.transcribe(wave, sample_rate=SAMPLE_RATE, draft=draft,
                                     **dataclasses.asdict(self.options))

    def next_partial(self) -> "PartialJob | None":
        """The decode after a feed. While the detector hears silence after speech: once the audio that
        silence's endpoint would finalize is here, that final, decoded ahead here so that the endpoint finds
        it done (a partial out is cancelled; none is handed out: it would only read the silence); None. Else
        the partial, when it is due and none is out, for the caller to decode and give back to
        `partial_done`."""
        if self.item is None or not self.limits.partials:
            return None
        pending = None if self.vad is None else self.vad.pending_end()
        if pending is None:
            if self.out is not None or self.audio.end < self.partial.due:
                return None
            return self._hand_out()
        end = max(self.item_start, pending + TAIL)  # as _transition ends the utterance, when that is after it
        if self.audio.end >= end and (self.ahead is None or self.ahead.end != end):
            self.cancel_partial()
            transcript = None
            try:
                transcript = self._final_transcript(self.item_start, end)
            except NanoasrError:  # the final decodes it again, and reports the failure
                pass
            self.ahead = _Ahead(self.item, end, transcript)
        return None

    def partial_done(self, job: "PartialJob", transcript: Transcript | None) -> list:
        """The partial `job` decoded (None: dropped, or it failed): the newly agreed text, if any, as a delta;
        nothing for a job cancelled since."""
        if job is not self.out:
            return []
        self.out, state = None, self.partial
        text = state.close_window() if job.closes else ""
        if transcript is not None:
            ids = [t for segment in transcript.segments for t in segment.token_ids]
            text += state.agree(ids, self.model.tokenizer.decode, job.end)
            state.due = job.end + int(self.limits.partial_interval_s * SAMPLE_RATE)
        return [Delta(self.item, text)] if text else []

    def submit_partial(self, job: "PartialJob") -> Future:
        """Hand `job` to the session's scheduler (it must have one): its answer, for partial_answered."""
        return self.scheduler.submit(job.wave, self.options, job.draft, False, job.cancelled)

    def partial_answered(self, job: "PartialJob", answer: Future) -> list:
        """partial_done of a job's finished answer (submit_partial): a decode the model refused counts as
        dropped (the final decodes the same audio, and reports the failure); any other fault is raised."""
        failure = answer.exception()
        if failure is not None and not isinstance(failure, NanoasrError):
            raise failure
        return self.partial_done(job, None if failure is not None else answer.result())

    def cancel_partial(self) -> None:
        """The partial out, if any, is no longer wanted."""
        if self.out is not None:
            self.out.cancelled.set()
            self.out = None

    def _hand_out(self) -> "PartialJob":
        """The partial window up to now; past PARTIAL_WINDOW_S the window starts afresh where the last
        partial ended (closed when the job is given back: its text is taken as read)."""
        state, end = self.partial, self.audio.end
        long = end - state.window_start > self.limits.partial_window_s * SAMPLE_RATE
        closes = bool(long and state.covered)
        start = state.covered if closes else state.window_start
        self.out = PartialJob(self.item, end, closes, self.audio.span(start, end),
                              None if closes else state.previous)
        return self.out


@dataclass(eq=False)
class PartialJob:
    """A partial to decode: Model.transcribe of `wave` (16 kHz) with the session's options and `draft`. `end`:
    the stream sample the window ends at; `closes`: the window before it is closed when it is given back.
    `cancelled` is set when the session no longer needs it."""

    item: int
    end: int
    closes: bool
    wave: np.ndarray
    draft: list[int] | None
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class _Ahead:
    """The final of utterance `item` if it ends at stream sample `end`: decoded while its endpoint's
    silence went on (None: too little audio, or that decode failed; the final decodes it again)."""

    item: int
    end: int
    transcript: Transcript | None


class _Partials:
    """LocalAgreement-2 over one utterance's partials: the text two consecutive decodes of a window agree on,
    after the text of the windows before it."""

    def __init__(self, start: int, due: int):
        self.due = due  # the stream sample at which the next partial is decoded
        self.window_start = start  # the window's first stream sample: the utterance's, until it is closed
        self.covered = 0  # the stream sample the last partial decoded up to (0: none yet)
        self.previous: list[int] | None = None  # the last partial's token ids
        self.closed_ids: list[int] = []  # the token ids of the closed windows' last partials, in order
        self.previous_text = ""
        self.before = ""  # the text of the closed windows
        self.sent = ""  # the text sent as deltas, append-only

    def agree(self, ids: list[int], decode, end: int) -> str:
        """The text to send after a partial that decoded `ids` up to stream sample `end`."""
        agreed = []
        if self.previous is not None:
            for a, b in zip(self.previous, ids):
                if a != b:
                    break
                agreed.append(a)
        self.previous, self.covered = ids, end
        self.previous_text = decode(ids).strip()
        return self._extend(decode(agreed).rstrip("\ufffd").strip())

    def close_window(self) -> str:
        """The window ends where the last partial did, its text taken as read; the part not yet sent."""
        self.before = join_texts([self.before, self.previous_text])
        self.closed_ids += self.previous
        self.window_start, self.previous = self.covered, None
        return self._extend("")

    def draft(self) -> list[int] | None:
        """The token ids the partials read from the utterance's start: the final's draft (None before any)."""
        ids = self.closed_ids + (self.previous or [])
        return ids or None

    def _extend(self, window_text: str) -> str:
        text = join_texts([self.before, window_text])
        if not text.startswith(self.sent) or len(text) == len(self.sent):
            return ""
        new, self.sent = text[len(self.sent):], text
        return new
