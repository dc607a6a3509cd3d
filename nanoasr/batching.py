"""Live sessions sharing one Model decode together: each session's thread hands its partial or final decode
to a DecodeScheduler and waits for its own transcript, while the scheduler's thread takes what is queued,
finals before partials, and decodes up to `rows` of them in one Model.transcribe_together call, whose every
decode step is one pass over the weights for all their rows. Each transcript is the one the session's
decode alone would give, token for token.

Decodes asked for while a batch runs wait for the next one, so sessions that ask at about the same time share
it, and no decode waits for a batch to fill. The queue holds at most `max_queue` decodes (MAX_QUEUE by
default: two full batches on the CPU; a partial queued behind more would be stale when decoded): a partial
that finds it full is dropped (its session decodes one again at its next feed); a final takes the place of
the newest queued partial, which is dropped, or waits for room. A session waits for its decode, so it has
at most one queued, and the queue's memory is bounded by its audio (30 s at most per decode).

Finals come first while a batch runs, too: a batch of partials stops (between decode steps) as soon as a final
is queued, and its partials are dropped, so that a final never waits for partials to finish decoding. A
partial whose session no longer needs it (`cancelled`, set by the session) leaves the queue, and a batch
whose every partial is cancelled stops the same way.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from nanoasr.api import Model, Options
from nanoasr.errors import NanoasrError
from nanoasr.model.generate import Stopped
from nanoasr.transcript import Transcript

MAX_QUEUE = 16


@dataclass(eq=False)
class _Request:
    wave: object  # [N] float32 at 16 kHz
    options: Options
    draft: list[int] | None
    final: bool
    cancelled: threading.Event  # set by the session: the decode is no longer wanted
    done: Future = field(default_factory=Future)  # the Transcript, or None: dropped

    @property
    def key(self) -> tuple:  # what decodes taken together must share (Model.transcribe_together)
        return self.options.reference, self.options.ignore_stop

    def answer(self, result: Transcript | None = None, error: BaseException | None = None) -> None:
        if error is not None:
            self.done.set_exception(error)
        else:
            self.done.set_result(result)


class DecodeScheduler:
    """Decodes the live sessions of one Model together. `rows`: decodes in one batch, at most (never more
    than model.together_rows); `max_queue`: decodes waiting, at most;
    `execute(fn, *args)`: runs a batch's decode (by default on the scheduler's own thread; a server passes
    its worker, which runs its other requests in turn)."""

    def __init__(self, model: Model, rows: int | None = None, max_queue: int = MAX_QUEUE, execute=None):
        if rows is not None and rows < 1 or max_queue < 1:
            raise ValueError(f"rows and max_queue must be at least 1; got {rows} and {max_queue}")
        self.model, self.max_queue = model, max_queue
        self.rows = min(rows or model.together_rows, model.together_rows)
        self.execute = execute or (lambda fn, *args: fn(*args))
        self.batches = self.decoded = self.dropped = 0  # batches run, decodes in them, partials dropped
        self.stopped = 0  # batches of partials stopped for a final or for their sessions
        self._queue: list[_Request] = []
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="nanoasr-batching", daemon=True)
        self._thread.start()

    def decode(self, wave, options: Options, draft=None, final: bool = True) -> Transcript | None:
        """The transcript of `wave` (one segment, Model.transcribe_together), decoded with whatever else is
        queued; None for a partial (`final` False) dropped: the queue was full, or a final needed the
        weights."""
        return self.submit(wave, options, draft, final).result()

    def submit(self, wave, options: Options, draft=None, final: bool = True,
               cancelled: threading.Event | None = None) -> Future:
        """`decode`'s answer as a Future, which a caller need not wait on. Setting `cancelled` tells the
        scheduler that a partial is no longer wanted: it answers None without being decoded, or its batch
        stops. A final waits here while the queue is full of finals."""
        request = _Request(wave, options, None if draft is None else list(draft), final,
                           cancelled or threading.Event())
        with self._changed:
            while not self._closed and len(self._queue) >= self.max_queue and not self._displace(request):
                if not final:
                    self.dropped += 1
                    request.answer()
                    return request.done
                self._changed.wait()
            if self._closed:
                raise RuntimeError("the decode scheduler is closed")
            self._queue.append(request)
            self._changed.notify_all()
        return request.done

    def close(self) -> None:
        """Decode what is queued, then stop the scheduler's thread."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join()

    def _displace(self, request: _Request) -> bool:
        """A final takes the place of the newest queued partial, which is dropped; True when it did."""
        partial = next((r for r in reversed(self._queue) if not r.final), None) if request.final else None
        if partial is None:
            return False
        self._queue.remove(partial)
        self.dropped += 1
        partial.answer()
        return True

    def _serve(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._closed:
                    self._changed.wait()
                if not self._queue:
                    return
                batch = self._take()
                self._changed.notify_all()  # room in the queue
            self._run(batch)

    def _take(self) -> list[_Request]:
        """Finals before partials, each in arrival order, up to `rows` of those that can share the first;
        cancelled partials are answered (dropped) on the way."""
        for request in [r for r in self._queue if r.cancelled.is_set() and not r.final]:
            self._queue.remove(request)
            self.dropped += 1
            request.answer()
        if not self._queue:
            return []
        ordered = sorted(self._queue, key=lambda r: not r.final)
        batch = [r for r in ordered if r.key == ordered[0].key][:self.rows]
        for request in batch:
            self._queue.remove(request)
        return batch

    def _stops(self, batch: list[_Request]) -> bool:
        """Whether a running batch of partials gives way: a final is queued, or no partial in it is wanted."""
        if any(r.final for r in batch):
            return False
        with self._changed:
            return any(r.final for r in self._queue) or all(r.cancelled.is_set() for r in batch)

    def _run(self, batch: list[_Request]) -> None:
        """Decode the batch together; where the model refuses one decode's audio, each is decoded alone so
        that the refusal goes to its own session only."""
        if not batch:
            return
        try:
            results = self.execute(self.model.transcribe_together,
                                   [(r.wave, r.options, r.draft) for r in batch], lambda: self._stops(batch))
        except Stopped:
            self.stopped, self.dropped = self.stopped + 1, self.dropped + len(batch)
            for request in batch:
                request.answer()
            return
        except NanoasrError as exc:
            if len(batch) == 1:
                batch[0].answer(error=exc)
                return
            for request in batch:
                self._run([request])
            return
        except BaseException as exc:  # a fault of the server's: every waiting session hears of it
            for request in batch:
                request.answer(error=exc)
            return
        self.batches, self.decoded = self.batches + 1, self.decoded + len(batch)
        for request, result in zip(batch, results):
            request.answer(result)
