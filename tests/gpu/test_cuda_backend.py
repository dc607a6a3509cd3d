"""The CUDA backend's whole Python path (placement, KV cache, masks, positions, generation, transcription) on
the tiny checkpoint, with CuPy replaced by a strict device double (device_double.py) that refuses every
implicit read on the host and records every explicit one: a round trip to the host anywhere in the data flow
fails here, and the greedy ids must equal the CPU path's.

What runs as it is: nanoasr.backend.cuda (placement, the fused/widen+matmul choice, the scratch buffer, the
device gather) and the launchers of nanoasr.kernels.cuda (argument checks, batches of x rows, the scale view,
the stream). What does not: the numba.cuda kernels themselves are replaced in this tier by their numpy twins
(nanoasr.quant.reference.dequantize and a float32 matmul) run on the arrays inside the device arrays, and
numba's no-sync view of a foreign array is the array itself. The kernels are proven on every stored type by
test_cuda_kernels.py; the simulator could not run the tiny model's 151936-row LM head in a CI test's time.
"""
import sys
import types
from collections import Counter

import numpy as np
import pytest
from device_double import DeviceArray, HostRead, Transfers, cupy_module
from stored_weights import stored

from nanoasr import backend, convert
from nanoasr.api import Model
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.kernels import cuda as gk
from nanoasr.model import generate
from nanoasr.quant.reference import dequantize
from nanoasr.tensor import StoredTensor
from tools.lib.synth import speech_like


class NumpyKernel:
    """Stands for one numba.cuda kernel: kernel[grid, block, stream](*device arrays) runs `twin` on the arrays
    inside them, and the launch is recorded as (kernel, storage type, rows of x or of the output, stream)."""

    def __init__(self, name, dtype, twin, launches):
        self.name, self.dtype, self.twin, self.launches = name, dtype, twin, launches

    def __getitem__(self, launch):
        grid, block, stream = launch

        def run(*args):
            assert all(isinstance(a, DeviceArray) for a in args), "a kernel was given a host array"
            self.launches.append((self.name, self.dtype, args[0].shape[0] if self.name == "matvec" else
                                  args[-1].shape[0], stream))
            self.twin(self.dtype, *(a._a for a in args))
        return run


def matvec_twin(dtype, x, w, scales, out):  # out[n, rows] = x[n, cols] @ W.T
    out[...] = x @ dequantize(w, dtype, (out.shape[1], x.shape[1])).T


def widen_twin(dtype, w, scales, out):
    out[...] = dequantize(w, dtype, out.shape)


@pytest.fixture
def double(monkeypatch):
    """(transfers, kernel launches) of the stand-in CuPy, installed for this test only."""
    log, launches = Transfers(), []
    monkeypatch.setitem(sys.modules, "cupy", cupy_module(log))
    monkeypatch.delitem(sys.modules, "nanoasr.backend.cuda", raising=False)  # imported again, on the double
    monkeypatch.setattr(backend, "_cuda", None)
    monkeypatch.setattr(backend, "_TABLES", {})
    monkeypatch.setattr(gk, "_unsynced", lambda a: a)
    for kind in gk.STORED:
        monkeypatch.setitem(gk.MATVEC, kind, NumpyKernel("matvec", kind, matvec_twin, launches))
        monkeypatch.setitem(gk.WIDEN, kind, NumpyKernel("widen", kind, widen_twin, launches))
    yield log, launches
    sys.modules.pop("nanoasr.backend.cuda", None)  # bound to the double: the next import takes the real CuPy
    vars(backend).pop("cuda", None)


def on_device(a):  # host -> the double's device
    return sys.modules["cupy"].asarray(a)


def test_the_double_refuses_host_reads(double):
    log, _ = double
    cupy = sys.modules["cupy"]
    x = cupy.asarray(np.arange(4, dtype=np.float32))
    for read in (np.asarray, bool, float, list, lambda a: a.tolist(), lambda a: x + np.ones(4, np.float32)):
        with pytest.raises(HostRead):
            read(x.sum() if read in (bool, float) else x)
    assert log.down == []
    np.testing.assert_array_equal(cupy.asnumpy(x * 2), [0, 2, 4, 6])
    assert log.down == [((4,), "float32")]


@pytest.mark.parametrize("dtype,cols", [("q8_0", 64), ("q4_k", 256), ("q6_k", 256), ("bf16", 24),
                                        ("f16", 24), ("f32", 24)])
def test_matrices_stay_in_their_stored_type_on_the_device(double, dtype, cols):
    """Placement copies the stored bytes (no widening on the host); up to 8 rows of x take the fused kernel,
    more take one widening into the scratch buffer and a matmul (float32 weights: the matmul alone); the
    gather widens only the rows taken."""
    log, launches = double
    rng = np.random.default_rng(cols)
    data, w = stored(rng, dtype, 5, cols)
    norm = rng.standard_normal(cols).astype(np.float32)
    cuda = backend.resolve("cuda")
    log.down.clear()  # the self-check's round trip
    placed = cuda.place({"m": StoredTensor(data, dtype, (5, cols)), "v": StoredTensor(norm, "f32", (cols,))},
                        {"v"})
    m = placed["m"]
    assert (m.dtype, m.shape, m.data.dtype, m.data.shape) == (dtype, (5, cols), data.dtype, data.shape)
    np.testing.assert_array_equal(m.data._a, data)
    assert isinstance(placed["v"], DeviceArray) and placed["v"].dtype == np.float32
    for n, kernel in ((1, "matvec"), (8, "matvec"), (9, "widen")):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        launches.clear()
        y = cuda.kernels.stored_matmul(on_device(x), m)
        dense_f32_matmul = kernel == "widen" and dtype == "f32"  # cuBLAS reads float32 weights as they are
        assert [launch[:2] for launch in launches] == ([] if dense_f32_matmul else [(kernel, dtype)])
        np.testing.assert_allclose(y._a, x @ w.T, rtol=1e-5, atol=1e-5)
    launches.clear()
    rows = cuda.kernels.take_rows(m, [4, 0, 4])
    assert launches == [("widen", dtype, 3, 0)]  # on the default stream, CuPy's current one here
    np.testing.assert_array_equal(rows._a, w[[4, 0, 4]])
    assert log.down == []


class Choices:
    """From its making on, the greedy choices (rows of each) and the prefills, and the copies to the device
    counted at each choice."""

    def __init__(self, log: Transfers, monkeypatch):
        self.rows, self.prefills, self.uploads = [], 0, []
        greedy, prefill = generate._greedy, generate._first_choices

        def counted_greedy(logits, suppress=()):
            self.rows.append(logits.shape[0])
            self.uploads.append(log.up)
            return greedy(logits, suppress)

        def counted_prefill(*args):
            self.prefills += 1
            return prefill(*args)

        monkeypatch.setattr(generate, "_greedy", counted_greedy)
        monkeypatch.setattr(generate, "_first_choices", counted_prefill)
        log.down.clear()

    def allowed_reads(self) -> Counter:
        """Per choice of B rows: the ids (int64 [B]) and their log-probabilities (float32 [B]); per prefill:
        the one flag saying its logits are finite."""
        out = Counter({((), "bool"): self.prefills})
        for b in self.rows:
            out[((b,), "int64")] += 1
            out[((b,), "float32")] += 1
        return out

    def uploads_per_step(self) -> int:
        """The most copies to the device between two choices: a decode step's, when one prompt was run."""
        assert self.prefills == 1 and len(self.uploads) > 1
        return int(np.diff(self.uploads).max())


def most_uploads_per_step(layers: int) -> int:
    """The token ids, the positions, the stop ids a forced step suppresses, and each layer's cache lengths
    (host bookkeeping, copied, never read back)."""
    return 3 + layers


@pytest.fixture(scope="module")
def q8_0_dir(tiny_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("q8_0") / "tiny-q8_0.gguf"
    convert.write(path, load_checkpoint(tiny_dir), "q8_0", report=False, progress=None)
    return path


@pytest.mark.parametrize("kind", ["bf16", "q8_0"])
def test_transcription_on_the_device_matches_the_cpu(double, monkeypatch, tiny_dir, q8_0_dir, kind):
    """Frontend on the host, uploaded once; encoder, adaptor, prompt, prefill and decode on the device; only
    the chosen ids, their log-probabilities and one finiteness flag per prefill come back."""
    log, launches = double
    path = str(tiny_dir if kind == "bf16" else q8_0_dir)
    wave = speech_like(1.5, 4)
    on_cpu = Model.load(path, activations="exact").transcribe(wave, sample_rate=16000, max_new_tokens=6,
                                                              ignore_stop=True)
    model = Model.load(path, device="cuda")
    assert isinstance(model.weights["model.language_model.embed_tokens.weight"].data, DeviceArray)
    choices = Choices(log, monkeypatch)
    got = model.transcribe(wave, sample_rate=16000, max_new_tokens=6, ignore_stop=True)
    assert [s.token_ids for s in got.segments] == [s.token_ids for s in on_cpu.segments]
    assert len(got.segments[0].token_ids) == 6
    assert Counter(log.down) == choices.allowed_reads()
    assert 0 < choices.uploads_per_step() <= most_uploads_per_step(model.config.text.num_hidden_layers)
    assert {(name, stream) for name, _, _, stream in launches} == {("matvec", 0), ("widen", 0)}


def test_batched_generation_on_the_device_matches_the_cpu(double, monkeypatch, tiny_dir):
    """Three prompts through two cache rows: batched steps, a finished row swapped out and refilled."""
    log, _ = double
    on_cpu, model = Model.load(str(tiny_dir), activations="exact"), Model.load(str(tiny_dir), device="cuda")
    cfg = model.config.text
    rng = np.random.default_rng(1)
    prompts = [rng.standard_normal((n, cfg.hidden_size)).astype(np.float32) for n in (7, 12, 4)]
    budgets, stop = [5, 3, 4], on_cpu.tokenizer.stop_ids
    want = generate.generate(prompts, budgets, on_cpu.weights, cfg, stop, ignore_stop=True, rows=2)
    choices = Choices(log, monkeypatch)
    got = generate.generate([on_device(p) for p in prompts], budgets, model.weights, cfg, stop,
                            ignore_stop=True, rows=2)
    assert [g.ids for g in got] == [g.ids for g in want]
    assert Counter(log.down) == choices.allowed_reads()
    assert ((2,), "int64") in log.down  # two rows decoded in one step


def test_kernels_launch_on_cupys_current_stream(double, monkeypatch):
    """A stream of CuPy's own (here pointer 7) reaches the kernels as numba's handle on it, made once."""
    _, launches = double
    cupy = sys.modules["cupy"]
    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda: types.SimpleNamespace(ptr=7))
    cuda = backend.resolve("cuda")
    handles, table = [], cuda.kernels  # imports nanoasr.backend.cuda, on the stand-in
    numba_cuda = sys.modules["nanoasr.backend.cuda"].cuda
    monkeypatch.setattr(numba_cuda, "external_stream", lambda ptr: handles.append(ptr) or f"stream {ptr}")
    data, _ = stored(np.random.default_rng(0), "q8_0", 3, 32)
    m = cuda.place({"m": StoredTensor(data, "q8_0", (3, 32))}, set())["m"]
    launches.clear()
    for n in (1, 9):
        table.stored_matmul(on_device(np.ones((n, 32), np.float32)), m)
    assert [(kernel, stream) for kernel, _, _, stream in launches] == [("matvec", "stream 7"),
                                                                       ("widen", "stream 7")]
    assert handles == [7]
