"""The CUDA backend on a real GPU against the CPU path: every stage (features, encoder, adaptor, prompt
embeddings, prefill logits) and the greedy ids, alone and batched, for the tiny checkpoint in F32, BF16, Q8_0
and Q4_K_M, and for the checkpoints named in NANOASR_GPU_CHECKPOINTS (paths separated by os.pathsep;
tools/gpu_check.sh names the full-size ones there). Marked `cuda`: skipped without CuPy and a usable GPU.
"""
import os

import numpy as np
import pytest

from nanoasr import backend, convert
from nanoasr.api import Model
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.model import decoder, generate
from nanoasr.xp import to_numpy
from tools.lib.parity import LOGIT_TOL, STAGE_TOL, stage_outputs
from tools.lib.synth import speech_like

usable, why = backend.cuda_status()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not usable, reason=why)]
TINY_TYPES = ("f32", "bf16", "q8_0", "q4_k_m")
NAMED = [p for p in os.environ.get("NANOASR_GPU_CHECKPOINTS", "").split(os.pathsep) if p]
CASES = [f"tiny-{t}" for t in TINY_TYPES] + NAMED
TOKENS = 24


@pytest.fixture(scope="module")
def models(tiny_dir, tmp_path_factory):
    """case -> (CPU model, CUDA model), loaded on first use."""
    loaded = {}

    def get(case):
        if case not in loaded:
            path = case
            if case.startswith("tiny-"):
                target = case[len("tiny-"):]
                path = tiny_dir if target == "bf16" else tmp_path_factory.mktemp(case) / f"{case}.gguf"
                if target != "bf16":
                    convert.write(path, load_checkpoint(tiny_dir), target, report=False, progress=None)
            loaded.clear()  # one full-size pair in memory at a time
            loaded[case] = Model.load(str(path), activations="exact"), Model.load(str(path), device="cuda")
        return loaded[case]
    return get


@pytest.mark.parametrize("case", CASES)
def test_every_stage_matches_the_cpu(models, case):
    cpu, gpu = models(case)
    wave = speech_like(4.0, 21)
    want, got = stage_outputs(cpu, wave, "funasr", {}), stage_outputs(gpu, wave, "funasr", {})
    np.testing.assert_array_equal(to_numpy(got["features"]), want["features"])  # the host frontend, uploaded
    for stage in ("encoder", "adaptor", "embeds"):
        np.testing.assert_allclose(to_numpy(got[stage]), want[stage], **STAGE_TOL, err_msg=stage)
    logits = []
    for model, embeds in ((cpu, want["embeds"]), (gpu, got["embeds"])):
        logits.append(to_numpy(decoder.Session(model.weights, model.config.text, rows=1).prefill(embeds)))
    np.testing.assert_allclose(logits[1], logits[0], **LOGIT_TOL)


@pytest.mark.parametrize("case", CASES)
def test_greedy_ids_equal_the_cpu_alone_and_batched(models, case):
    cpu, gpu = models(case)
    wave = speech_like(3.0, 5)
    kwargs = dict(sample_rate=16000, max_new_tokens=TOKENS, ignore_stop=True)
    assert ([s.token_ids for s in gpu.transcribe(wave, **kwargs).segments]
            == [s.token_ids for s in cpu.transcribe(wave, **kwargs).segments])
    rng = np.random.default_rng(2)
    prompts = [rng.standard_normal((n, cpu.config.text.hidden_size)).astype(np.float32) for n in (9, 30, 5)]
    budgets, stop = [8, 4, 6], cpu.tokenizer.stop_ids
    want = generate.generate(prompts, budgets, cpu.weights, cpu.config.text, stop, ignore_stop=True, rows=2)
    got = generate.generate([gpu.backend.xp.asarray(p) for p in prompts], budgets, gpu.weights,
                            gpu.config.text, stop, ignore_stop=True, rows=2)
    assert [g.ids for g in got] == [g.ids for g in want]
