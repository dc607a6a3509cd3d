"""The engine against pinned Transformers 5.23 references of the committed tiny checkpoint (no torch needed).

tests/fixtures/tiny/reference.npz is written by tools/reference/fixture.py from Transformers'
FunAsrNanoForConditionalGeneration; nothing in it comes from nanoasr.
"""
from pathlib import Path

import numpy as np
import pytest

from nanoasr.api import Timer
from nanoasr.model import decoder, generate
from tools.lib.parity import cases, check_case, full_sequence_logits, stage_outputs, teacher_forced_logits
from tools.reference.dump import CASES, FORCED_TOKENS

REFS = np.load(Path(__file__).parent / "fixtures" / "tiny" / "reference.npz")
PROMPTS = {name: options for name, _, _, options in CASES}


@pytest.mark.parametrize("reference", ["funasr", "transformers"])
@pytest.mark.parametrize("name", list(PROMPTS))
def test_stages_logits_and_greedy_ids_match_transformers(tiny_model, reference, name):
    ref = cases(REFS, reference)[name]
    assert len(ref["greedy_ids"]) == FORCED_TOKENS > 64
    ids = check_case(tiny_model, ref, reference, PROMPTS[name])
    assert len(set(ids)) > 5, "the fixture's greedy output should not be one repeated token"


def test_kv_cache_steps_equal_full_sequence_logits(tiny_model):
    ref = cases(REFS, "funasr")["hotwords"]
    ours = stage_outputs(tiny_model, ref["wave"], "funasr", PROMPTS["hotwords"])
    forced = ref["greedy_ids"][:12]
    stepped = teacher_forced_logits(tiny_model, ours["embeds"], forced, len(forced) + 1)
    full = full_sequence_logits(tiny_model, ours["embeds"], forced)
    np.testing.assert_allclose(stepped, full, atol=1e-4, rtol=1e-4)


PREFILL_BOUNDS = [((4096, 1.0), [3]), ((generate.PREFILL_POSITIONS, generate.PREFILL_PADDING), [1, 2]),
                  ((60, 1.0), [1, 1, 1])]


@pytest.mark.parametrize("bounds, forwards_made", PREFILL_BOUNDS)
def test_batched_generation_equals_sequential(tiny_model, monkeypatch, bounds, forwards_made):
    """Prompts of lengths 26, 37 and 80 prefilled together (all in one forward; the longest alone, since
    padding the others to it would add more than a quarter; or each alone under a bound of 60 positions)
    get the tokens each gets alone."""
    monkeypatch.setattr(generate, "PREFILL_POSITIONS", bounds[0])
    monkeypatch.setattr(generate, "PREFILL_PADDING", bounds[1])
    forwards = []
    prefill_many = decoder.Session.prefill_many

    def counted(self, prompts, rooms):
        forwards.append(len(prompts))
        return prefill_many(self, prompts, rooms)
    monkeypatch.setattr(decoder.Session, "prefill_many", counted)
    embeds, budgets = [], []
    for name, options in PROMPTS.items():
        ref = cases(REFS, "funasr")[name]
        embeds.append(stage_outputs(tiny_model, ref["wave"], "funasr", options)["embeds"])
        budgets.append(20 + 7 * len(budgets))  # different budgets: rows finish at different steps
    w, cfg, stops = tiny_model.weights, tiny_model.config.text, tiny_model.tokenizer.stop_ids
    together = generate.generate(embeds, budgets, w, cfg, stops, ignore_stop=True)
    assert sorted(len(e) for e in embeds) == [26, 37, 80] and forwards == forwards_made
    for e, b, g in zip(embeds, budgets, together):
        alone = generate.generate([e], [b], w, cfg, stops, ignore_stop=True)[0]
        assert g.ids == alone.ids and g.finish_reason == alone.finish_reason == "length"
        assert g.avg_logprob == pytest.approx(alone.avg_logprob, abs=1e-4)


def test_prompts_are_prefilled_together_longest_first_within_the_bounds(monkeypatch):
    """Under 100 positions with at most a quarter of padding, longest first: 120 alone (with 40 it would
    pass 100), 40 with 30 (80 padded positions for 70 real; a third would make 120), then 20, 10 and 5
    each alone (20 with 10 would pad to 40 for 30 real, 10 with 5 to 20 for 15)."""
    monkeypatch.setattr(generate, "PREFILL_POSITIONS", 100)
    prompts = [(i, (np.zeros((n, 1)), 0)) for i, n in enumerate([30, 20, 40, 10, 120, 5])]
    groups = [[i for i, _ in g] for g in generate._prefill_groups(prompts, alone=False)]
    assert groups == [[4], [2, 0], [1], [3], [5]]
    alone = [[i for i, _ in g] for g in generate._prefill_groups(prompts, alone=True)]
    assert alone == [[4], [2], [0], [1], [3], [5]]


def test_a_pool_of_rows_takes_prompts_as_rows_free_up(tiny_model):
    """Two rows for five prompts read lazily: each prompt gets the tokens it gets alone, the cache grows for
    longer prompts, and every prompt is reported done once."""
    embeds, budgets = [], []
    for name, options in PROMPTS.items():
        ref = cases(REFS, "funasr")[name]
        embeds.append(stage_outputs(tiny_model, ref["wave"], "funasr", options)["embeds"])
    embeds = [embeds[i % len(embeds)][:30 + 9 * i] for i in range(5)]  # lengths 30, 39, ...: growing
    budgets = [24, 6, 15, 3, 9]
    w, cfg, stops = tiny_model.weights, tiny_model.config.text, tiny_model.tokenizer.stop_ids
    read, done, timer = [], [], Timer()

    def lazily():
        for i, e in enumerate(embeds):
            read.append(i)
            yield e

    pooled = generate.generate(lazily(), budgets, w, cfg, stops, ignore_stop=True, rows=2, timer=timer,
                               on_done=lambda i, g: done.append((i, len(read))))
    assert sorted(i for i, _ in done) == list(range(5))
    assert all(i < n for i, n in done) and done[0][1] == 2  # the third prompt is read once a row is free
    assert timer.ms["prefill"] > 0 and timer.ms["decode"] > 0
    for e, b, g in zip(embeds, budgets, pooled):
        alone = generate.generate([e], [b], w, cfg, stops, ignore_stop=True)[0]
        assert g.ids == alone.ids and len(g.ids) == b


def test_transcribe_returns_the_reference_ids(tiny_model):
    ref = cases(REFS, "transformers")["short"]
    result = tiny_model.transcribe(ref["wave"], sample_rate=16000, reference="transformers",
                                   max_new_tokens=FORCED_TOKENS, ignore_stop=True)
    assert list(result.segments[0].token_ids) == ref["greedy_ids"].tolist()
    assert result.segments[0].finish_reason == "length"
    assert result.duration_s == pytest.approx(1.0)


def test_a_session_retires_a_row_by_moving_the_last_active_row_into_it(tiny_model):
    """Three prompts in three rows; retiring row 0 moves the third prompt (cache and position) into it, and
    each remaining row's next logits are those its prompt gets decoding alone."""
    cfg, w = tiny_model.config.text, tiny_model.weights
    rng = np.random.default_rng(5)
    prompts = [rng.standard_normal((n, cfg.hidden_size)).astype(np.float32) for n in (9, 14, 11)]
    session = decoder.Session(w, cfg, rows=3)
    firsts = [int(session.prefill(p, room=2)[0].argmax()) for p in prompts]
    with pytest.raises(ValueError, match="1 prompt\\(s\\) to prefill but 0 of 3 cache rows are free"):
        session.prefill(prompts[0])
    session.retire(0)
    assert session.active == 2 and session.cache.lengths[:2].tolist() == [11, 14]
    with pytest.raises(ValueError, match=r"one token per active row \(2\); got 3"):
        session.step(firsts)
    stepped = session.step([firsts[2], firsts[1]])
    for row, k in ((0, 2), (1, 1)):
        alone = decoder.Session(w, cfg, rows=1)
        alone.prefill(prompts[k], room=1)
        np.testing.assert_allclose(stepped[row], alone.step([firsts[k]])[0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="row 2 is not one of the 2 active rows"):
        session.retire(2)


def test_prompts_prefilled_together_get_the_logits_and_cache_they_get_alone(tiny_model):
    """Prompts of three lengths in one forward (padded on the right to the longest): each row's logits, its
    cache length and its next step are those of the prompt prefilled alone; the padding is never attended."""
    cfg, w = tiny_model.config.text, tiny_model.weights
    rng = np.random.default_rng(6)
    prompts = [rng.standard_normal((n, cfg.hidden_size)).astype(np.float32) for n in (9, 14, 11)]
    session = decoder.Session(w, cfg, rows=4)
    together = session.prefill_many(prompts, [3, 1, 2])
    assert together.shape == (3, cfg.vocab_size) and session.active == 3
    assert session.cache.lengths[:3].tolist() == [9, 14, 11]
    firsts = [int(row.argmax()) for row in together]
    stepped = session.step(firsts)
    for k, prompt in enumerate(prompts):
        alone = decoder.Session(w, cfg, rows=1)
        np.testing.assert_allclose(together[k], alone.prefill(prompt, room=1)[0], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(stepped[k], alone.step([firsts[k]])[0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="one room per prompt"):
        session.prefill_many(prompts[:1], [1, 2])
    with pytest.raises(ValueError, match="2 prompt\\(s\\) to prefill but 1 of 4 cache rows are free"):
        session.prefill_many(prompts[:2], [1, 1])
