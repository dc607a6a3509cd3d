"""The one-pass elementwise kernels against their numpy twins and float64 formulas."""
import numpy as np
import pytest

from nanoasr.backend import host
from nanoasr.kernels import elementwise as kernels
from nanoasr.backend.xp import add_bias_xp, apply_rope_xp, fsmn_xp, layer_norm_xp, rms_norm_xp, swiglu_xp
from nanoasr.ops import rope_inv_freq, rope_tables


@pytest.mark.parametrize("shape", [(1, 7, 512), (2, 33, 560), (3, 1024)])
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_layer_norm_matches_the_formula(shape, eps):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 3 + 1.5).astype(np.float32)
    weight, bias = rng.standard_normal((2, shape[-1])).astype(np.float32)
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    ref = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(-1, keepdims=True) + eps) * weight + bias
    got = kernels.layer_norm(x, weight, bias, eps)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(got, layer_norm_xp(x, weight, bias, np.float32(eps)), rtol=1e-5, atol=2e-5)


def test_layer_norm_takes_strided_input():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 64, 2)).astype(np.float32)[..., 0]
    weight, bias = np.ones(64, np.float32), np.zeros(64, np.float32)
    np.testing.assert_allclose(kernels.layer_norm(x, weight, bias, 1e-5),
                               layer_norm_xp(x, weight, bias, np.float32(1e-5)), rtol=1e-5, atol=2e-5)


FSMN_SHAPES = [(50, 512, 11), (4, 16, 11), (9, 8, 1), (1, 32, 5)]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("frames, depth, taps", FSMN_SHAPES)
def test_fsmn_equals_its_numpy_twin(frames, depth, taps, split):
    """Same multiplies and adds in the same order: equal values, not merely close (frames < taps too), also
    with the frames shared among numba's threads (one frame for two of them included)."""
    rng = np.random.default_rng(frames * taps)
    v = rng.standard_normal((frames, depth)).astype(np.float32)
    kernel = rng.standard_normal((depth, 1, taps)).astype(np.float32)
    with host.threads(2):
        np.testing.assert_array_equal(kernels.fsmn(v, kernel, split=split), fsmn_xp(v, kernel))


@pytest.mark.parametrize("relu", [False, True])
def test_add_bias_equals_its_numpy_twin(relu):
    """One add (and one max) per element, as numpy does: equal values, negative zero included."""
    rng = np.random.default_rng(int(relu))
    y = rng.standard_normal((37, 130)).astype(np.float32)
    y[0, :5] = [-0.0, 0.0, -1e-38, np.inf, np.nan]
    bias = rng.standard_normal(130).astype(np.float32)
    bias[:5] = [-0.0, -0.0, 0, 0, 0]
    want = add_bias_xp(y.copy(), bias, relu)
    got = kernels.add_bias(y, bias, relu)
    assert got is y
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("shape", [(1, 1, 1024), (8, 16, 128), (3, 7, 130)])
def test_rms_norm_matches_the_formula(shape):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 4 + 0.5).astype(np.float32)
    weight = rng.standard_normal(shape[-1]).astype(np.float32)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * weight
    got = kernels.rms_norm(x, weight, 1e-6)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, rms_norm_xp(x, weight, np.float32(1e-6)), rtol=1e-5, atol=1e-6)
    strided = np.repeat(x[..., None], 2, axis=-1)[..., 0]
    np.testing.assert_array_equal(kernels.rms_norm(strided, weight, 1e-6), got)


def test_swiglu_matches_the_formula_over_the_whole_range():
    rng = np.random.default_rng(5)
    edges = [0.0, -0.0, 30.0, -30.0, 88.0, -87.0, -100.0, 1e-30]
    gate = np.concatenate([rng.standard_normal(4000) * 6, edges])
    gate = gate.astype(np.float32).reshape(8, -1)
    up = rng.standard_normal(gate.shape).astype(np.float32)
    g64 = gate.astype(np.float64)
    ref = g64 / (1 + np.exp(-g64)) * up
    with np.errstate(over="ignore"):  # e^100 is inf in float32, and v / inf the right limit
        twin = swiglu_xp(gate.copy(), up)
    got = kernels.swiglu(gate, up)
    assert got is gate
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-38)
    np.testing.assert_allclose(got, twin, rtol=2e-6, atol=1e-38)


@pytest.mark.parametrize("batch, n, heads", [(1, 1, 16), (8, 1, 8), (1, 37, 16)])
def test_rope_equals_its_numpy_twin(batch, n, heads):
    """Two products and a sum per element, each rounded, as numpy does: equal values."""
    rng = np.random.default_rng(n * heads)
    x = rng.standard_normal((batch, n, heads, 128)).astype(np.float32)
    positions = rng.integers(0, 4000, batch * n)
    cos, sin = (t.reshape(batch, n, 128) for t in rope_tables(positions, rope_inv_freq(128, 1e6)))
    np.testing.assert_array_equal(kernels.apply_rope(x, cos, sin), apply_rope_xp(x, cos, sin))
    strided = x[..., ::-1]
    np.testing.assert_array_equal(kernels.apply_rope(strided, cos, sin), apply_rope_xp(strided, cos, sin))


def hostile_rows(d: int) -> np.ndarray:
    """Rows a broken input can make: all -inf, NaN, +inf, zeros, and finite rows of extreme amplitude."""
    rng = np.random.default_rng(d)
    rows = np.empty((8, d), np.float32)
    rows[0] = -np.inf
    rows[1] = np.nan
    rows[2] = rng.standard_normal(d)
    rows[2, d // 2] = np.nan
    rows[3] = rng.standard_normal(d)
    rows[3, 1] = np.inf
    rows[4] = rng.standard_normal(d) * 1e30  # the squares overflow
    rows[5] = 3e38  # the sum overflows too
    rows[6] = 0.0  # 0 / 0 when eps is 0
    rows[7] = rng.standard_normal(d)
    return rows


@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_norms_of_hostile_rows_are_defined_and_match_their_twins(eps):
    """Nothing raises; NaN where the float32 formula gives NaN, and the same values as the twins elsewhere
    (a row whose squares overflow has an infinite norm: LayerNorm gives the bias, RMSNorm zeros)."""
    x = hostile_rows(64)
    rng = np.random.default_rng(7)
    weight, bias = rng.standard_normal((2, 64)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        twins = (layer_norm_xp(x, weight, bias, np.float32(eps)), rms_norm_xp(x, weight, np.float32(eps)))
    got = (kernels.layer_norm(x, weight, bias, eps), kernels.rms_norm(x, weight, eps))
    for out, twin in zip(got, twins):
        np.testing.assert_array_equal(np.isnan(out), np.isnan(twin))
        np.testing.assert_allclose(out, twin, rtol=1e-5, atol=2e-5)
        assert np.isnan(out[:3]).all() and np.isfinite(out[7]).all()
    ln, rms = got
    zero_row = np.full(64, np.nan) if eps == 0 else None
    np.testing.assert_array_equal(ln[3:7], [np.full(64, np.nan), bias, np.full(64, np.nan),
                                            bias if zero_row is None else zero_row])
    np.testing.assert_array_equal(rms[3], np.where(np.isinf(x[3]), np.nan, 0))  # inf / inf, finite / inf
    np.testing.assert_array_equal(rms[4:7], [np.zeros(64), np.zeros(64),
                                             np.zeros(64) if zero_row is None else zero_row])
