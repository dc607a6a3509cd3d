"""GGUF models through the engine: for every type, the greedy ids of the model run on its stored (quantized)
weights equal those of the same model with every weight widened to float32 by the gguf package.

This isolates the kernels (fused products, widening, the quantized LM head) from quantization error.
"""
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from nanoasr import convert
from nanoasr.api import Model
from nanoasr.checkpoints.checkpoint import Checkpoint
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.model import generate
from nanoasr.storage import bf16_to_f32
from nanoasr.tensor import dense
from tools.lib.synth import speech_like

TARGETS = ("f32", "f16", "bf16", "q8_0", "q4_k_m")


def widened_by_gguf(checkpoint: Checkpoint) -> Checkpoint:
    def f32(t):
        if t.dtype == "bf16":
            return bf16_to_f32(np.asarray(t.data))
        if t.dtype in ("f32", "f16"):
            return np.asarray(t.data, np.float32)
        return dequantize(np.asarray(t.data), GGMLQuantizationType[t.dtype.upper()]).reshape(t.shape)

    tensors = {name: dense(f32(t)) for name, t in checkpoint.tensors.items()}
    return Checkpoint(checkpoint.config, tensors, checkpoint.files, checkpoint.source)


def forced_ids(model: Model, wave, tokens: int) -> list[int]:
    from tools.lib.parity import stage_outputs

    embeds = stage_outputs(model, wave, "funasr", {})["embeds"]
    return generate.generate([embeds], [tokens], model.weights, model.config.text, model.tokenizer.stop_ids,
                             ignore_stop=True)[0].ids


def check_types(source_dir, tmp_path, targets, seconds, tokens):
    source = load_checkpoint(source_dir)
    for target in targets:
        path = tmp_path / f"model-{target}.gguf"
        convert.write(path, source, target, report=False, progress=None)
        stored = Model.load(str(path), activations="exact")
        kinds = {t.dtype for t in stored.checkpoint.tensors.values()}
        reference = Model(widened_by_gguf(stored.checkpoint), activations="exact")
        for i, s in enumerate(seconds):
            wave = speech_like(s, 60 + i)
            assert forced_ids(stored, wave, tokens) == forced_ids(reference, wave, tokens), (target, kinds, s)


def test_tiny_gguf_of_every_type(tiny_dir, tmp_path):
    check_types(tiny_dir, tmp_path, TARGETS, (1.5, 3.2), 40)


@pytest.mark.slow
def test_full_size_gguf_of_every_type(full_size_dir, tmp_path_factory):
    # the published types at full size; every other type is checked on the tiny model above
    check_types(full_size_dir, tmp_path_factory.mktemp("gguf"), ("q8_0", "q4_k_m"), (6.0,), 24)
