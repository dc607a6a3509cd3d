"""Greedy generation for many prompts through a pool of cache rows (a decoder.Session): admit prompts into
free rows (prefilled together), retire the rows that are done, and step every active row by one token (one
pass over the weights for the whole pool). Retiring moves the last active row into the freed one, so the
active rows stay a contiguous prefix of the cache, and free rows take the next prompts.

A prompt may come with a draft: token ids guessed to follow it (a previous decode of the same audio). The
draft is verified in the prompt's prefill forward (decoder.Session.prefill_draft) and its longest prefix that
greedy decoding would choose is kept, with the choice after it; decoding goes on from there. The result is
greedy decoding's, token for token, because each draft position is computed as a decode step computes it
(the same kernels on one row's bits, the cache holding the same positions): its logits, so its greedy
choice, are the step's bits. A position computed inside the prefill's many-row products would not do:
BLAS, the int8 GEMM and the bf16 GEMM sum in another order than the decode kernels, so a logit of a
prefilled position differs from the step's in its last bits on every product path (tests/test_draft.py
shows it), and in a near tie verification would then accept a token greedy decoding does not choose.
Where the device does not promise those bits (ops.decode_rows is 0: the GPU), drafts are not used.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from nanoasr.errors import ModelError
from nanoasr.model import decoder
from nanoasr.model.config import TextConfig
from nanoasr.ops import decode_rows, greedy_choice
from nanoasr.tensor import StoredTensor, has_nonfinite
from nanoasr.xp import array_module, to_numpy

MAX_NEW_TOKENS = 512  # hard cap per segment
# Prompts admitted together are prefilled in one forward (one pass over the weights for all of them), longest
# first, while their positions, each padded to the longest, stay within PREFILL_POSITIONS and the padding
# adds at most PREFILL_PADDING of the real positions' work; otherwise the next prompt starts another forward.
PREFILL_POSITIONS, PREFILL_PADDING = 4096, 0.25
# A loop is the tail repeating a pattern of `period` tokens at least
# max(MIN_REPEATS, LOOP_TOKENS / period) times.
MAX_PERIOD, MIN_REPEATS, LOOP_TOKENS = 50, 3, 32


class Stopped(Exception):
    """generate's `stop()` said so before a prefill or a decode step: its generations were given up."""


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


def settled_length(ids: list[int], ignore_stop: bool = False) -> int:
    """How many leading ids of an unfinished generation no stopping rule can take back. The repetition guard
    cuts a loop back to its first copy, so an id stays open while the tail repeats with some period from
    before it: a loop of that period may yet form there. The last id is never a stop id here (its row
    would have finished)."""
    n, settled = len(ids), len(ids)
    if ignore_stop:  # no guard: every id chosen is kept
        return n
    for period in range(1, MAX_PERIOD + 1):
        run = min(period, n)  # the longest tail that repeats with this period
        while run < n and ids[n - run - 1] == ids[n - run - 1 + period]:
            run += 1
        settled = min(settled, n - run + period)  # loop_start keeps ids before its second copy
    return settled


@dataclass
class Generation:
    ids: list[int]
    finish_reason: str  # "stop" | "length" | "repetition"
    avg_logprob: float = 0.0


def _greedy(logits, suppress=()):  # [B, vocab] -> (ids [B], log-probability of each choice [B]), host lists
    if suppress:  # forced decoding: stop tokens can never be chosen (as Transformers' min_new_tokens)
        logits[:, list(suppress)] = -np.inf
    ids, logprobs = greedy_choice(logits)
    return to_numpy(ids).tolist(), to_numpy(logprobs).tolist()


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


def first_finish(ids: list[int], budget: int, stop_ids, ignore_stop: bool) -> list[int]:
    """`ids` cut after the first token at which a stopping rule ends the generation (greedy decoding checks
    them after each token), or whole."""
    for end in range(1, len(ids)):
        if _finish(ids[:end], budget, stop_ids, ignore_stop) is not None:
            return ids[:end]
    return ids


def _draft_choices(session: decoder.Session, embeds, draft: list[int], budget: int, suppress):
    """Prefill a prompt [L, H] with its draft and keep the draft's longest prefix greedy decoding chooses ->
    (ids, log-probabilities): that prefix and the greedy choice after it. The row keeps the positions of the
    kept draft tokens only."""
    hidden = session.prefill_draft(embeds, draft, budget)  # [1 + k, H]
    per, row = decode_rows(hidden), session.active - 1
    ids, lps = [], []
    for a in range(0, len(hidden), per):  # the head a few rows at a time, up to the first rejected token
        logits = decoder.logits(hidden[a:a + per], session.w)
        if a == 0 and not to_numpy(array_module(logits).isfinite(logits).all()):
            raise _nonfinite_weights(session.w)
        chosen, chosen_lps = _greedy(logits, suppress)
        ids += chosen
        lps += chosen_lps
        kept = next((j for j, token in enumerate(draft) if j >= len(ids) or ids[j] != token), len(draft))
        if kept < len(ids):
            break
    session.rewind(row, len(embeds) + kept)
    return ids[:kept + 1], lps[:kept + 1]


def _first_choices(session: decoder.Session, group, suppress):  # [(item, (e [L, H], budget))] -> (ids, lps)
    logits = session.prefill_many([e for _, (e, _) in group], [budget for _, (_, budget) in group])
    if not to_numpy(array_module(logits).isfinite(logits).all()):  # before `suppress` writes its -inf
        raise _nonfinite_weights(session.w)
    return _greedy(logits, suppress)


def _prefill_groups(waiting, alone: bool):  # [(item, (e [L, H], budget))] -> runs of them, longest first,
    # each prefilled in one forward (each prompt in its own where `alone`)
    def length(prompt):
        return len(prompt[1][0])
    group, real = [], 0
    for prompt in sorted(waiting, key=length, reverse=True):
        padded = length(group[0] if group else prompt) * (len(group) + 1)  # the first is the longest
        if group and (alone or padded > PREFILL_POSITIONS
                      or padded > (1 + PREFILL_PADDING) * (real + length(prompt))):
            yield group
            group, real = [], 0
        group.append(prompt)
        real += length(prompt)
    if group:
        yield group


@dataclass
class _Row:  # the prompt one cache row decodes
    item: int  # its index among the prompts
    budget: int
    ids: list[int]
    logprobs: list[float]


def _untimed(stage: str):  # the stage context when no timer is given
    return nullcontext()


def generate(embeds, budgets, w, cfg: TextConfig, stop_ids, ignore_stop=False, rows=None, timer=None,
             on_done=None, bf16_rope=False, on_tokens=None, drafts=None, alone_prefills=False, stop=None):
    """embeds: prompt embeddings [L_b, H]; budgets: new tokens allowed each -> list[Generation], in order.

    At most `rows` prompts decode together (all of them when None); a row that finishes takes the next
    prompt at once, so a long generation never holds up the prompts behind it. `embeds` may be a lazy
    iterable when `rows` is given: it is read only as rows free up. `timer`, when given (nanoasr.api.Timer),
    times the "prefill" and "decode" stages; `on_done(index, generation)` is called as each prompt finishes,
    and `on_tokens(index, ids)` before each decode step for each prompt still decoding, with its settled ids
    (settled_length).
    `ignore_stop` decodes exactly `budget` tokens, never choosing a stop token (reference comparisons,
    benchmarks). `bf16_rope`: the funasr profile's rotary frequencies (decoder.Session).
    `drafts` {index: token ids}: drafts of the prompts that have one (see the module's docstring); each such
    prompt is prefilled alone, and the generations are those without drafts.
    `alone_prefills`: every prompt is prefilled in its own forward, as a call decoding it alone would, so
    that prompts of separate calls decoded together each get their own call's tokens (the decode steps'
    products give each row its bits alone, up to ops.decode_rows rows; a prefill's products of many rows
    are not promised to).
    `stop()`, when given, is asked before prompts are read (a lazy `embeds` may encode audio there), before
    each prefill and before each decode step: True gives every generation up, raising Stopped (live partials
    that a final needs the weights for).
    """
    suppress = tuple(stop_ids) if ignore_stop else ()
    session = decoder.Session(w, cfg, rows or len(embeds), bf16_rope)
    prompts = enumerate(zip(embeds, budgets))
    live: list[_Row] = []  # live[r] is decoded in cache row r
    results: dict[int, Generation] = {}
    stage = timer.stage if timer is not None else _untimed
    exhausted = False
    # a draft holds at most budget - 1 tokens: the last token a budget allows is never fed back
    drafts = {item: list(draft)[:budgets[item] - 1] for item, draft in (drafts or {}).items()}
    while True:
        _check(stop)
        exhausted = exhausted or _admit(session, prompts, live, stage, drafts,
                                        (stop_ids, ignore_stop, alone_prefills), stop)
        retired = _retire(session, live, results, stop_ids, ignore_stop, on_done)
        if retired and not exhausted:  # freed rows take the next prompts first
            continue
        if not live:
            return [results[item] for item in range(len(results))]
        if on_tokens is not None:
            for row in live:
                on_tokens(row.item, row.ids[:settled_length(row.ids, ignore_stop)])
        _check(stop)
        with stage("decode"):
            ids, lps = _greedy(session.step([row.ids[-1] for row in live]), suppress)
            for row, token, lp in zip(live, ids, lps):
                row.ids.append(token)
                row.logprobs.append(lp)


def _check(stop) -> None:
    if stop is not None and stop():
        raise Stopped


def _admit(session: decoder.Session, prompts, live: list[_Row], stage, drafts: dict, stopping,
           stop=None) -> bool:
    """Prefill the next prompts into the free rows: each with a draft alone, with it (_draft_choices), the
    others together where they fit one forward (unless `alone`); True once no prompt is left. `stopping`:
    (stop ids, ignore_stop, alone); `stop` as generate's."""
    stop_ids, ignore_stop, alone = stopping
    suppress = tuple(stop_ids) if ignore_stop else ()
    waiting, exhausted = [], False
    while session.active + len(waiting) < session.rows:
        prompt = next(prompts, None)
        if prompt is None:
            exhausted = True
            break
        item, (e, budget) = prompt
        _check(stop)
        if drafts.get(item) and decode_rows(e):  # no draft where the device does not promise a step's bits
            with stage("prefill"):
                ids, lps = _draft_choices(session, e, drafts[item], budget, suppress)
            ids = first_finish(ids, budget, stop_ids, ignore_stop)
            live.append(_Row(item, budget, ids, lps[:len(ids)]))
            continue
        waiting.append(prompt)
    for group in _prefill_groups(waiting, alone):
        _check(stop)
        with stage("prefill"):
            ids, lps = _first_choices(session, group, suppress)
        live.extend(_Row(item, budget, [i], [lp]) for (item, (_, budget)), i, lp in zip(group, ids, lps))
    return exhausted


def _retire(session: decoder.Session, live: list[_Row], results: dict, stop_ids, ignore_stop: bool,
            on_done) -> bool:
    """Finish the rows whose generation is over, in row order; True when any was."""
    r, retired = 0, False
    while r < len(live):
        row = live[r]
        done = _finish(row.ids, row.budget, stop_ids, ignore_stop)
        if done is None:
            r += 1
            continue
        kept = row.logprobs[:len(done.ids)]
        done.avg_logprob = sum(kept) / len(kept) if kept else 0.0
        results[row.item] = done
        if on_done is not None:
            on_done(row.item, done)
        session.retire(r)  # the last active row moves into row r, and is checked next
        live[r] = live[-1]
        live.pop()
        retired = True
    return retired
