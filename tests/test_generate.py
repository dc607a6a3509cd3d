"""Generation policy: token budget, repetition guard, segment joining."""
from nanoasr.api import join_texts
from nanoasr.model.generate import MAX_NEW_TOKENS, _finish, loop_start, token_budget


def test_budget_scales_with_duration_and_is_capped():
    assert token_budget(1.0) < token_budget(10.0) < token_budget(30.0) <= MAX_NEW_TOKENS
    assert token_budget(3600.0) == MAX_NEW_TOKENS == 512
    assert token_budget(30.0) >= 200  # fast speech: ~6-7 tokens per second must fit


def test_loop_guard_cuts_a_looping_tail_and_keeps_one_copy():
    text = list(range(100, 130))
    assert loop_start(text) is None
    loop = [7, 8, 9, 10]
    ids = text + loop * 12
    cut = loop_start(ids)
    assert cut is not None and ids[:cut] == text + loop
    assert loop_start(text + [5] * 40) == len(text) + 1


def test_loop_guard_leaves_short_natural_repeats_alone():
    assert loop_start(list(range(50)) + [3, 3, 3, 3]) is None  # e.g. "哈哈哈哈"
    assert loop_start(list(range(50)) + [1, 2] * 4) is None


def test_finish_reasons():
    stops = (151645, 151643)
    assert _finish([1, 2, 151645], 10, stops, False).finish_reason == "stop"
    assert _finish([1, 2, 151645], 10, stops, False).ids == [1, 2]
    assert _finish([1, 2, 3], 3, stops, False).finish_reason == "length"
    assert _finish([1] + [4, 5] * 20, 100, stops, False).finish_reason == "repetition"
    assert _finish([1, 2, 151645], 10, stops, True) is None  # forced decoding ignores stop tokens


def test_join_texts():
    assert join_texts(["hello world", "again"]) == "hello world again"
    assert join_texts(["你好。", "世界"]) == "你好。世界"
    assert join_texts(["Done.", "Next"]) == "Done. Next"
    assert join_texts(["", " a ", ""]) == "a"
