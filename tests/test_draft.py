"""Draft verification (nanoasr.model.generate, decoder.Session.prefill_draft): a draft's positions carry a
decode step's bits, so generation with any draft is plain greedy generation, token for token, on every stored
type and product path; and a right draft costs one forward.

The reference is the plain path itself: Model.transcribe without a draft, and teacher-forced decode steps.
"""
import dataclasses

import numpy as np
import pytest

from nanoasr import convert
from nanoasr.api import Model, Options
from nanoasr.backend import CPU, with_activations
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.errors import AudioTooLongError, OptionError
from nanoasr.model import decoder, generate
from nanoasr.ops import linear
from nanoasr.quant.quantize import quantize
from nanoasr.realtime import Completed, LiveSession, Limits
from nanoasr.tensor import StoredTensor
from tools.lib.parity import full_sequence_logits, stage_outputs, teacher_forced_logits
from tests.test_realtime import TONES
from tools.lib.synth import speech_like

SR = 16000
# (stored type, activations): float32 rows against BF16 and F16, bf16 rows against BF16, int8 rows against
# Q8_0 and the Q4_K_M mix where this CPU has the int8 kernels (auto)
PATHS = [("bf16", "exact"), ("bf16", "bf16"), ("f16", "exact"), ("q8_0", "auto"), ("q4_k_m", "auto")]


@pytest.fixture(scope="module")
def models(tiny_dir, tmp_path_factory):
    """The tiny checkpoint as each stored type (GGUF conversions of it), loaded with each path's
    activations, on one thread."""
    checkpoint, out, made = load_checkpoint(tiny_dir), tmp_path_factory.mktemp("types"), {}
    for kind, activations in PATHS:
        path = tiny_dir
        if kind != "bf16":
            path = out / f"tiny-{kind}.gguf"
            if not path.exists():
                convert.write(path, checkpoint, kind, report=False, progress=None)
        made[kind, activations] = Model.load(str(path), activations=activations, threads=1)
    return made


def stored(w, kind):  # float32 [rows, cols] -> the stored array of `kind`
    if kind == "f32":
        return w
    if kind == "f16":
        return w.astype(np.float16)
    if kind == "bf16":
        return (w.view(np.uint32) >> 16).astype(np.uint16)
    return quantize(w, kind)


# every stored type with whole blocks (512 columns); the dense types with a tail past the last block of 32
SHAPES = [(kind, 512) for kind in ("f32", "f16", "bf16", "q8_0", "q4_k", "q6_k")] + \
    [(kind, 528) for kind in ("f32", "f16", "bf16")]


@pytest.mark.parametrize("kind, cols", SHAPES)
@pytest.mark.parametrize("activations", ["exact", "int8", "bf16"])
def test_products_of_a_few_rows_give_each_row_its_bits_alone(kind, activations, cols):
    rng = np.random.default_rng(cols)
    w = rng.standard_normal((96, cols)).astype(np.float32)
    x = rng.standard_normal((8, cols)).astype(np.float32)
    matrix = StoredTensor(stored(w, kind), kind, w.shape)
    t = with_activations(CPU, activations).place({"w": matrix}, set())["w"]
    alone = np.stack([linear(x[r:r + 1], t)[0] for r in range(8)])
    assert CPU.kernels.decode_rows == 8
    for n in range(2, 9):
        np.testing.assert_array_equal(linear(x[:n], t), alone[:n])


@pytest.mark.parametrize("path", PATHS, ids="-".join)
def test_draft_positions_carry_the_decode_steps_bits(models, path):
    model = models[path]
    embeds = stage_outputs(model, speech_like(2.0, 5), "funasr", {})["embeds"]
    ids = list(range(1000, 1011))
    steps = teacher_forced_logits(model, embeds, ids, len(ids) + 1)  # prefill, then a step per id
    session = decoder.Session(model.weights, model.config.text, rows=1)
    hidden = session.prefill_draft(embeds, ids, room=4)
    head = model.weights.get("lm_head.weight", model.weights[decoder.EMBED])
    verified = decoder.row_products(hidden, head, 8)
    np.testing.assert_array_equal(verified, steps)
    assert session.cache.lengths[0] == len(embeds) + len(ids)


def test_prefilled_positions_do_not_carry_the_decode_steps_bits(models):
    """Why the draft is not simply prefilled with the prompt: a position inside a prefill's many-row
    products gets other bits than its decode step (a near tie could then go the other way)."""
    model = models["bf16", "exact"]
    embeds = stage_outputs(model, speech_like(2.0, 5), "funasr", {})["embeds"]
    ids = [1000, 1001, 1002, 1003]
    steps = teacher_forced_logits(model, embeds, ids, len(ids) + 1)
    prefilled = full_sequence_logits(model, embeds, ids)
    np.testing.assert_allclose(prefilled, steps, rtol=1e-4, atol=1e-4)
    assert not np.array_equal(prefilled[1:], steps[1:])


def drafts_of(answer: list[int], stop: int) -> dict:
    rng = np.random.default_rng(len(answer))
    wrong = list(answer)
    wrong[len(wrong) // 2] = (wrong[len(wrong) // 2] + 1) % 151000
    return {"right": list(answer), "partly wrong": wrong, "empty": [], "short": answer[:3],
            "longer": answer + [int(t) for t in rng.integers(0, 151000, 20)],
            "stop inside": answer[:2] + [stop] + answer[2:],
            "random": [int(t) for t in rng.integers(0, 151000, 9)]}


@pytest.mark.parametrize("path", PATHS, ids="-".join)
def test_transcripts_with_any_draft_are_the_plain_ones(models, path):
    model = models[path]
    wave = speech_like(1.5, 7)
    for budget in (5, 24):
        plain = model.transcribe(wave, sample_rate=SR, max_new_tokens=budget)
        answer = list(plain.segments[0].token_ids)
        for name, draft in drafts_of(answer, model.tokenizer.stop_ids[0]).items():
            drafted = model.transcribe(wave, sample_rate=SR, max_new_tokens=budget, draft=draft)
            assert drafted.segments == plain.segments, name  # ids, text, finish reason, average log-prob


def test_generations_with_drafts_stop_where_greedy_stops(models):
    """Stopping rules inside an accepted draft: a stop id greedy chooses, a loop the guard cuts."""
    model = models["bf16", "exact"]
    embeds = stage_outputs(model, speech_like(1.5, 7), "funasr", {})["embeds"]
    text = model.config.text

    def run(stop_ids, draft, budget=40):
        return generate.generate([embeds], [budget], model.weights, text, stop_ids,
                                 drafts={0: draft} if draft is not None else None)[0]
    answer = run(model.tokenizer.stop_ids, None).ids
    stop = answer[4]  # a token greedy does choose, taken as a stop id: plain decoding stops there
    plain = run((stop,), None)
    assert plain.finish_reason == "stop"
    for draft in (answer, answer[:4] + [stop], answer[:6], answer[:2]):
        assert run((stop,), draft) == plain
    for budget in (1, 2, 7):
        assert run(model.tokenizer.stop_ids, answer, budget) == run(model.tokenizer.stop_ids, None, budget)


def test_first_finish_is_greedy_decodings_rule_token_by_token():
    stops = (9,)
    loop = [1, 2] * 20
    for ids, budget in (([5, 6, 9, 7, 8], 10), (list(range(20)), 6), ([3] + loop, 100), ([4, 5], 10)):
        plain = next((ids[:end] for end in range(1, len(ids) + 1)
                      if generate._finish(ids[:end], budget, stops, False) is not None), ids)
        assert generate.first_finish(ids, budget, stops, False) == plain
    assert generate.first_finish([5, 9, 7], 10, stops, True) == [5, 9, 7]


def counting_forwards(monkeypatch) -> list:
    calls, forward = [], decoder.forward

    def spy(x, *args, draft=None, **kwargs):
        calls.append("prefill" if x.shape[1] > 1 else "step")
        return forward(x, *args, draft=draft, **kwargs)
    monkeypatch.setattr(decoder, "forward", spy)
    return calls


def test_a_right_draft_costs_one_forward(models, monkeypatch):
    model = models["bf16", "exact"]
    wave = speech_like(1.5, 7)
    plain = model.transcribe(wave, sample_rate=SR, max_new_tokens=24)
    calls = counting_forwards(monkeypatch)
    model.transcribe(wave, sample_rate=SR, max_new_tokens=24)
    assert calls.count("step") == 23
    calls.clear()
    drafted = model.transcribe(wave, sample_rate=SR, max_new_tokens=24, draft=plain.segments[0].token_ids)
    assert drafted.segments == plain.segments
    assert calls == ["prefill"]
    calls.clear()
    model.transcribe(wave, sample_rate=SR, max_new_tokens=24, draft=plain.segments[0].token_ids[:-2])
    assert calls == ["prefill", "step"]  # the draft's 22 tokens and the choice after them, then the 24th


def tone(seconds):
    """A voiced tone that never pauses: one utterance to the detector."""
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 * np.sin(2 * np.pi * 150 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def fed_until_a_partial_reads_all(session, wave, after_s):
    """Feed `wave` 0.1 s at a time until, `after_s` into the utterance, a partial has read all of it."""
    for i in range(0, len(wave), SR // 10):
        session.feed(wave[i:i + SR // 10])
        if session.item is not None and session.partial.covered == session.audio.end \
                and session.audio.end - session.item_start >= after_s * SR:
            return session.audio.span(session.item_start, session.audio.end)
    raise AssertionError("no partial read the utterance")


def test_a_final_verifies_the_last_partial_in_one_forward(models, monkeypatch):
    """The final of an utterance that its last partial read whole: one forward, the plain transcript."""
    model = models["bf16", "exact"]
    session = LiveSession(model, limits=Limits(partial_interval_s=0.5, vad=TONES))
    utterance = fed_until_a_partial_reads_all(session, tone(3.0), 1.5)
    calls = counting_forwards(monkeypatch)
    final = [e for e in session.commit() if isinstance(e, Completed)][0]
    assert calls == ["prefill"]
    assert final.token_ids == model.transcribe(utterance, sample_rate=SR).segments[0].token_ids


class Recording:
    """A Model stand-in that answers one token per 0.1 s of audio and records each call's length and
    draft."""

    def __init__(self):
        self.calls = []
        self.tokenizer = self

    def decode(self, ids):
        return " ".join(f"w{t}" for t in ids)

    def check_options(self, language=None, word_timestamps=False):
        pass

    def transcribe(self, wave, sample_rate, draft=None, **options):
        from nanoasr.transcript import Segment, Transcript

        ids = tuple(range(100, 100 + len(wave) * 10 // sample_rate))
        self.calls.append((ids, draft))
        segment = Segment(0.0, len(wave) / sample_rate, self.decode(ids), "stop", ids)
        return Transcript(self.decode(ids), (segment,), None, len(wave) / sample_rate)


def test_partials_and_finals_take_the_partials_before_them_as_drafts():
    model = Recording()
    session = LiveSession(model, limits=Limits(partial_interval_s=0.5, partial_window_s=1.2, vad=TONES))
    fed_until_a_partial_reads_all(session, tone(6.0), 4.0)
    session.commit()
    *partials, (_, final_draft) = model.calls
    previous, closed, restarts = None, [], 0
    for ids, draft in partials:
        if previous is not None and len(ids) < len(previous):  # the window started afresh
            closed, previous, restarts = closed + list(previous), None, restarts + 1
        assert draft == (None if previous is None else list(previous))
        previous = ids
    assert restarts >= 2 and final_draft == closed + list(previous)


def test_a_draft_must_be_token_ids(models):
    model = models["bf16", "exact"]
    for bad in ("abc", 5, [1, -2], [1.5], [True], [model.config.text.vocab_size]):
        with pytest.raises(OptionError, match="draft"):
            model.transcribe(speech_like(0.5, 1), sample_rate=SR, draft=bad)


@pytest.mark.parametrize("mix", ["q8_0 int8", "q4_k_m int8", "bf16", "each kind exact", "bf16 rows"])
def test_draft_positions_carry_the_compiled_steps_bits(mix):
    """On whole blocks the steps run the compiled layer (tests/test_decode_layer.py's decoder of random
    stored matrices); the draft's positions, computed op by op, still have their bits."""
    from tests.test_decode_layer import CFG, MIXES, layer_weights
    from tests.test_decode_layer import stored as stored_as

    kinds, activations = MIXES[mix]
    rng = np.random.default_rng(3)
    w = layer_weights(kinds, activations)
    w[decoder.EMBED] = stored_as((rng.standard_normal((CFG.vocab_size, CFG.hidden_size)) * 0.1)
                                 .astype(np.float32), kinds[0], activations)
    prompt = rng.standard_normal((9, CFG.hidden_size)).astype(np.float32)
    ids = [5, 17, 250, 3, 99, 42, 7, 8, 120, 11]  # more than a product's 8 rows
    plain = decoder.Session(w, CFG, rows=1)
    expected = [plain.prefill(prompt, room=len(ids) + 1)[0]] + [plain.step([t])[0] for t in ids]
    assert all(layer is not None for layer in plain.compiled)
    hidden = decoder.Session(w, CFG, rows=1).prefill_draft(prompt, ids, room=4)
    np.testing.assert_array_equal(decoder.row_products(hidden, w[decoder.EMBED], 8), np.stack(expected))


@pytest.mark.parametrize("path", PATHS, ids="-".join)
def test_decoded_together_each_gets_its_transcript_alone(models, path):
    """Model.transcribe_together (live sessions' decodes batched): every request's segments, ids and average
    log-probability included, are those of Model.transcribe of its audio alone, with or without a draft."""
    model = models[path]
    waves = [speech_like(seconds, seed) for seconds, seed in ((1.5, 7), (2.5, 3), (0.8, 11), (2.0, 5))]
    options = [Options(max_new_tokens=24), Options(hotwords=("nano",)), Options(max_new_tokens=5),
               Options(itn=False, max_new_tokens=24)]
    answer = list(model.transcribe(waves[0], sample_rate=SR, max_new_tokens=24).segments[0].token_ids)
    drafts = [answer, None, [1000, 1001], answer[:3] + [7] + answer[4:]]
    alone = [model.transcribe(wave, sample_rate=SR, draft=draft, **dataclasses.asdict(o))
             for wave, o, draft in zip(waves, options, drafts)]
    assert model.together_rows == 8
    together = model.transcribe_together(list(zip(waves, options, drafts)))
    assert [t.segments for t in together] == [t.segments for t in alone]
    assert [t.text for t in together] == [t.text for t in alone]


def test_decoding_together_takes_one_step_for_all_rows(models, monkeypatch):
    """N requests decoded together: each decode step is one forward (one pass over the weights) for all
    their rows, where decoding them one after another takes N."""
    model = models["bf16", "exact"]
    waves = [speech_like(1.0 + 0.5 * seed, seed) for seed in range(4)]
    options = Options(max_new_tokens=12, ignore_stop=True)
    calls = counting_forwards(monkeypatch)
    for wave in waves:
        model.transcribe(wave, sample_rate=SR, **dataclasses.asdict(options))
    assert calls.count("step") == 4 * 11
    calls.clear()
    model.transcribe_together([(wave, options, None) for wave in waves])
    assert calls.count("prefill") == 4 and calls.count("step") == 11


def test_decoding_together_refuses_what_it_cannot_decode_alike(models):
    model = models["bf16", "exact"]
    wave = speech_like(1.0, 1)
    with pytest.raises(OptionError, match="share reference"):
        model.transcribe_together([(wave, Options(), None), (wave, Options(reference="transformers"), None)])
    with pytest.raises(AudioTooLongError):
        model.transcribe_together([(np.zeros(31 * SR, np.float32), Options(), None)])
    with pytest.raises(OptionError, match="1 to 8"):
        model.transcribe_together([(wave, Options(), None)] * 9)
