"""The funasr profile against FunASR's own code: funasr 1.4.16 (PyPI wheel), its Fun-ASR-Nano path in
funasr/models/fun_asr_nano/model.py (FunASRNano.__init__, get_prompt, data_load_speech, inference_prepare,
inference_llm) reached through funasr.AutoModel.

AutoModel builds FunASRNano from the committed tiny checkpoint written in FunASR's layout
(tools/reference/funasr_checkpoint.py: model.pt, a config.yaml with the official llm_dtype bf16, Qwen3-0.6B/)
and transcribes on the CPU in float32, dither 0, greedy. Its stages are recorded by forward hooks and by
wrappers that pass every call through unchanged. The README's test command installs funasr and the few
modules that path imports with --no-deps, so torch and transformers stay at their pinned versions.
"""
import contextlib
from pathlib import Path

import numpy as np
import pytest

from nanoasr.ops import rope_inv_freq
from nanoasr.model import generate
from tools.lib.parity import FEATURE_TOL, STAGE_TOL, cases, stage_outputs
from tools.reference import funasr_checkpoint
from tools.reference.dump import CASES, FORCED_TOKENS, LANGUAGE

REFS = np.load(Path(__file__).parent / "fixtures" / "tiny" / "reference.npz")
# (name, options): the pinned cases FunASR's get_prompt can express (it takes no free context), whose pinned
# greedy ids must be FunASR's, and the hotwords clip with its hotwords only
PINNED = [(name, options) for name, _, _, options in CASES if "context" not in options]
CLIPS = PINNED + [("hotwords", {"hotwords": ("nanoasr", "Fun-ASR")})]


@pytest.fixture(scope="module")
def funasr_model(tiny_dir, tmp_path_factory):
    pytest.importorskip("funasr")  # the reference tier: the README's test command installs it
    from funasr import AutoModel

    folder = funasr_checkpoint.write(tiny_dir, tmp_path_factory.mktemp("funasr_folder"))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # config.yaml names Qwen3-0.6B/ relative to the model folder, as published
        auto = AutoModel(model=str(folder), device="cpu", disable_update=True, frontend_conf={"dither": 0.0})
    assert auto.kwargs["frontend"].dither == 0.0 and auto.kwargs["frontend"].window == "hamming"
    return auto


@contextlib.contextmanager
def recording(model):
    """FunASRNano's stage outputs and generated ids of the calls made inside, into a dict."""
    seen = {}
    hooks = [model.audio_encoder.register_forward_hook(
                 lambda m, args, out: seen.update(encoder=out[0].clone())),
             model.audio_adaptor.register_forward_hook(
                 lambda m, args, out: seen.update(adaptor=out[0].clone()))]
    # the encoder scales its input in place, so the features are copied before it runs
    hooks.append(model.audio_encoder.register_forward_pre_hook(
        lambda m, args: seen.update(features=args[0].clone())))
    prepare, llm_generate = model.inference_prepare, model.llm.generate

    def record_prepare(*args, **kwargs):
        out = prepare(*args, **kwargs)
        seen.update(prompt_ids=out[3][0].clone(), audio_start=int(out[2]["fbank_beg"][0, 0]),
                    audio_tokens=int(out[2]["fake_token_len"][0, 0]))
        return out

    def record_generate(**kwargs):
        out = llm_generate(**kwargs)
        seen.update(ids=out[0].tolist(), llm_dtype=next(model.llm.parameters()).dtype)
        return out

    model.inference_prepare, model.llm.generate = record_prepare, record_generate
    try:
        yield seen
    finally:
        del model.inference_prepare, model.llm.generate
        for hook in hooks:
            hook.remove()


def funasr_run(auto, wave, options) -> dict:
    import torch

    language = options.get("language")
    with recording(auto.model) as seen:
        auto.generate(input=torch.from_numpy(wave), max_length=FORCED_TOKENS, itn=options.get("itn", True),
                      hotwords=list(options.get("hotwords", ())), language=LANGUAGE.get(language))
    return seen


@pytest.fixture(scope="module")
def runs(funasr_model):
    return {name: funasr_run(funasr_model, cases(REFS, "funasr")[name]["wave"], options)
            for name, options in CLIPS}


def test_funasr_keeps_the_rotary_frequencies_rounded_to_bfloat16(funasr_model):
    llm = funasr_model.model.llm
    theirs = llm.model.rotary_emb.inv_freq.float().numpy()
    head_dim, theta = llm.config.head_dim, llm.config.rope_parameters["rope_theta"]
    np.testing.assert_array_equal(theirs, rope_inv_freq(head_dim, theta, bf16=True).astype(np.float32))
    assert not np.array_equal(theirs, rope_inv_freq(head_dim, theta).astype(np.float32))


@pytest.mark.parametrize("head_dim,theta", [(128, 1e6), (8, 1e6), (64, 1e4)])
def test_bf16_frequencies_are_torch_round_to_nearest_even_of_the_float32_ones(head_dim, theta):
    """Qwen3-0.6B's (128, 1e6) among them: the rounding torch applies in FunASR's llm.to(bfloat16), to the
    float32 inv_freq Transformers computes (compute_default_rope_parameters). Torch's float32 power differs
    from the correctly rounded one by up to an ulp; no such value lies near a bfloat16 midpoint."""
    torch = pytest.importorskip("torch")
    exact = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    np.testing.assert_allclose(rope_inv_freq(head_dim, theta), exact.numpy(), rtol=2 ** -23, atol=0)
    rounded = exact.to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(rope_inv_freq(head_dim, theta, bf16=True).astype(np.float32), rounded)
    assert np.abs(rounded / exact.numpy() - 1).max() < 2 ** -8  # half a bfloat16 step at most


@pytest.mark.parametrize("name,options", CLIPS, ids=[name for name, _ in CLIPS])
def test_stages_prompt_and_greedy_ids_equal_funasr(tiny_model, runs, name, options):
    seen, wave = runs[name], cases(REFS, "funasr")[name]["wave"]
    ours = stage_outputs(tiny_model, wave, "funasr", options)
    np.testing.assert_allclose(ours["features"], seen["features"][0].numpy(), **FEATURE_TOL["funasr"])
    np.testing.assert_allclose(ours["encoder"], seen["encoder"][0].numpy(), **STAGE_TOL)
    n, start = seen["audio_tokens"], seen["audio_start"]
    np.testing.assert_allclose(ours["adaptor"][:n], seen["adaptor"][0, :n].numpy(), **STAGE_TOL)
    theirs = seen["prompt_ids"].numpy()  # FunASR holds 0 in the audio slot, nanoasr the placeholder token
    assert len(ours["prompt_ids"]) == len(theirs) and ours["prompt_ids"][start - 1] == theirs[start - 1]
    assert (ours["prompt_ids"][start:start + n] == tiny_model.config.audio_token_id).all()
    np.testing.assert_array_equal(np.delete(ours["prompt_ids"], range(start, start + n)),
                                  np.delete(theirs, range(start, start + n)))
    assert str(seen["llm_dtype"]) == "torch.float32"  # inference casts the bfloat16-built LLM back
    assert len(seen["ids"]) == FORCED_TOKENS and not set(seen["ids"]) & set(tiny_model.tokenizer.stop_ids)
    result = tiny_model.transcribe(wave, sample_rate=16000, max_new_tokens=FORCED_TOKENS, ignore_stop=True,
                                   **options)
    assert list(result.segments[0].token_ids) == seen["ids"]
    if (name, options) in PINNED:  # tests/test_engine.py holds nanoasr to these
        assert seen["ids"] == cases(REFS, "funasr")[name]["greedy_ids"].tolist()


def test_exact_rotary_frequencies_part_from_funasr(tiny_model, runs):
    """The rounding matters on this fixture: with Transformers' exact frequencies the hotwords clip's greedy
    ids part from FunASR's."""
    name, options = CLIPS[-1]
    embeds = stage_outputs(tiny_model, cases(REFS, "funasr")[name]["wave"], "funasr", options)["embeds"]
    exact = generate.generate([embeds], [FORCED_TOKENS], tiny_model.weights, tiny_model.config.text,
                              tiny_model.tokenizer.stop_ids, ignore_stop=True)[0]
    assert exact.ids != runs[name]["ids"]
