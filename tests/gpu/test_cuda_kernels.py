"""CUDA kernels over stored weights against nanoasr.quant.reference (and gguf.quants) and a float64 matmul; on
the device when CuPy finds a GPU, under numba's CUDA simulator elsewhere (tests/gpu/conftest.py)."""
import types

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize as gguf_dequantize
from stored_weights import stored

from nanoasr import backend
from nanoasr.kernels import cuda as gk

GGUF_TYPE = {"q8_0": GT.Q8_0, "q4_k": GT.Q4_K, "q6_k": GT.Q6_K}
# Per type: the shortest legal row, and a row of a few blocks; 5 and 3 output rows share a grid of 3 blocks
# unevenly (the simulator runs every thread in Python, so the grid stays small).
SHAPES = {"f32": [(5, 1), (3, 37)], "f16": [(5, 1), (3, 37)], "bf16": [(5, 1), (3, 37)],
          "q8_0": [(5, 32), (3, 96)], "q4_k": [(5, 256), (3, 512)], "q6_k": [(5, 256), (3, 512)]}
CASES = [(dtype, rows, cols) for dtype, shapes in SHAPES.items() for rows, cols in shapes]
TOL = 1e-5  # ||y - y_ref|| / ||y_ref|| for each row of the output, as for the CPU kernels
DEFAULT_MAX_BLOCKS = gk.MAX_BLOCKS


@pytest.fixture(autouse=True)
def small_grid(monkeypatch):
    monkeypatch.setattr(gk, "MAX_BLOCKS", 3)


def widened(device, data, dtype, rows, cols):
    out = device.put(np.full((rows, cols), np.nan, np.float32))
    assert gk.widen(device.put(data), dtype, (rows, cols), out) is out
    return device.get(out)


def product(device, x, data, dtype, rows):
    out = device.put(np.full((x.shape[0], rows), np.nan, np.float32))
    assert gk.matvec(device.put(x), device.put(data), dtype, (rows, x.shape[1]), out) is out
    return device.get(out)


def assert_close_rows(y, ref, what):
    rel = np.linalg.norm(y - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() < TOL, f"{what}: relative error {rel.max():.2e}"


@pytest.mark.parametrize("dtype,rows,cols", CASES)
def test_widen_is_bit_identical(device, dtype, rows, cols):
    rng = np.random.default_rng(rows * cols)
    data, w = stored(rng, dtype, rows, cols)
    out = widened(device, data, dtype, rows, cols)
    np.testing.assert_array_equal(out.view(np.uint32), w.view(np.uint32))
    if dtype in GGUF_TYPE:
        oracle = gguf_dequantize(data, GGUF_TYPE[dtype])
        np.testing.assert_array_equal(out.view(np.uint32), oracle.view(np.uint32))


@pytest.mark.parametrize("dtype,rows,cols", CASES)
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_matvec_matches_dequantized_matmul(device, dtype, rows, cols, batch):
    rng = np.random.default_rng(rows * cols + batch)
    data, w = stored(rng, dtype, rows, cols)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    y = product(device, x, data, dtype, rows)
    assert_close_rows(y, x.astype(np.float64) @ w.T.astype(np.float64), f"{dtype} {rows}x{cols} B={batch}")


def test_more_than_eight_rows_of_x_take_two_launches(device):
    rng = np.random.default_rng(11)
    data, w = stored(rng, "q4_k", 3, 256)
    x = rng.standard_normal((11, 256)).astype(np.float32)
    y = product(device, x, data, "q4_k", 3)
    assert_close_rows(y, x.astype(np.float64) @ w.T.astype(np.float64), "B=11")


@pytest.mark.parametrize("dtype", list(SHAPES))
def test_a_row_of_x_gets_the_same_bits_in_any_batch(device, dtype):
    """Batched decoding must pick the tokens decoding alone picks: a row's sums may not depend on the other
    rows."""
    rng = np.random.default_rng(7)
    rows, cols = SHAPES[dtype][1]
    data, _ = stored(rng, dtype, rows, cols)
    x = rng.standard_normal((8, cols)).astype(np.float32)
    alone = product(device, x[:1], data, dtype, rows)
    for batch in (3, 8):
        np.testing.assert_array_equal(product(device, x[:batch], data, dtype, rows)[0].view(np.uint32),
                                      alone[0].view(np.uint32))


@pytest.mark.parametrize("dtype,reference", [
    ("f16", lambda bits: bits.view(np.float16).astype(np.float32)),
    ("bf16", lambda bits: (bits.astype(np.uint32) << 16).view(np.float32))])
def test_every_16_bit_pattern_widens_exactly(device, dtype, reference):
    """Zeros of both signs, subnormals, the largest finite values, infinities: exact; NaNs stay NaN."""
    bits = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256)
    data = bits.view(np.float16) if dtype == "f16" else bits
    out, ref = widened(device, data, dtype, 256, 256), reference(bits)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(out[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    assert np.isnan(out[nan]).all()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf * 0 in the simulator
@pytest.mark.parametrize("dtype", ["q8_0", "q4_k", "q6_k"])
def test_special_block_scales_widen_exactly(device, dtype):
    """f16 scales that are subnormal, signed zeros, the largest finite, infinite or NaN: as the oracle has
    them (an infinite or NaN scale spoils its block there too)."""
    scales = np.array([0x0001, 0x8000, 0x03FF, 0x0000, 0x7BFF, 0xFBFF, 0x7C00, 0x7E01], np.uint16)
    per, nbytes = gk.BLOCK_TYPES[dtype]
    rows = 4
    data, _ = stored(np.random.default_rng(3), dtype, rows, 2 * per)
    blocks = data.reshape(rows * 2, nbytes)
    for at in {"q8_0": (0,), "q4_k": (0, 2), "q6_k": (208,)}[dtype]:
        blocks[:, at:at + 2] = np.roll(scales, at).view(np.uint8).reshape(-1, 2)
    out = widened(device, data, dtype, rows, 2 * per)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = gguf_dequantize(data, GGUF_TYPE[dtype])
    nan = np.isnan(ref)
    np.testing.assert_array_equal(out[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    assert np.isnan(out[nan]).all()


def test_the_default_grid(device, monkeypatch):
    """The launch the backend makes, with the module's own grid limit."""
    monkeypatch.setattr(gk, "MAX_BLOCKS", DEFAULT_MAX_BLOCKS)
    rng = np.random.default_rng(5)
    data, w = stored(rng, "q6_k", 2, 256)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    np.testing.assert_array_equal(widened(device, data, "q6_k", 2, 256).view(np.uint32), w.view(np.uint32))
    assert_close_rows(product(device, x, data, "q6_k", 2), x.astype(np.float64) @ w.T.astype(np.float64),
                      "default grid")


def test_the_self_checks_kernel_round_trip(device):
    """The launch backend.self_check makes before CUDA is chosen gives the values it expects."""
    gpu = types.SimpleNamespace(asarray=device.put, float32=np.float32,
                                empty=lambda shape, dtype: device.put(np.empty(shape, dtype)))
    np.testing.assert_array_equal(device.get(backend.kernel_round_trip(gpu)), backend.BF16_CHECK[1])


def _args(device, x_cols=64, w=None, dtype="q8_0", shape=(4, 64), out_rows=1, out=None):
    w = device.put(np.zeros((4, 68), np.uint8)) if w is None else w
    out = device.put(np.zeros((out_rows, shape[0]), np.float32)) if out is None else out
    return device.put(np.zeros((1, x_cols), np.float32)), w, dtype, shape, out


@pytest.mark.parametrize("change,error,message", [
    (dict(dtype="q5_k"), ValueError, "storage type"),
    (dict(shape=(4, 48)), ValueError, "multiple of 32"),
    (dict(w=np.zeros((4, 68), np.uint8)), TypeError, "device array"),
    (dict(w="blocks"), TypeError, "device array"),
    (dict(dtype="f32"), ValueError, r"float32 \[4, 64\]"),
    (dict(x_cols=32), ValueError, r"x must be C-contiguous float32 \[n, 64\]"),
    (dict(out_rows=2), ValueError, "out must have 1 rows"),
    (dict(shape=(0, 64)), ValueError, "at least one row"),
])
def test_bad_arguments_are_named(device, change, error, message):
    with pytest.raises(error, match=message):
        gk.matvec(*_args(device, **change))


def test_strided_data_is_refused(device):
    w = device.put(np.zeros((4, 136), np.uint8))[:, :68]
    with pytest.raises(ValueError, match="C-contiguous uint8"):
        gk.widen(w, "q8_0", (4, 64), device.put(np.zeros((4, 64), np.float32)))
