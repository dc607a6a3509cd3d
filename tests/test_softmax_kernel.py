"""The softmax kernel and its exp against float64 formulas and the numpy twin."""
import numpy as np
import pytest
from numba import njit

from nanoasr.kernels import softmax as kernels
from nanoasr.backend.xp import greedy_choice_xp, softmax_inplace_xp


def _exp_each(fastmath):
    """exp_nonpositive over an array, compiled with the flags of a kernel that inlines it (the softmax and
    decode-attention kernels let LLVM contract multiply-adds; SwiGLU's does not)."""
    @njit(fastmath=fastmath)
    def each(x, out):
        for i in range(x.shape[0]):
            out[i] = kernels.exp_nonpositive(x[i])
    return each


def _exp_over_the_normals(fastmath):
    x = -np.linspace(0, 87.3, 1_000_003).astype(np.float32)
    got = np.empty_like(x)
    _exp_each(fastmath)(x, got)
    return x, got


def test_exp_is_within_1_02_ulp_down_to_the_smallest_normal():
    """Cephes' polynomial evaluated with FMAs: 1.015 ulp at worst on this grid (3 points above 1 ulp)."""
    x, got = _exp_over_the_normals(False)
    ref = np.exp(x.astype(np.float64))
    assert (np.abs(got - ref) / np.spacing(ref.astype(np.float32))).max() <= 1.02


def test_exp_gives_the_same_bits_whatever_its_caller_lets_llvm_contract():
    plain, contracted = (_exp_over_the_normals(flags)[1] for flags in (False, {"reassoc", "contract"}))
    np.testing.assert_array_equal(plain, contracted)


@pytest.mark.parametrize("fastmath", [False, {"reassoc", "contract"}])
def test_exp_is_zero_below_the_normals_and_for_minus_infinity(fastmath):
    x = np.array([-np.inf, -1e30, -104.0, -87.5, -0.0, 0.0], np.float32)
    got = np.empty_like(x)
    _exp_each(fastmath)(x, got)
    np.testing.assert_array_equal(got, [0, 0, 0, 0, 1, 1])


@pytest.mark.parametrize("shape", [(4, 50, 50), (1, 3), (7, 1), (2, 3, 5, 130)])
def test_softmax_matches_the_formula_with_masked_entries(shape):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 8).astype(np.float32)
    x[..., 1:][rng.random(x[..., 1:].shape) < 0.3] = -np.inf  # every row keeps its first entry
    x64 = x.astype(np.float64)
    ref = np.exp(x64 - x64.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    twin = softmax_inplace_xp(x.copy())
    got = kernels.softmax_inplace(x)
    assert got is x
    np.testing.assert_allclose(got, ref, rtol=3e-6, atol=1e-30)
    np.testing.assert_allclose(got, twin, rtol=3e-6, atol=1e-30)
    assert (got[np.isneginf(x64)] == 0).all()


def test_softmax_names_what_it_cannot_take():
    with pytest.raises(ValueError, match="C-contiguous float32"):
        kernels.softmax_inplace(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        kernels.softmax_inplace(np.zeros((4, 3), np.float32).T)


def hostile_rows(m: int) -> np.ndarray:
    """Rows a broken input can make: all masked, NaN, +inf, and finite rows of extreme amplitude."""
    rng = np.random.default_rng(m)
    rows = np.empty((8, m), np.float32)
    rows[0] = -np.inf  # every key masked
    rows[1] = np.nan
    rows[2] = rng.standard_normal(m)
    rows[2, m // 2] = np.nan  # one NaN in an ordinary row
    rows[3] = rng.standard_normal(m)
    rows[3, 1] = np.inf  # a score that overflowed
    rows[4] = rng.standard_normal(m) * 1e30
    rows[5] = rng.choice([-3e38, 3e38], m)
    rows[6] = 3e38
    rows[7] = rng.standard_normal(m)
    rows[7, ::2] = -np.inf
    return rows


def test_softmax_of_hostile_rows_is_defined_and_matches_the_twin():
    """A row without a finite maximum comes out all NaN (as in numpy and torch); finite rows, however large,
    come out as probabilities. Nothing raises."""
    x = hostile_rows(37)
    with np.errstate(invalid="ignore", over="ignore"):  # the twin's inf - inf and -3e38 - 3e38
        twin = softmax_inplace_xp(x.copy())
    got = kernels.softmax_inplace(x.copy())
    assert np.isnan(got[:4]).all()
    assert np.isfinite(got[4:]).all()
    np.testing.assert_allclose(got[4:].sum(-1), 1, rtol=1e-6)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(twin))
    np.testing.assert_allclose(got[4:], twin[4:], rtol=3e-6, atol=1e-30)
    np.testing.assert_array_equal(got[4], x[4] == x[4].max())  # 1e30 apart: all weight on the maximum


def test_scale_matches_the_formula():
    """softmax(scale * x) against float64, for the kernel and its twin."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 2, 5, 33)) * 8).astype(np.float32)
    x64 = x.astype(np.float64) * 0.125
    ref = np.exp(x64 - x64.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    twin = softmax_inplace_xp(x.copy(), 0.125)
    got = kernels.softmax_inplace(x, 0.125)
    assert got is x
    np.testing.assert_allclose(got, ref, rtol=3e-6, atol=1e-30)
    np.testing.assert_allclose(got, twin, rtol=3e-6, atol=1e-30)


def test_greedy_choice_matches_float64_and_the_twin_over_a_vocabulary_row():
    """Each row's argmax (the first of ties) and the log-probability of that choice, against float64 and the
    numpy twin; suppressed columns (-inf) count for nothing."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((3, 151936)) * 4).astype(np.float32)
    x[1, [17, 90000]] = x[1].max() + 1  # a tie: the first is chosen
    x[2, ::3] = -np.inf
    x64 = x.astype(np.float64)
    ref = x64.max(-1) - (np.log(np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1)) + x64.max(-1))
    twin_ids, twin = greedy_choice_xp(x)
    ids, got = kernels.greedy_choice(x)
    np.testing.assert_array_equal(ids, x.argmax(-1))
    np.testing.assert_array_equal(ids, twin_ids)
    assert ids[1] == 17
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=2e-6)
    np.testing.assert_allclose(got, twin, rtol=2e-6)


def test_greedy_choice_of_hostile_rows_matches_the_twin():
    """A row without a finite maximum has a NaN log-probability, as in the twin; finite rows, however large,
    a finite one (0 where one value is 1e30 above the rest)."""
    x = hostile_rows(37)
    with np.errstate(invalid="ignore", over="ignore"):
        twin_ids, twin = greedy_choice_xp(x)
    ids, got = kernels.greedy_choice(x)
    np.testing.assert_array_equal(ids, twin_ids)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(twin))
    assert np.isnan(got[:4]).all() and np.isfinite(got[4:]).all()
    np.testing.assert_allclose(got[4:], twin[4:], rtol=3e-6, atol=1e-6)
    assert got[4] == 0


def test_the_row_maximum_taken_in_integers_is_numpys():
    """The softmax's row maximum (float bits ordered as integers): all-negative rows, infinities, subnormals
    and zeros of both signs, and NaN of either sign, which makes the maximum NaN as in numpy."""
    rng = np.random.default_rng(8)
    negative_nan = np.array([0xFFC00001], np.uint32).view(np.float32)[0]
    rows = [-rng.random(37).astype(np.float32) - 1, np.array([-np.inf, -3e38, -1e-45], np.float32),
            np.array([-0.0, -1e-45, 0.0], np.float32), np.array([1e-45, 3e38, np.inf, -np.inf], np.float32),
            np.array([1.0, np.nan, 2.0], np.float32), np.array([5.0, negative_nan, -7.0], np.float32),
            rng.standard_normal(1000).astype(np.float32)]
    for row in rows:
        got, want = kernels._row_max(row), row.max()
        assert got == want or (np.isnan(got) and np.isnan(want)), (row, got, want)
    x = np.array([[5.0, negative_nan, -7.0]], np.float32)
    with np.errstate(invalid="ignore"):
        twin = softmax_inplace_xp(x.copy())
    assert np.isnan(kernels.softmax_inplace(x)).all() and np.isnan(twin).all()
