"""bf16 activations: rows rounded to bf16 (as torch rounds them) times BF16 weights, and attention's operands
likewise in the many-row forwards, with float32 sums: on AMX tiles where this CPU has them
(nanoasr/kernels/bf16/amx.py), else on the bf16 GEMM where it has AVX512-BF16
(nanoasr/kernels/bf16/avx512.py), else BLAS on the rounded operands (nanoasr.backend.xp.products_xp). The same
tests run on any path; each checks which one ran."""
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from nanoasr.api import Model
from nanoasr.backend import CPU, with_activations, xp
from nanoasr.backend import cpu as cpu_backend
from nanoasr.cli import serve, transcribe
from nanoasr.kernels import target
from nanoasr.kernels.bf16 import amx
from nanoasr.kernels.bf16 import avx512 as bf16_gemm
from nanoasr.tensor import StoredTensor
from tools.lib.parity import stage_outputs, teacher_forced_logits
from tools.lib.synth import speech_like

torch = pytest.importorskip("torch")


def torch_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> the float32 value of torch's bf16 rounding (to nearest, ties to even)."""
    return torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16).to(torch.float32).numpy()


def rounded64(a: np.ndarray) -> np.ndarray:
    return torch_bf16(a).astype(np.float64)


def accumulation_bound(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """float32 rounding of a sum of K products: (K + 2) units of 2^-24 of the sum of their magnitudes."""
    k = x.shape[-1]
    return (k + 2) * 2.0 ** -24 * (np.abs(rounded64(x)) @ np.swapaxes(np.abs(rounded64(y)), -1, -2))


def counting_calls(monkeypatch, module) -> list:
    calls, real = [], module.products

    def spy(x, w, out):
        calls.append(x.shape)
        return real(x, w, out)
    monkeypatch.setattr(module, "products", spy)
    return calls


def counting_tile_calls(monkeypatch) -> list:
    return counting_calls(monkeypatch, amx)


def on_the_gemm() -> bool:
    """Whether the bf16 GEMM runs what the tiles would run: AVX512-BF16 without AMX."""
    return not amx.available() and bf16_gemm.available()


def rounded_bits(a: np.ndarray) -> np.ndarray:
    return (torch_bf16(a).view(np.uint32) >> 16).astype(np.uint16)


def test_rows_round_to_bf16_as_torch_does():
    """Halfway cases both ways (ties to even), values rounding up into the next binade, and random values."""
    rng = np.random.default_rng(0)
    high = rng.integers(0, 0x7F00, 4096).astype(np.uint32) << 16
    halfway = (high | 0x8000).view(np.float32)
    above = (high | 0x8001).view(np.float32)
    carry = (np.uint32(0x3F7FFFFF) - rng.integers(0, 0x7FFF, 64).astype(np.uint32)).view(np.float32)
    x = np.concatenate([halfway, -halfway, above, carry, rng.standard_normal(4096).astype(np.float32)])
    assert np.array_equal(xp.rows_bf16_xp(x[None]), torch_bf16(x[None]))
    bits = amx.bf16_rows(np.tile(x, (3, 1)))[0, 0]  # the numba rounding, padded to multiples of 32
    assert bits.shape == (32, -(-len(x) // 32) * 32) and not bits[3:].any() and not bits[:, len(x):].any()
    assert np.array_equal((bits[:3, :len(x)].astype(np.uint32) << 16).view(np.float32),
                          np.tile(torch_bf16(x), (3, 1)))


def test_weight_rows_pad_only_what_the_tiles_cannot_take():
    fits = np.arange(64 * 96, dtype=np.uint16).reshape(64, 96)
    assert amx.weight_rows(fits) is fits
    odd = fits[:40, :70].copy()
    padded = amx.weight_rows(odd)
    assert padded.shape == (64, 96) and np.array_equal(padded[:40, :70], odd)
    assert not padded[40:].any() and not padded[:, 70:].any()


@pytest.mark.parametrize("xs, ys", [
    ((37, 64), (64, 64)), ((300, 560), (96, 560)), ((45, 100), (70, 100)), ((2, 3, 17, 33), (2, 3, 40, 33)),
    ((1, 2, 70, 128), (1, 2, 50, 128))])
def test_bf16_products_are_the_products_of_the_rounded_operands(xs, ys, monkeypatch):
    """Within float32 accumulation of the rounded operands' float64 product; the unrounded product is not
    (so the bound tells bf16 rows from float32 ones)."""
    rng = np.random.default_rng(sum(xs) + sum(ys))
    x, y = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ys).astype(np.float32)
    calls, gemm_calls = counting_tile_calls(monkeypatch), counting_calls(monkeypatch, bf16_gemm)
    got = cpu_backend.products(x, y, "bf16")
    want = rounded64(x) @ np.swapaxes(rounded64(y), -1, -2)
    bound = accumulation_bound(x, y)
    assert got.shape == want.shape and np.all(np.abs(got - want) <= bound)
    unrounded = x.astype(np.float64) @ np.swapaxes(y.astype(np.float64), -1, -2)
    assert not np.all(np.abs(unrounded - want) <= bound)
    assert (len(calls), len(gemm_calls)) == (amx.available(), on_the_gemm())


def test_head_split_views_go_in_as_they_are(monkeypatch):
    """Attention's operands: heads split from [B, T, H*d] rows by a transposing view, and values swapped."""
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal((2, 70, 256)).astype(np.float32) for _ in range(3)]
    q, k, v = (r.reshape(2, 70, 2, 128).transpose(0, 2, 1, 3) for r in rows)
    calls, gemm_calls = counting_tile_calls(monkeypatch), counting_calls(monkeypatch, bf16_gemm)
    scores = cpu_backend.products(q, k, "bf16")
    want = rounded64(q) @ np.swapaxes(rounded64(k), -1, -2)
    assert np.all(np.abs(scores - want) <= accumulation_bound(q, k))
    p = rng.random((2, 2, 70, 70), dtype=np.float32)
    vt = np.swapaxes(v, -1, -2)
    attended = cpu_backend.products(p, vt, "bf16")
    assert np.all(np.abs(attended - rounded64(p) @ np.swapaxes(rounded64(vt), -1, -2))
                  <= accumulation_bound(p, vt))
    assert (len(calls), len(gemm_calls)) == (2 * amx.available(), 2 * on_the_gemm())


@pytest.mark.parametrize("n", [3, 37])
def test_stored_bf16_matrices_meet_rounded_rows(n, monkeypatch):
    """Few rows (the streamed product on rounded rows) and many (the tiles, or BLAS on rounded rows); a width
    of 560 columns is not a whole number of tile steps."""
    rng = np.random.default_rng(n)
    w = rng.standard_normal((80, 560)).astype(np.float32) * np.float32(0.05)
    bits = rounded_bits(w)
    stored = StoredTensor(bits, "bf16", (80, 560), activations="bf16")
    x = rng.standard_normal((n, 560)).astype(np.float32)
    calls, gemm_calls = counting_tile_calls(monkeypatch), counting_calls(monkeypatch, bf16_gemm)
    got = cpu_backend.stored_matmul(x, stored)
    wide = torch_bf16(w)
    assert np.all(np.abs(got - rounded64(x) @ wide.T.astype(np.float64)) <= accumulation_bound(x, wide))
    assert len(calls) == (n > cpu_backend.FUSED_ROWS and amx.available())
    assert len(gemm_calls) == (n > cpu_backend.FUSED_ROWS and on_the_gemm())
    exact = cpu_backend.stored_matmul(x, StoredTensor(bits, "bf16", (80, 560)))
    assert not np.array_equal(got, exact)


def test_tiles_refuse_mismatched_operands_and_a_process_without_them(monkeypatch):
    x, out = np.zeros((4, 64), np.float32), np.zeros((4, 40), np.float32)
    with pytest.raises(ValueError, match="AMX products take"):
        amx.products(x, np.zeros((32, 64), np.uint16), out)  # out has more columns than W has rows
    with pytest.raises(ValueError, match="AMX products take"):
        amx.products(x, np.zeros((64, 96), np.uint16), out)  # W wider than x by a whole tile step
    monkeypatch.setattr(amx, "available", lambda: False)
    with pytest.raises(RuntimeError, match="cannot run AMX tiles"):
        amx.products(x, np.zeros((64, 64), np.uint16), out)


needs_gemm = pytest.mark.skipif(not bf16_gemm.available(), reason="no AVX512-BF16")


@pytest.mark.cpu_path
@needs_gemm
@pytest.mark.parametrize("stack, m, n, k", [
    ((), 37, 64, 64), ((), 9, 33, 560), ((), 300, 96, 100), ((), 70, 1024, 1024), ((2, 3), 45, 70, 100),
    ((1, 4), 70, 50, 128)])
@pytest.mark.parametrize("strided", [False, True])
def test_bf16_gemm_products_are_the_products_of_the_rounded_operands(stack, m, n, k, strided):
    """Rows and columns that are and are not multiples of the panel's 32 and the call's 8 rows, a stored
    matrix (padded by weight_rows) or stacks of them (attention's heads, rounded by bf16_rows); x a strided
    view too."""
    rng = np.random.default_rng(m + n + k)
    x = rng.standard_normal(stack + (m, 2 * k if strided else k)).astype(np.float32)
    x = x[..., ::2] if strided else x
    w = rng.standard_normal(stack + (n, k)).astype(np.float32)
    operand = amx.bf16_rows(w) if stack else amx.weight_rows(rounded_bits(w))
    got = bf16_gemm.products(x, operand, np.full(stack + (m, n), np.nan, np.float32))
    wide = torch_bf16(w)
    want = rounded64(x) @ np.swapaxes(wide, -1, -2).astype(np.float64)
    assert np.all(np.abs(got - want) <= accumulation_bound(x, wide))
    unrounded = x.astype(np.float64) @ np.swapaxes(w, -1, -2).astype(np.float64)
    assert not np.all(np.abs(unrounded - want) <= accumulation_bound(x, wide))


@pytest.mark.cpu_path
@needs_gemm
def test_bf16_gemm_uses_the_instruction():
    """Compiled afresh: a driver loaded from numba's disk cache has no assembly text to show."""
    from numba import njit

    fresh = njit(parallel=True)(bf16_gemm._products.py_func)
    fresh(np.zeros((1, 1, 32, 64), np.uint16), np.zeros((1, 1, 32, 64), np.uint16),
          np.empty((1, 1, 9, 32), np.float32))
    assert "\tvdpbf16ps\t" in "".join(fresh.inspect_asm().values())


def test_bf16_gemm_refuses_mismatched_operands_and_a_cpu_without_it(monkeypatch):
    x, w = np.zeros((9, 64), np.float32), np.zeros((32, 64), np.uint16)
    for bad_x, bad_w, bad_out in [
            (x, w, np.zeros((9, 40), np.float32)),  # out has more columns than W has rows
            (x, np.zeros((32, 96), np.uint16), np.zeros((9, 32), np.float32)),  # W wider by a whole step
            (x, np.zeros((33, 64), np.uint16), np.zeros((9, 33), np.float32)),  # W not padded
            (x.astype(np.float64), w, np.zeros((9, 32), np.float32))]:
        with pytest.raises(ValueError, match="bf16 GEMM products take"):
            bf16_gemm.products(bad_x, bad_w, bad_out)
    monkeypatch.setattr(bf16_gemm, "available", lambda: False)
    with pytest.raises(RuntimeError, match="no AVX512-BF16"):
        bf16_gemm.products(x, w, np.zeros((9, 32), np.float32))


def test_tiles_need_the_cpu_features(monkeypatch):
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features()
    without = {k: v for k, v in features.items() if not k.startswith("amx")}
    monkeypatch.setattr(llvm, "get_host_cpu_features", lambda: without)
    amx.available.cache_clear()
    target.features.cache_clear()
    try:
        assert amx.available() is False
    finally:
        amx.available.cache_clear()
        target.features.cache_clear()


def test_bf16_activations_mark_the_bf16_matrices_only():
    kinds = {"q8_0": (34, 32), "f16": (2, 1), "f32": (4, 1), "bf16": (2, 1)}
    dtypes = {"q8_0": np.uint8, "f16": np.float16, "f32": np.float32, "bf16": np.uint16}
    tensors = {k: StoredTensor(np.zeros((2, n // dtypes[k]().itemsize), dtypes[k]), k, (2, per))
               for k, (n, per) in kinds.items()}
    bf16 = with_activations(CPU, "bf16")
    placed = bf16.place(tensors, set())
    assert {k: t.activations for k, t in placed.items()} == {
        "q8_0": "exact", "f16": "exact", "f32": "exact", "bf16": "bf16"}
    # numba's threads run the many-row products whatever the weights are placed for: the tiles, the bf16
    # GEMM, or BLAS on each of them
    exact = with_activations(CPU, "exact")
    assert bf16.numba_products(placed) and exact.numba_products(exact.place(tensors, set()))


def forced_logits(model, steps=6):
    embeds = stage_outputs(model, speech_like(2.0, 5), "funasr", {})["embeds"]
    return teacher_forced_logits(model, embeds, list(range(100, 100 + steps)), steps)


def test_bf16_activations_reach_every_large_product(tiny_model, monkeypatch):
    """The tiny BF16 checkpoint: encoder, adaptor and prefill products (weights and attention) on the tiles
    where the CPU has them, else the stored matrices' on the bf16 GEMM where it has AVX512-BF16. The logits
    move off the exact ones, by a few bf16 units (2^-8 relative) of their scale at most, on the tiles, the
    GEMM and BLAS alike (they differ by as much: a last-bit difference in a float32 sum can move a later bf16
    rounding by a unit)."""
    bf16 = Model(tiny_model.checkpoint, activations="bf16")
    assert {t.activations for t in bf16.weights.values() if isinstance(t, StoredTensor)} == {"bf16"}
    calls, gemm_calls = counting_tile_calls(monkeypatch), counting_calls(monkeypatch, bf16_gemm)
    exact = forced_logits(tiny_model)
    assert calls == gemm_calls == []
    got = forced_logits(bf16)
    assert (len(calls) > 0) == amx.available()
    assert (len(gemm_calls) > 0) == (not amx.available() and bf16_gemm.available())
    monkeypatch.setattr(amx, "available", lambda: False)
    monkeypatch.setattr(bf16_gemm, "available", lambda: False)
    blas = forced_logits(Model(tiny_model.checkpoint, activations="bf16"))
    scale = np.abs(exact).max()
    for logits in (got, blas):
        assert not np.array_equal(logits, exact) and np.abs(logits - exact).max() <= 8 * 2.0 ** -8 * scale


@pytest.mark.parametrize("parser", [transcribe.build_parser, serve.build_parser])
def test_commands_take_bf16_activations(parser):
    argv = ["a.wav"] if parser is transcribe.build_parser else []
    assert parser().parse_args(argv + ["--activations", "bf16"]).activations == "bf16"


def test_rows_split_among_numba_threads_are_the_serial_rows():
    """Where numba's threads run the products, LayerNorm, RMSNorm, bias (+ ReLU), SwiGLU and softmax share
    their rows out among them (row counts that do and do not divide evenly); each row is bit for bit the
    serial one."""
    from nanoasr.kernels import elementwise, softmax

    rng = np.random.default_rng(9)
    for n in (1, 7, 500):
        x = rng.standard_normal((n, 96)).astype(np.float32)
        w, b = rng.standard_normal(96).astype(np.float32), rng.standard_normal(96).astype(np.float32)
        assert np.array_equal(elementwise.layer_norm(x, w, b, 1e-5, split=True),
                              elementwise.layer_norm(x, w, b, 1e-5))
        assert np.array_equal(elementwise.rms_norm(x, w, 1e-6, split=True), elementwise.rms_norm(x, w, 1e-6))
        split = elementwise.swiglu(x.copy(), b + x, split=True)
        assert np.array_equal(split, elementwise.swiglu(x.copy(), b + x))
        for relu in (False, True):
            assert np.array_equal(elementwise.add_bias(x.copy(), b, relu, split=True),
                                  elementwise.add_bias(x.copy(), b, relu))
        split = softmax.softmax_inplace(x.copy(), 0.3, split=True)
        assert np.array_equal(split, softmax.softmax_inplace(x.copy(), 0.3))


def test_numba_products_scope_keeps_blas_to_one_thread():
    from threadpoolctl import threadpool_info

    from nanoasr.backend import host

    def blas_threads():
        return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}

    before = blas_threads()
    with host.threads(2, numba_products=True):
        assert host.NUMBA_PRODUCTS.get() and blas_threads() == {1}
    assert not host.NUMBA_PRODUCTS.get() and blas_threads() == before
    with host.threads(2):
        assert not host.NUMBA_PRODUCTS.get() and blas_threads() == {2}


def test_bf16_attention_products_share_their_heads_out_where_numba_runs_the_products(monkeypatch):
    """Where numba's threads run the products (and BLAS is kept to one thread) attention's bf16 products,
    where neither the tiles nor the bf16 GEMM take them, round their operands and share the heads among
    numba's threads: the twin's bits with BLAS on one thread, as in that scope."""
    from nanoasr.backend import host
    from nanoasr.kernels import blas_split

    monkeypatch.setattr(amx, "available", lambda: False)
    monkeypatch.setattr(bf16_gemm, "available", lambda: False)
    calls, real = [], blas_split.products
    monkeypatch.setattr(blas_split, "products", lambda a, b: calls.append(a.shape) or real(a, b))
    rng = np.random.default_rng(5)
    q, k = (rng.standard_normal((1, 4, 300, 128)).astype(np.float32) for _ in range(2))
    with host.threads(2, numba_products=True):
        got = cpu_backend.products(q, k, "bf16")
    with threadpool_limits(limits=1, user_api="blas"):  # BLAS's own threads may sum in another order
        want = xp.products_xp(q, k, "bf16")
    assert calls == [q.shape] and np.array_equal(got, want)
