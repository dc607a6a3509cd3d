"""The engine against Transformers 5.23 run now, on checkpoints built now with other seeds and lengths.

Skipped unless torch and transformers==5.23.0 import (the `reference` extra). The full-size tier builds
a random checkpoint of the real model's sizes (about 1.6 GB in BF16) and is marked slow.
"""
import pytest

from tools.lib.parity import check_case
from tools.lib.synth import speech_like

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")
pytestmark = [pytest.mark.live, pytest.mark.skipif(transformers.__version__ != "5.23.0",
                                                   reason="the references are Transformers 5.23.0")]
from tools.reference import checkpoint, dump  # noqa: E402

PROFILES = ("funasr", "transformers")
LIVE_CASES = ((0.6, 21, {}), (3.3, 22, {"language": "zh"}), (7.9, 23, {"itn": False, "hotwords": ("Qwen",)}))
FULL_SECONDS = (1.0, 9.0, 30.0)  # the shortest, a middle one and the longest segment


def loaded(path):
    from nanoasr.api import Model

    return path, Model.load(str(path), activations="exact"), dump.load_tokenizer(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return loaded(checkpoint.build(tmp_path_factory.mktemp("tiny"), "tiny", seed=7))


@pytest.mark.parametrize("reference", PROFILES)
def test_tiny_checkpoint_with_a_new_seed(tiny, reference):
    path, model, tokenizer = tiny
    hf = dump.load_model(path, reference)
    for seconds, seed, options in LIVE_CASES:
        ref = dump.run(hf, tokenizer, speech_like(seconds, seed), reference, 70, options)
        check_case(model, ref, reference, options)


@pytest.fixture(scope="module")
def full(full_size_dir):
    return loaded(full_size_dir)


@pytest.mark.slow
@pytest.mark.parametrize("reference", PROFILES)
def test_full_size_checkpoint_greedy_ids_equal_transformers(full, reference):
    path, model, tokenizer = full
    hf = dump.load_model(path, reference)
    seen = set()
    for i, seconds in enumerate(FULL_SECONDS):
        ref = dump.run(hf, tokenizer, speech_like(seconds, 40 + i), reference, 72, {})
        seen.update(check_case(model, ref, reference, {}))
    assert len(seen) > 10, "random weights may repeat a token per clip, but not across all of them"
