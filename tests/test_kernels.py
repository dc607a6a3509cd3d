"""CPU kernels held to gguf.quants.dequantize (and exact numpy casts) followed by a float64 matmul."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize, quantize

from nanoasr.kernels import stored

DTYPES = ["f32", "f16", "bf16", "q8_0", "q4_k", "q6_k"]
GGUF_TYPE = {"q8_0": GT.Q8_0, "q4_k": GT.Q4_K, "q6_k": GT.Q6_K}
F16_FIELDS = {"q8_0": (0,), "q4_k": (0, 2), "q6_k": (208,)}  # byte offsets of the f16 scales in a block
SHAPES = [(48, 512), (256, 768), (5, 256)]  # non-square, odd row counts; row lengths fit every block type
BATCHES = [1, 3, 8, 11]  # 3: padded to four; 11: two passes over W
TOL = 1e-5  # ||y - y_ref|| / ||y_ref|| for each row of the output


def random_blocks(rng, dtype, rows, cols):
    """Random block bytes (every bit pattern of quants and packed scales) with finite f16 scale fields."""
    per, nbytes = stored.QK[dtype]
    raw = rng.integers(0, 256, (rows, cols // per, nbytes), dtype=np.uint8)
    for at in F16_FIELDS[dtype]:
        scale = rng.uniform(-0.05, 0.05, (rows, cols // per)).astype(np.float16)
        raw[:, :, at:at + 2] = scale.view(np.uint8).reshape(rows, cols // per, 2)
    return raw.reshape(rows, -1)


def stored_weight(rng, dtype, rows, cols):
    """(data, W): stored data and its float32 value from an independent oracle."""
    if dtype == "f32":
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        return w, w
    if dtype == "f16":
        data = rng.standard_normal((rows, cols)).astype(np.float16)
        return data, data.astype(np.float32)
    if dtype == "bf16":
        data = rng.integers(0, 1 << 16, (rows, cols), dtype=np.uint16) & np.uint16(0xBFFF)  # finite values
        return data, (data.astype(np.uint32) << 16).view(np.float32)
    data = random_blocks(rng, dtype, rows, cols)
    return data, dequantize(data, GGUF_TYPE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_widen_is_bit_identical(dtype, rows, cols):
    rng = np.random.default_rng(rows * cols)
    data, w = stored_weight(rng, dtype, rows, cols)
    out = np.full((rows, cols), np.nan, np.float32)
    stored.widen(data, dtype, rows, cols, out)
    np.testing.assert_array_equal(out.view(np.uint32), w.view(np.uint32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", SHAPES)
@pytest.mark.parametrize("batch", BATCHES)
def test_matvec_matches_dequantized_matmul(dtype, rows, cols, batch):
    rng = np.random.default_rng(rows * cols + batch)
    data, w = stored_weight(rng, dtype, rows, cols)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    out = np.full((batch, rows), np.nan, np.float32)
    stored.matvec(x, data, dtype, rows, cols, out)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    rel = np.linalg.norm(out - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() < TOL, f"{dtype} {rows}x{cols} B={batch}: relative error {rel.max():.2e}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_of_x_gets_the_same_bits_in_any_batch(dtype):
    """Batched decoding must pick the tokens decoding alone picks: a row's products may not depend on its
    neighbours or on the batch size."""
    rng = np.random.default_rng(7)
    rows, cols = 256, 768
    data, _ = stored_weight(rng, dtype, rows, cols)
    x = rng.standard_normal((8, cols)).astype(np.float32)
    alone = stored.matvec(x[:1], data, dtype, rows, cols, np.empty((1, rows), np.float32))
    for batch in (2, 4, 5, 8):
        together = stored.matvec(x[:batch], data, dtype, rows, cols, np.empty((batch, rows), np.float32))
        np.testing.assert_array_equal(together[0].view(np.uint32), alone[0].view(np.uint32))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("cols", [20, 100])
def test_widen_dense_rows_of_any_length(dtype, cols):
    """Dense rows need not be whole blocks of 32: the columns past the last block are widened too."""
    rng = np.random.default_rng(cols)
    data, w = stored_weight(rng, dtype, 37, cols)
    out = np.full((37, cols), np.nan, np.float32)
    stored.widen(data, dtype, 37, cols, out)
    np.testing.assert_array_equal(out.view(np.uint32), w.view(np.uint32))


def test_q8_0_from_quantized_floats():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((64, 1024)).astype(np.float32)
    data = quantize(w, GT.Q8_0)
    x = rng.standard_normal((2, 1024)).astype(np.float32)
    out = np.empty((2, 64), np.float32)
    stored.matvec(x, data, "q8_0", 64, 1024, out)
    ref = x.astype(np.float64) @ dequantize(data, GT.Q8_0).T.astype(np.float64)
    assert np.abs(out - ref).max() < TOL * np.abs(ref).max()


def test_subnormal_and_signed_zero_scales_widen_exactly():
    rows, cols = 4, 64
    data = np.random.default_rng(3).integers(0, 256, (rows, 2 * 34), dtype=np.uint8).reshape(rows, 2, 34)
    bits = np.array([[0x0001, 0x8000], [0x03FF, 0x0000], [0x7BFF, 0xFBFF], [0x0400, 0x83FF]], np.uint16)
    data[:, :, 0:2] = bits.view(np.uint8).reshape(rows, 2, 2)
    data = data.reshape(rows, -1)
    out = np.empty((rows, cols), np.float32)
    stored.widen(data, "q8_0", rows, cols, out)
    np.testing.assert_array_equal(out.view(np.uint32), dequantize(data, GT.Q8_0).view(np.uint32))


def test_every_f16_scale_is_read_exactly():
    """All 65536 f16 bit patterns as Q8_0 scales: widen converts them as numpy does (NaNs stay NaN), and the
    product (its own integer conversion) gives d * 1 * 1 for every finite d."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    data = np.zeros((bits.size, 34), np.uint8)
    data[:, 0:2] = bits.view(np.uint8).reshape(-1, 2)
    data[:, 2] = 1
    ref = bits.view(np.float16).astype(np.float32)
    out = np.empty((bits.size, 32), np.float32)
    stored.widen(data, "q8_0", bits.size, 32, out)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(out[~nan, 0].view(np.uint32), ref[~nan].view(np.uint32))
    assert np.isnan(out[nan, 0]).all()
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 1
    y = np.empty((1, bits.size), np.float32)
    stored.matvec(x, data, "q8_0", bits.size, 32, y)
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(y[0, finite], ref[finite])


def test_matvec_writes_into_the_given_buffer():
    rng = np.random.default_rng(1)
    data, w = stored_weight(rng, "q8_0", 32, 64)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    out = np.zeros((5, 32), np.float32)
    assert stored.matvec(x, data, "q8_0", 32, 64, out) is out
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("call,message", [
    (lambda: stored.matvec(np.zeros((1, 64), np.float32), np.zeros((4, 68), np.uint8), "q5_k", 4, 64,
                           np.zeros((1, 4), np.float32)), "storage type"),
    (lambda: stored.matvec(np.zeros((1, 64), np.float32), np.zeros((4, 64), np.uint8), "q8_0", 4, 64,
                           np.zeros((1, 4), np.float32)), r"uint8 \[4, 68\]"),
    (lambda: stored.matvec(np.zeros((1, 48), np.float32), np.zeros((4, 51), np.uint8), "q8_0", 4, 48,
                           np.zeros((1, 4), np.float32)), "multiple of 32"),
    (lambda: stored.matvec(np.zeros((1, 64), np.float64), np.zeros((4, 64), np.float32), "f32", 4, 64,
                           np.zeros((1, 4), np.float32)), "x must be"),
    (lambda: stored.matvec(np.zeros((2, 64), np.float32), np.zeros((4, 64), np.float32), "f32", 4, 64,
                           np.zeros((1, 4), np.float32)), "out must have 2 rows"),
    (lambda: stored.widen(np.zeros((4, 128), np.float32)[:, ::2], "f32", 4, 64,
                          np.zeros((4, 64), np.float32)), "contiguous"),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_importing_nanoasr_does_not_import_numba():
    code = "import sys, nanoasr, nanoasr.kernels; print('numba' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("dtype", ["q8_0", "q4_k", "q6_k"])
@pytest.mark.parametrize("shift", [0, 1, 4])
def test_matvec_any_alignment_of_x(dtype, shift):
    """x at any alignment (the several-rows kernels pack it into an aligned buffer)."""
    rng = np.random.default_rng(shift)
    rows, cols, batch = 40, 1536, 8  # 1536 columns: three column passes of the several-rows kernels
    data, w = stored_weight(rng, dtype, rows, cols)
    buf = np.zeros(batch * cols + 32, np.float32)
    start = (-buf.ctypes.data % 64) // 4 + shift
    x = buf[start:start + batch * cols].reshape(batch, cols)
    x[:] = rng.standard_normal((batch, cols))
    out = np.full((batch, rows), np.nan, np.float32)
    stored.matvec(x, data, dtype, rows, cols, out)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    rel = np.linalg.norm(out - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() < TOL, f"{dtype} shift {shift}: relative error {rel.max():.2e}"


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("cols", [20, 100])
def test_dense_rows_of_any_length(dtype, batch, cols):
    """Dense rows need not be whole blocks of 32: the columns past the last block are added separately."""
    rng = np.random.default_rng(cols + batch)
    data, w = stored_weight(rng, dtype, 37, cols)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    out = np.full((batch, 37), np.nan, np.float32)
    stored.matvec(x, data, dtype, 37, cols, out)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    rel = np.linalg.norm(out - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() < TOL, f"{dtype} cols {cols} B={batch}: relative error {rel.max():.2e}"


CACHED_RUN = textwrap.dedent("""
    import json
    import numpy as np
    from gguf import GGMLQuantizationType as GT
    from gguf.quants import dequantize
    from nanoasr.kernels import stored
    from nanoasr.kernels.stored import float_rows, widening

    rng = np.random.default_rng(0)
    calls = {}
    for dtype, gt, scale_at in (("q8_0", GT.Q8_0, 0), ("q6_k", GT.Q6_K, 208)):
        per, nbytes = stored.QK[dtype]
        raw = rng.integers(0, 256, (16, 2, nbytes), dtype=np.uint8)
        raw[:, :, scale_at:scale_at + 2] = np.array([0.01], np.float16).view(np.uint8)
        data = raw.reshape(16, -1)
        w = stored.widen(data, dtype, 16, 2 * per, np.empty((16, 2 * per), np.float32))
        assert (w.view(np.uint32) == dequantize(data, gt).view(np.uint32)).all(), dtype
        x = rng.standard_normal((1, 2 * per)).astype(np.float32)
        y = stored.matvec(x, data, dtype, 16, 2 * per, np.empty((1, 16), np.float32))
        assert np.allclose(y, x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-4), dtype
        for driver in (float_rows.MATVEC[dtype], widening.WIDEN[dtype]):
            calls[driver.__name__] = [sum(driver.stats.cache_hits.values()),
                                      sum(driver.stats.cache_misses.values())]
    print(json.dumps(calls))
""")


def test_drivers_load_from_the_disk_cache(tmp_path):
    """A second process loads the drivers from numba's disk cache instead of compiling them again, and drivers
    that take the same argument types (uint8 blocks) each get their own code back."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", CACHED_RUN], env=env, capture_output=True,
                                      text=True, check=True).stdout) for _ in range(2)]
    assert all(misses == 1 and hits == 0 for hits, misses in runs[0].values()), runs[0]
    assert all(misses == 0 and hits == 1 for hits, misses in runs[1].values()), runs[1]
