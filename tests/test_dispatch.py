"""The backend owns dispatch: only nanoasr/backend tests which array module runs, each op goes through the
kernel table of the device holding its input, and the CPU table sends an array to the numba kernel when
the kernel's guard holds and to the op's array-module twin otherwise."""
import pathlib
import re

import numba
import numpy as np
import pytest

from nanoasr import backend, ops
from nanoasr.backend import host, xp
from nanoasr.backend import cpu as cpu_table
from nanoasr.kernels import attention, elementwise, softmax, stored
from nanoasr.tensor import StoredTensor, take_rows, widen
from tests.test_attention_kernel import new_position_case

PACKAGE = pathlib.Path(ops.__file__).parent
BACKEND_TEST = re.compile(r"\bis\s+(not\s+)?(np|numpy)\b")


def test_only_the_backend_package_asks_which_array_module_runs():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if (PACKAGE / "backend") in path.parents:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if BACKEND_TEST.search(line.split("#")[0]):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not found, "backend tests outside nanoasr/backend:\n" + "\n".join(found)
    assert BACKEND_TEST.search("if xp is not np:") and BACKEND_TEST.search("array_module(x) is np")


def record(monkeypatch, module, name) -> list:
    """Calls of module.name from now on (it still runs)."""
    calls, original = [], getattr(module, name)

    def spy(*args, **options):
        calls.append(args)
        return original(*args, **options)

    monkeypatch.setattr(module, name, spy)
    return calls


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def shaped(shape, dtype, contiguous):  # an array with its own memory, or a strided view of the same values
    x = f32(*shape, seed=2).astype(dtype)
    return x if contiguous else np.repeat(x, 2, axis=-1)[..., ::2]


# op -> (the module holding its kernel, its arguments after x, the shape of x)
CASES = {
    "layer_norm": (elementwise, lambda: (f32(8), f32(8), 1e-5), (6, 8)),
    "rms_norm": (elementwise, lambda: (f32(8), 1e-6), (6, 8)),
    "softmax_inplace": (softmax, lambda: (), (6, 8)),
    "swiglu": (elementwise, lambda: (f32(6, 8, seed=1),), (6, 8)),
    "apply_rope": (elementwise, lambda: (f32(3, 4), f32(3, 4)), (3, 2, 4)),
    "fsmn": (elementwise, lambda: (f32(4, 1, 3),), (6, 4)),
}


@pytest.mark.parametrize("op", sorted(CASES))
@pytest.mark.parametrize("dtype, contiguous", [(np.float32, True), (np.float64, True), (np.float32, False)])
def test_cpu_ops_reach_the_kernel_when_its_guard_holds(monkeypatch, op, dtype, contiguous):
    module, rest, shape = CASES[op]
    x = shaped(shape, dtype, contiguous)
    assert x.flags.c_contiguous == contiguous
    kernel, twin = record(monkeypatch, module, op), record(monkeypatch, xp, op + "_xp")
    getattr(ops, op)(x, *rest())
    # softmax and swiglu overwrite their input, so they take only its own float32 C-contiguous memory;
    # the other kernels copy a strided input and take any float32 layout
    in_place = op in ("softmax_inplace", "swiglu")
    to_kernel = dtype == np.float32 and (contiguous or not in_place)
    assert (len(kernel), len(twin)) == ((1, 0) if to_kernel else (0, 1))


@pytest.mark.parametrize("dtype, bias, relu, to_kernel", [
    (np.float32, True, False, True), (np.float32, True, True, True), (np.float32, False, True, False),
    (np.float64, True, True, False)])
def test_a_linear_layers_bias_goes_to_the_kernel_for_float32(monkeypatch, dtype, bias, relu, to_kernel):
    kernel, twin = record(monkeypatch, elementwise, "add_bias"), record(monkeypatch, xp, "add_bias_xp")
    x, w, b = f32(3, 8).astype(dtype), f32(5, 8, seed=1).astype(dtype), f32(5, seed=2).astype(dtype)
    y = ops.linear(x, w, b if bias else None, relu)
    expected = x @ w.T + (b if bias else 0)
    np.testing.assert_allclose(y, np.maximum(expected, 0) if relu else expected, rtol=1e-6)
    assert (len(kernel), len(twin)) == ((1, 0) if to_kernel else (0, 1))


@pytest.mark.parametrize("rows, route", [(1, "matvec"), (8, "matvec"), (9, "widen")])
def test_stored_weights_stream_through_matvec_for_few_rows_and_widen_for_many(monkeypatch, rows, route):
    matvec, wide = record(monkeypatch, stored, "matvec"), record(monkeypatch, stored, "widen")
    w = f32(16, 64, seed=1)
    bf16 = StoredTensor((w.view(np.uint32) >> 16).astype(np.uint16), "bf16", w.shape)
    x = f32(rows, 64)
    np.testing.assert_allclose(ops.linear(x, bf16), x @ widen(bf16).T, rtol=1e-5, atol=1e-5)
    assert (len(matvec), len(wide)) == ((1, 0) if route == "matvec" else (0, 1))


def decode_case(dtype):
    rng = np.random.default_rng(4)
    keys = rng.standard_normal((3, 2, 10, 8)).astype(dtype)
    values = rng.standard_normal(keys.shape).astype(dtype)
    return rng.standard_normal((2, 2, 3, 8)).astype(np.float32), keys[1:], values[1:], np.array([4, 10])


@pytest.mark.parametrize("dtype, to_kernel", [(np.float32, True), (np.float64, False)])
def test_decode_attention_goes_to_the_kernel_for_a_float32_cache(monkeypatch, dtype, to_kernel):
    kernel = record(monkeypatch, attention, "decode_attention")
    twin = record(monkeypatch, xp, "decode_attention_xp")
    ops.decode_attention(*decode_case(dtype))
    assert (len(kernel), len(twin)) == ((1, 0) if to_kernel else (0, 1))


def test_the_decode_attention_twin_equals_the_kernel():
    """The twin (what CuPy runs) against the kernel, rows of different lengths over strided cache views;
    positions past a row's length hold stale values (another row's, swapped away) and must not count."""
    q, keys, values, lengths = decode_case(np.float32)
    keys[0, :, 4:], values[0, :, 4:] = 50.0, 1e6
    expected = attention.decode_attention(q, keys, values, lengths)
    np.testing.assert_allclose(xp.decode_attention_xp(q, keys, values, lengths), expected, rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("rows, numba_products, split", [(1, True, False), (16, True, False),
                                                         (512, True, True), (512, False, False)])
def test_elementwise_kernels_split_rows_only_where_numba_runs_the_products_and_there_are_many(
        monkeypatch, rows, numba_products, split):
    """A decode step's rows (one per batch row, or a few heads) stay on one thread: a parallel launch costs
    more than they do."""
    # compiled before the spies stand in for the kernels (the split one calls the serial one as a global)
    elementwise.rms_norm(np.ones((2, 64), np.float32), np.ones(64, np.float32), 1e-6, split=True)
    calls = {name: record(monkeypatch, elementwise, name) for name in ("_rms_norm_split", "rms_norm_rows")}
    x = np.ones((rows, 64), np.float32)
    with host.threads(2, numba_products=numba_products):
        ops.rms_norm(x, np.ones(64, np.float32), 1e-6)
    assert (len(calls["_rms_norm_split"]), len(calls["rms_norm_rows"])) == ((1, 0) if split else (0, 1))
    assert (rows * 64 >= cpu_table.SPLIT_VALUES) == (rows == 512)


@pytest.mark.parametrize("dtype, to_kernel", [(np.float32, True), (np.float64, False)])
def test_new_position_goes_to_the_kernel_for_float32_arrays(monkeypatch, dtype, to_kernel):
    kernel = record(monkeypatch, attention, "new_position")
    twin = record(monkeypatch, xp, "new_position_xp")
    q, k, v, qn, kn, eps, cos, sin, scale, keys, values, positions = new_position_case()
    keys = keys.astype(dtype)
    ops.new_position(q.astype(dtype), k, v, qn, kn, eps, cos, sin, scale, keys, values, positions)
    assert (len(kernel), len(twin)) == ((1, 0) if to_kernel else (0, 1))


def test_the_new_position_twin_equals_the_kernel():
    """The twin (what CuPy runs) against the kernel: the q it returns and the cache it writes."""
    case = new_position_case()
    host = [a.copy() if isinstance(a, np.ndarray) else a for a in case]
    got = attention.new_position(*host)
    twin = [a.copy() if isinstance(a, np.ndarray) else a for a in case]
    want = xp.new_position_xp(*twin)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    for cache in (-3, -2):
        np.testing.assert_allclose(host[cache], twin[cache], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_the_array_module_widening_equals_the_hosts(dtype):
    w = f32(6, 32)
    data = {"f32": w, "f16": w.astype(np.float16), "bf16": (w.view(np.uint32) >> 16).astype(np.uint16)}[dtype]
    t = StoredTensor(data, dtype, w.shape)
    np.testing.assert_array_equal(xp.widen_xp(t), widen(t))
    np.testing.assert_array_equal(xp.take_rows_xp(t, [5, 0, 5]), take_rows(t, [5, 0, 5]))
    x = f32(9, 32, seed=1)
    np.testing.assert_array_equal(xp.stored_matmul_xp(x, t), x @ widen(t).T)


def test_the_array_module_path_refuses_block_types_it_cannot_widen():
    t = StoredTensor(np.zeros((2, 34), np.uint8), "q8_0", (2, 32))
    with pytest.raises(ValueError, match="widens the dense storage types .*; got q8_0"):
        xp.widen_xp(t)


def test_arrays_find_their_backend_and_others_are_refused(tmp_path):
    mapped = np.memmap(tmp_path / "m", np.float32, "w+", shape=(4,))
    assert backend.of(mapped) is backend.of(np.zeros(2)) is backend.CPU
    assert backend.kernels_for(mapped) is backend.kernels_for(np.zeros(2)) is cpu_table.KERNELS
    with pytest.raises(TypeError, match="no backend computes on list"):
        backend.kernels_for([1.0, 2.0])


def test_cpu_placement_widens_vectors_once_and_keeps_matrices_stored():
    bits = np.ones((4, 8), np.uint16)
    tensors = {"norm": StoredTensor(np.ones(8, np.float16), "f16", (8,)),
               "matrix": StoredTensor(bits, "bf16", (4, 8))}
    placed = backend.with_activations(backend.CPU, "exact").place(tensors, {"norm"})
    assert placed["matrix"] is tensors["matrix"]
    assert placed["norm"].dtype == np.float32 and (placed["norm"] == 1).all()


def test_threads_are_scoped_and_restored():
    before = numba.get_num_threads()
    with host.threads(1):
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == before
    with host.threads(None):
        assert numba.get_num_threads() == before


def test_a_models_thread_scope_takes_another_count(tiny_model):
    before = numba.get_num_threads()
    with tiny_model.thread_scope(1):
        assert numba.get_num_threads() == 1
    with tiny_model.thread_scope():
        assert numba.get_num_threads() == min(tiny_model.threads or before, numba.config.NUMBA_NUM_THREADS)
    assert numba.get_num_threads() == before


def test_cpu_masking_skips_the_masked_copy_when_nothing_is_masked(monkeypatch):
    """The CPU sees for free that a mask keeps everything (an unpadded batch); the twin, which CUDA runs,
    always copies, since asking would read the mask back to the host."""
    twin = record(monkeypatch, xp, "mask_inplace_xp")
    scores = f32(2, 3)
    kept = scores.copy()
    assert ops.mask_inplace(scores, np.ones((2, 3), bool)) is scores and twin == []
    np.testing.assert_array_equal(scores, kept)
    ops.mask_inplace(scores, np.array([[True, False, True]]))
    assert len(twin) == 1 and np.isneginf(scores[:, 1]).all()
    np.testing.assert_array_equal(scores[:, ::2], kept[:, ::2])


needs_two_threads = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")


@needs_two_threads
@pytest.mark.parametrize("dtype, numba_products, split", [("f32", True, True), ("bf16", True, True),
                                                          ("f32", False, False)])
def test_float32_weight_products_share_runs_of_rows_where_numba_runs_the_products(
        monkeypatch, dtype, numba_products, split):
    """The float32 path's many-row products (exact rows; a BF16 matrix widened first where the CPU has no bf16
    products) go to blas_split where BLAS is kept to the calling thread: its runs of W's rows are BLAS calls
    on numba's threads, equal to the float64 product within float32 rounding."""
    from nanoasr.kernels import blas_split

    calls = record(monkeypatch, blas_split, "_split_rows_matmul")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 512)).astype(np.float32)  # 64 * 512 * 700 > SPLIT_MACS
    dense = rng.standard_normal((700, 512)).astype(np.float32)
    data = dense if dtype == "f32" else (dense.view(np.uint32) >> 16).astype(np.uint16)
    w = StoredTensor(data, dtype, dense.shape)
    with host.threads(2, numba_products=numba_products):
        got = ops.linear(x, w)
    assert len(calls) == split
    want = x.astype(np.float64) @ widen(w).astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@needs_two_threads
def test_runs_of_rows_are_each_one_blas_call_on_one_thread(monkeypatch):
    """Each thread's run (whole multiples of ROW_RUN rows, the last the rest) is one BLAS call: the bits of
    numpy multiplying the same runs one after another with BLAS on one thread."""
    from threadpoolctl import threadpool_limits

    from nanoasr.kernels import blas_split

    monkeypatch.setattr(blas_split, "SPLIT_MACS", 0)
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((33, 96)).astype(np.float32), rng.standard_normal((200, 96)).astype(np.float32)
    with host.threads(2, numba_products=True):
        got = blas_split.matmul(x, w)
        assert blas_split.matmul(x, w[:blas_split.ROW_RUN]) is None  # one run: nothing to share
        assert blas_split.matmul(x.astype(np.float64), w) is None
    with threadpool_limits(limits=1, user_api="blas"):
        want = np.concatenate([x @ w[:128].T, x @ w[128:].T], axis=1)  # runs of 2 and 2 (of 4) ROW_RUNs
    assert blas_split.ROW_RUN == 64
    np.testing.assert_array_equal(got, want)
