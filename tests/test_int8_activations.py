"""The activations option: Model(activations="int8") sends the products over block-quantized weights (Q8_0,
Q4_K, Q6_K) to the integer kernels (few rows: int8/dot.py; many rows: the int8 GEMM, where AVX512-VNNI runs
it), "exact" never does, and the CLI commands take it."""
import numpy as np
import pytest

from nanoasr import convert
from nanoasr.api import Model
from nanoasr.backend import cpu as cpu_backend
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.cli import serve, transcribe
from nanoasr.errors import OptionError
from nanoasr.kernels import stored
from tools.lib.parity import stage_outputs, teacher_forced_logits
from tools.lib.synth import speech_like


@pytest.fixture(scope="module")
def tiny_q8_0(tiny_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("q8") / "tiny-q8_0.gguf"
    convert.write(path, load_checkpoint(tiny_dir), "q8_0", report=False, progress=None)
    return Model.load(str(path), activations="exact")


def forced_logits(model, steps=6):
    embeds = stage_outputs(model, speech_like(2.0, 5), "funasr", {})["embeds"]
    return teacher_forced_logits(model, embeds, list(range(100, 100 + steps)), steps)


def counting_int8_calls(monkeypatch) -> list:
    """Rows of x and path ("gemm" for the many-row product) of each integer product."""
    calls, few, many = [], stored.matvec_int8, stored.gemm_int8

    def spy(x, data, dtype, rows, cols, out, path):
        calls.append((len(x), path))
        return few(x, data, dtype, rows, cols, out, path)

    def gemm_spy(x, data, dtype, rows, cols, out, path):
        calls.append((len(x), "gemm"))
        return many(x, data, dtype, rows, cols, out, path)
    monkeypatch.setattr(cpu_backend.stored, "matvec_int8", spy)
    monkeypatch.setattr(cpu_backend.stored, "gemm_int8", gemm_spy)
    return calls


def test_int8_activations_reach_the_integer_kernel(tiny_q8_0, monkeypatch):
    int8 = Model(tiny_q8_0.checkpoint, activations="int8")
    placed = {t.dtype: t.activations for t in int8.weights.values() if hasattr(t, "activations")}
    assert placed["q8_0"] == "int8" and tiny_q8_0.backend.activations == "exact"
    calls = counting_int8_calls(monkeypatch)
    exact_logits = forced_logits(tiny_q8_0)
    assert calls == []
    int8_logits = forced_logits(int8)
    few = [n for n, p in calls if p != "gemm"]
    many = [n for n, p in calls if p == "gemm"]
    assert few and {p for _, p in calls if p != "gemm"} == {cpu_backend.host_path()} and max(few) <= 8
    assert bool(many) == (cpu_backend.host_path() is not None) and min(many, default=9) > 8
    assert not np.array_equal(int8_logits, exact_logits)


def test_int8_activations_mark_the_block_types_but_not_dense_ones():
    from nanoasr.backend import CPU, with_activations
    from nanoasr.tensor import StoredTensor

    kinds = {"q8_0": (34, 32), "q4_k": (144, 256), "q6_k": (210, 256), "bf16": (2, 1)}
    tensors = {k: StoredTensor(np.zeros((2, n), np.uint8 if k != "bf16" else np.uint16), k, (2, per))
               for k, (n, per) in kinds.items()}
    placed = with_activations(CPU, "int8").place(tensors, set())
    assert {k: t.activations for k, t in placed.items()} == {
        "q8_0": "int8", "q4_k": "int8", "q6_k": "int8", "bf16": "exact"}
    exact = with_activations(CPU, "exact")
    assert {t.activations for t in exact.place(tensors, set()).values()} == {"exact"}
    # numba's threads run the many-row products, the int8 GEMM's or BLAS's on each thread: BLAS is kept to
    # one thread whatever the weights are placed for
    assert CPU.numba_products(placed) and CPU.numba_products(exact.place(tensors, set()))


def test_without_an_integer_path_int8_falls_back_to_the_float_product(tiny_q8_0, monkeypatch):
    monkeypatch.setattr(cpu_backend, "host_path", lambda: None)
    calls = counting_int8_calls(monkeypatch)
    got = forced_logits(Model(tiny_q8_0.checkpoint, activations="int8"))
    assert calls == [] and np.array_equal(got, forced_logits(tiny_q8_0))


def test_activations_option_is_checked(tiny_q8_0):
    with pytest.raises(OptionError, match="activations must be one of auto, exact, int8, bf16") as err:
        Model(tiny_q8_0.checkpoint, activations="int4")
    assert err.value.field == "activations"


@pytest.mark.parametrize("parser", [transcribe.build_parser, serve.build_parser])
def test_commands_take_activations(parser):
    argv = ["a.wav"] if parser is transcribe.build_parser else []
    assert parser().parse_args(argv).activations == "auto"
    assert parser().parse_args(argv + ["--activations", "int8"]).activations == "int8"
