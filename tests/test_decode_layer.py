"""The compiled decode layer (nanoasr.kernels.decode_layer) against the op-by-op decoder layer it replaces:
the same kernels in the same order, so the same bits, for every storage type the int8 kernels read, one row
and batches whose rows sit at different positions; and the guard that sends a layer to it only where every
product would run those kernels over a float32 cache."""
import numpy as np
import pytest

from nanoasr.backend import cpu as cpu_backend
from nanoasr.kernels import decode_layer as layer_kernel
from nanoasr.model import decoder
from nanoasr.model.config import TextConfig
from nanoasr.ops import rope_inv_freq
from nanoasr.quant.quantize import quantize
from nanoasr.tensor import StoredTensor

pytestmark = pytest.mark.skipif(cpu_backend.host_path() is None, reason="the CPU has no int8 path")

CFG = TextConfig(vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64)
SHAPES = {"self_attn.q_proj": (256, 256), "self_attn.k_proj": (128, 256), "self_attn.v_proj": (128, 256),
          "self_attn.o_proj": (256, 256), "mlp.gate_proj": (512, 256), "mlp.up_proj": (512, 256),
          "mlp.down_proj": (256, 512)}
MIXES = {"q8_0": ["q8_0"] * 7, "q4_k_m": ["q4_k", "q4_k", "q6_k", "q4_k", "q4_k", "q4_k", "q6_k"],
         "each": ["q6_k", "q8_0", "q4_k", "q6_k", "q8_0", "q4_k", "q8_0"]}


def layer_weights(kinds, activations="int8", seed=0):
    rng = np.random.default_rng(seed)
    w = {}
    for i in range(CFG.num_hidden_layers):
        p = f"{decoder.P}layers.{i}."
        for (name, shape), kind in zip(SHAPES.items(), kinds):
            data = quantize((rng.standard_normal(shape) * 0.1).astype(np.float32), kind)
            w[f"{p}{name}.weight"] = StoredTensor(data, kind, shape, activations)
        for name in decoder.NORMS:
            size = CFG.head_dim if name.startswith("self_attn") else CFG.hidden_size
            w[f"{p}{name}.weight"] = (1 + 0.1 * rng.standard_normal(size)).astype(np.float32)
    w[decoder.P + "norm.weight"] = np.ones(CFG.hidden_size, np.float32)
    return w


def steps(w, rows, prompt_lengths, count=4, whole=True, seed=1):
    """The hidden states of `count` decode steps after prompts of the given lengths, [steps, rows, H]."""
    rng = np.random.default_rng(seed)
    cache = decoder.KVCache(CFG, rows, max(prompt_lengths) + count + 1)
    inv_freq = rope_inv_freq(CFG.head_dim, CFG.rope_theta)
    for r, n in enumerate(prompt_lengths):  # each row's prompt through the op-by-op prefill
        x = rng.standard_normal((1, n, CFG.hidden_size)).astype(np.float32)
        decoder.forward(x, w, CFG, cache, slice(r, r + 1), [0], inv_freq)
    original = cpu_backend.KERNELS.decode_layer
    cpu_backend.KERNELS.decode_layer = original if whole else (lambda *layer: None)
    try:
        out = []
        for _ in range(count):
            x = rng.standard_normal((rows, 1, CFG.hidden_size)).astype(np.float32)
            start = cache.lengths[:rows].copy()
            out.append(decoder.forward(x, w, CFG, cache, slice(0, rows), start, inv_freq))
        return np.stack(out)
    finally:
        cpu_backend.KERNELS.decode_layer = original


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("prompt_lengths", [[5], [3, 9, 2]])
def test_the_compiled_layer_gives_the_bits_of_the_op_by_op_layer(monkeypatch, mix, prompt_lengths):
    w = layer_weights(MIXES[mix])
    calls = []
    compiled = layer_kernel.decode_layer

    def spy(*args):
        calls.append(args[0].shape)
        return compiled(*args)
    monkeypatch.setattr(layer_kernel, "decode_layer", spy)
    whole = steps(w, len(prompt_lengths), prompt_lengths)
    assert calls == [(len(prompt_lengths), CFG.hidden_size)] * (4 * CFG.num_hidden_layers)
    apart = steps(w, len(prompt_lengths), prompt_lengths, whole=False)
    assert len(calls) == 4 * CFG.num_hidden_layers
    np.testing.assert_array_equal(whole, apart)
    assert np.isfinite(whole).all() and np.abs(whole).max() > 0.1


def test_a_layer_with_one_product_outside_the_int8_kernels_runs_op_by_op(monkeypatch):
    calls = []
    monkeypatch.setattr(layer_kernel, "decode_layer", lambda *args: calls.append(1))
    w = layer_weights(MIXES["q8_0"])
    f32 = np.random.default_rng(2).standard_normal((128, 256)).astype(np.float32)
    w[f"{decoder.P}layers.1.self_attn.v_proj.weight"] = StoredTensor(f32, "f32", f32.shape)
    steps(w, 1, [4], count=1)
    assert len(calls) == 1  # layer 0 only
    calls.clear()
    steps(layer_weights(MIXES["q8_0"], activations="exact"), 1, [4], count=1)
    assert calls == []


def test_stored_data_that_does_not_fit_its_shape_is_refused():
    w = layer_weights(MIXES["q8_0"])
    name = f"{decoder.P}layers.0.mlp.up_proj.weight"
    t = w[name]
    w[name] = StoredTensor(t.data[:, :-34], t.dtype, t.shape, t.activations)  # a block short in every row
    with pytest.raises(ValueError, match="q8_0 data of a \\[512, 256\\] tensor must be"):
        steps(w, 1, [4], count=1)
