"""The compiled decode layer (nanoasr.kernels.decode_layer) against the op-by-op decoder layer it replaces:
the same kernels in the same order, so the same bits, for every storage type with float32 rows, rows rounded
to bf16 and int8 ones, one row and batches whose rows sit at different positions; and the guard that sends a
layer to it only where every product runs a decode kernel over whole blocks and a float32 cache."""
import numpy as np
import pytest

from nanoasr.backend import cpu as cpu_backend
from nanoasr.kernels import decode_layer as layer_kernel
from nanoasr.model import decoder
from nanoasr.model.config import TextConfig
from nanoasr.ops import rope_inv_freq
from nanoasr.quant.quantize import quantize
from nanoasr.tensor import StoredTensor

CFG = TextConfig(vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64)
SHAPES = {"self_attn.q_proj": (256, 256), "self_attn.k_proj": (128, 256), "self_attn.v_proj": (128, 256),
          "self_attn.o_proj": (256, 256), "mlp.gate_proj": (512, 256), "mlp.up_proj": (512, 256),
          "mlp.down_proj": (256, 512)}
DENSE = ("f32", "f16", "bf16")
MIXES = {"q8_0 int8": (["q8_0"] * 7, "int8"),
         "q4_k_m int8": (["q4_k", "q4_k", "q6_k", "q4_k", "q4_k", "q4_k", "q6_k"], "int8"),
         "each kind int8": (["q6_k", "q8_0", "q4_k", "q6_k", "q8_0", "q4_k", "q8_0"], "int8"),
         "bf16": (["bf16"] * 7, "exact"),
         "each kind exact": (["f16", "f32", "bf16", "q4_k", "q6_k", "q8_0", "f16"], "exact"),
         "int8 beside dense": (["q8_0", "bf16", "q4_k", "f16", "q8_0", "q6_k", "f32"], "int8"),
         "bf16 rows": (["bf16"] * 7, "bf16"),
         "bf16 rows beside dense": (["bf16", "f16", "bf16", "q8_0", "bf16", "f32", "bf16"], "bf16")}


def marked(kind, activations):  # as nanoasr.backend.cpu.place marks a matrix of `kind`
    if activations == "int8":
        return "exact" if kind in DENSE else "int8"
    return "bf16" if activations == "bf16" and kind == "bf16" else "exact"


def stored(w, kind, activations):
    """w float32 [rows, cols] in storage type `kind`, marked for `activations` as the CPU places it."""
    if kind in DENSE:
        data = {"f32": w, "f16": w.astype(np.float16), "bf16": (w.view(np.uint32) >> 16).astype(np.uint16)}
        return StoredTensor(data[kind], kind, w.shape, marked(kind, activations))
    return StoredTensor(quantize(w, kind), kind, w.shape, marked(kind, activations))


def layer_weights(kinds, activations, seed=0):
    rng = np.random.default_rng(seed)
    w = {}
    for i in range(CFG.num_hidden_layers):
        p = f"{decoder.P}layers.{i}."
        for (name, shape), kind in zip(SHAPES.items(), kinds):
            w[f"{p}{name}.weight"] = stored((rng.standard_normal(shape) * 0.1).astype(np.float32), kind,
                                            activations)
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
    original = cpu_backend.KERNELS.compiled_layer
    cpu_backend.KERNELS.compiled_layer = original if whole else (lambda *layer: None)
    try:
        out = []
        for _ in range(count):
            x = rng.standard_normal((rows, 1, CFG.hidden_size)).astype(np.float32)
            start = cache.lengths[:rows].copy()
            out.append(decoder.forward(x, w, CFG, cache, slice(0, rows), start, inv_freq))
        return np.stack(out)
    finally:
        cpu_backend.KERNELS.compiled_layer = original


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("prompt_lengths", [[5], [3, 9, 2]])
def test_the_compiled_layer_gives_the_bits_of_the_op_by_op_layer(monkeypatch, mix, prompt_lengths):
    w = layer_weights(*MIXES[mix])
    calls = []
    compiled = layer_kernel.decode_layer

    def spy(x, products, *args):
        calls.append((x.shape, products))
        return compiled(x, products, *args)
    monkeypatch.setattr(layer_kernel, "decode_layer", spy)
    whole = steps(w, len(prompt_lengths), prompt_lengths)
    assert len(calls) == 4 * CFG.num_hidden_layers
    assert {shape for shape, _ in calls} == {(len(prompt_lengths), CFG.hidden_size)}
    kinds, activations = MIXES[mix]
    rows = {"int8": cpu_backend.host_path() or "exact", "bf16": "bf16", "exact": "exact"}
    assert {products for _, products in calls} == {tuple((kind, rows[marked(kind, activations)])
                                                         for kind in kinds)}
    apart = steps(w, len(prompt_lengths), prompt_lengths, whole=False)
    assert len(calls) == 4 * CFG.num_hidden_layers
    np.testing.assert_array_equal(whole, apart)
    assert np.isfinite(whole).all() and np.abs(whole).max() > 0.1


def test_a_matrix_with_a_partial_block_keeps_its_layer_op_by_op():
    """Columns past a matrix's last whole block meet BLAS in the op-by-op product."""
    w = layer_weights(*MIXES["bf16 rows"])
    matrices = [w[f"{decoder.P}layers.0.{name}.weight"] for name in decoder.MATRICES]
    ragged = np.zeros((256, 500), np.uint16)
    matrices[6] = StoredTensor(ragged, "bf16", ragged.shape, "bf16")
    assert cpu_backend.compiled_layer(matrices, []) is None


def test_stored_data_that_does_not_fit_its_shape_is_refused():
    w = layer_weights(*MIXES["q8_0 int8"])
    name = f"{decoder.P}layers.0.mlp.up_proj.weight"
    t = w[name]
    w[name] = StoredTensor(t.data[:, :-34], t.dtype, t.shape, t.activations)  # a block short in every row
    with pytest.raises(ValueError, match="q8_0 data of a \\[512, 256\\] tensor must be"):
        steps(w, 1, [4], count=1)


def test_a_session_checks_and_compiles_its_layers_once(monkeypatch):
    """The stored matrices are checked when a session's first step makes its compiled layers, not at every
    step; the session's steps give the bits of forward calls that make them afresh."""
    w = layer_weights(*MIXES["q4_k_m int8"])
    w[decoder.EMBED] = np.random.default_rng(2).standard_normal((CFG.vocab_size, CFG.hidden_size), np.float32)
    made, original = [], cpu_backend.KERNELS.compiled_layer
    monkeypatch.setattr(cpu_backend.KERNELS, "compiled_layer",
                        lambda *layer: made.append(1) or original(*layer))
    session = decoder.Session(w, CFG, rows=1)
    session.prefill(np.ones((5, CFG.hidden_size), np.float32), room=4)
    assert made == []
    logits = [session.step([token]) for token in (7, 11, 13)]
    assert len(made) == CFG.num_hidden_layers

    cache = decoder.KVCache(CFG, 1, 9)
    inv_freq = rope_inv_freq(CFG.head_dim, CFG.rope_theta)
    decoder.forward(np.ones((1, 5, CFG.hidden_size), np.float32), w, CFG, cache, slice(0, 1), [0], inv_freq)
    for token, expected in zip((7, 11, 13), logits):
        start = cache.lengths[:1].copy()
        x = w[decoder.EMBED][[token]][:, None]
        hidden = decoder.forward(x, w, CFG, cache, slice(0, 1), start, inv_freq)
        np.testing.assert_array_equal(decoder.logits(hidden, w), expected)
    assert len(made) == 4 * CFG.num_hidden_layers
