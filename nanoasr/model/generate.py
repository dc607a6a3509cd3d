"""Greedy generation for many prompts through a pool of cache rows: prefill each prompt into a free row, then
advance every unfinished row by one token per step (one pass over the weights for the whole pool). Finished
rows are swapped to the end so the active rows stay a contiguous prefix of the cache, and free rows take the
next prompts.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from nanoasr.backend import array_module, to_numpy
from nanoasr.errors import ModelError
from nanoasr.model import decoder
from nanoasr.model.config import TextConfig
from nanoasr.model.decoder import KVCache
from nanoasr.tensor import StoredTensor, has_nonfinite

MAX_NEW_TOKENS = 512  # hard cap per segment
# A loop is the tail repeating a pattern of `period` tokens at least
# max(MIN_REPEATS, LOOP_TOKENS / period) times.
MAX_PERIOD, MIN_REPEATS, LOOP_TOKENS = 50, 3, 32


def token_budget(duration_s: float) -> int:
    """Tokens allowed for a segment: generous for fast speech (about 12 per second), never past the cap."""
    return min(MAX_NEW_TOKENS, 32 + 12 * math.ceil(max(duration_s, 0.0)))


def loop_start(ids: list[int]) -> int | None:
    """Where a repetition loop's second copy starts in `ids`, or None when the tail does not loop."""
    for period in range(1, MAX_PERIOD + 1):
        repeats = max(MIN_REPEATS, math.ceil(LOOP_TOKENS / period))
        span = period * repeats
        if len(ids) < span:
            continue
        tail = ids[-span:]
        if tail[period:] == tail[:-period]:
            start = len(ids) - span  # extend back over earlier copies of the same pattern
            while start >= period and ids[start - period:start] == ids[start:start + period]:
                start -= period
            return start + period
    return None


@dataclass
class Generation:
    ids: list[int]
    finish_reason: str  # "stop" | "length" | "repetition"
    avg_logprob: float = 0.0


def _greedy(logits, suppress=()):  # [B, vocab] -> (ids [B], log-probability of each choice [B]), host lists
    xp = array_module(logits)
    if suppress:  # forced decoding: stop tokens can never be chosen (as Transformers' min_new_tokens)
        logits[:, list(suppress)] = -np.inf
    ids = xp.argmax(logits, axis=-1)
    top = xp.take_along_axis(logits, ids[:, None], axis=-1)[:, 0]
    logprob = -xp.log(xp.exp(logits - top[:, None]).sum(axis=-1))
    return to_numpy(ids).tolist(), to_numpy(logprob).tolist()


def _holds_nonfinite(t) -> bool:
    if isinstance(t, StoredTensor):
        return has_nonfinite(t)
    return not bool(array_module(t).isfinite(t).all())


def _nonfinite_weights(w) -> ModelError:
    """The error for prefill logits that hold NaN/Inf, naming the weights that do (the rare path, so every
    tensor is read now; dense matrices are not scanned at load)."""
    bad = []
    for name, t in w.items():
        if _holds_nonfinite(t):
            data = t.data if isinstance(t, StoredTensor) else t
            source = getattr(data, "filename", None)  # a memory map knows its file
            bad.append(f"{name} (in {source})" if source else name)
    if not bad:
        return ModelError("the decoder's logits hold NaN or Inf although every weight is finite: the "
                          "activations overflow float32 (weights badly scaled, or an extreme config value)")
    return ModelError(f"the decoder's logits hold NaN or Inf: expected finite weights, found NaN or Inf in "
                      f"{len(bad)} tensor(s): {', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}")


def _finish(ids: list[int], budget: int, stop_ids, ignore_stop: bool) -> Generation | None:
    if not ignore_stop and ids[-1] in stop_ids:
        return Generation(ids[:-1], "stop")
    if len(ids) >= budget:
        return Generation(ids, "length")
    if not ignore_stop:
        cut = loop_start(ids)
        if cut is not None:
            return Generation(ids[:cut], "repetition")
    return None


def _prefill(e, w, cfg: TextConfig, cache: KVCache, row: int, suppress):  # e [L, H] -> first (ids, lps)
    hidden = decoder.forward(e[None], w, cfg, cache, slice(row, row + 1), [0])
    logits = decoder.logits(hidden, w)
    if not to_numpy(array_module(logits).isfinite(logits).all()):  # before `suppress` writes its -inf
        raise _nonfinite_weights(w)
    return _greedy(logits, suppress)


def generate(embeds, budgets, w, cfg: TextConfig, stop_ids, ignore_stop=False, rows=None, timings=None,
             on_done=None):
    """embeds: prompt embeddings [L_b, H]; budgets: new tokens allowed each -> list[Generation], in order.

    At most `rows` prompts decode together (all of them when None); a row that finishes takes the next
    prompt at once, so a long generation never holds up the prompts behind it. `embeds` may be a lazy
    iterable when `rows` is given: it is read only as rows free up. `timings`, when a dict, accumulates
    "prefill" and "decode" milliseconds; `on_done(index, generation)` is called as each prompt finishes.
    `ignore_stop` decodes exactly `budget` tokens, never choosing a stop token (reference comparisons,
    benchmarks).
    """
    suppress = tuple(stop_ids) if ignore_stop else ()
    pool = rows or len(embeds)
    prompts = iter(zip(embeds, budgets))
    cache = None
    results: list[Generation | None] = []
    tokens, logprobs, budget_of = [], [], []
    item_of_row = [0] * pool
    active, exhausted = 0, False
    clock = timings if timings is not None else {}
    while True:
        while active < pool and not exhausted:  # fill free rows: prefill each new prompt into its row
            prompt = next(prompts, None)
            if prompt is None:
                exhausted = True
                break
            e, budget = prompt
            if cache is None:
                cache = KVCache(cfg, pool, len(e) + budget, array_module(e))
            cache.reserve(len(e) + budget)
            start = time.perf_counter()
            ids, lps = _prefill(e, w, cfg, cache, active, suppress)
            clock["prefill"] = clock.get("prefill", 0.0) + (time.perf_counter() - start) * 1e3
            item_of_row[active] = len(results)
            results.append(None)
            tokens.append(ids)
            logprobs.append(lps)
            budget_of.append(budget)
            active += 1
        row, retired = 0, False
        while row < active:  # retire finished rows by swapping them behind the active prefix
            item = item_of_row[row]
            done = _finish(tokens[item], budget_of[item], stop_ids, ignore_stop)
            if done is None:
                row += 1
                continue
            kept = logprobs[item][:len(done.ids)]
            done.avg_logprob = sum(kept) / len(kept) if kept else 0.0
            results[item] = done
            if on_done is not None:
                on_done(item, done)
            active -= 1
            retired = True
            if row != active:
                cache.swap(row, active)
                item_of_row[row], item_of_row[active] = item_of_row[active], item_of_row[row]
        if retired and not exhausted:
            continue
        if active == 0:
            return results
        start = time.perf_counter()
        last = [tokens[item_of_row[r]][-1] for r in range(active)]
        x = decoder.embed(last, w)[:, None, :]  # [B, 1, H]
        hidden = decoder.forward(x, w, cfg, cache, slice(0, active), cache.lengths[:active].copy())
        ids, lps = _greedy(decoder.logits(hidden, w), suppress)
        for r, (t, lp) in enumerate(zip(ids, lps)):
            tokens[item_of_row[r]].append(t)
            logprobs[item_of_row[r]].append(lp)
        clock["decode"] = clock.get("decode", 0.0) + (time.perf_counter() - start) * 1e3
