"""The decode-attention kernel against a float64 softmax(q k^T) v written out per row and head, and against
its numpy twin, the decoder's prefill attention, whose blocks keep its scores within a fixed size; the
kernel that readies a decode step's new position against the formula and the kernels it stands for; the
encoder's self-attention on head-split views; attention's products shared among numba's threads."""
import tracemalloc

import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from nanoasr import ops
from nanoasr.backend import host
from nanoasr.kernels import blas_split, elementwise
from nanoasr.kernels.attention import decode_attention, new_position
from nanoasr.model import decoder


def reference(q, keys, values, lengths):  # float64, one (row, kv head, query head) at a time
    out = np.zeros(q.shape)
    for b, m in enumerate(lengths):
        for h in range(q.shape[1]):
            k, v = keys[b, h, :m].astype(np.float64), values[b, h, :m].astype(np.float64)
            for j in range(q.shape[2]):
                s = k @ q[b, h, j].astype(np.float64)
                p = np.exp(s - s.max())
                out[b, h, j] = (p / p.sum()) @ v
    return out


@pytest.mark.parametrize("batch, kv_heads, group, head_dim", [(1, 8, 2, 128), (3, 2, 4, 8), (8, 1, 1, 16)])
def test_decode_attention_matches_the_softmax_formula(batch, kv_heads, group, head_dim):
    rng = np.random.default_rng(batch * 100 + group)
    capacity = 40
    cache_k = rng.standard_normal((batch + 1, kv_heads, capacity, head_dim)).astype(np.float32)
    cache_v = rng.standard_normal(cache_k.shape).astype(np.float32)
    q = rng.standard_normal((batch, kv_heads, group, head_dim)).astype(np.float32)
    lengths = rng.integers(1, capacity + 1, batch)
    keys, values = cache_k[1:], cache_v[1:]  # strided views of a bigger cache, as the decoder passes them
    got = decode_attention(q, keys, values, lengths)
    np.testing.assert_allclose(got, reference(q, keys, values, lengths), rtol=1e-5, atol=1e-5)


def test_positions_past_a_rows_length_are_never_read():
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((2, 1, 10, 8)).astype(np.float32)
    values = rng.standard_normal(keys.shape).astype(np.float32)
    q = rng.standard_normal((2, 1, 1, 8)).astype(np.float32)
    before = decode_attention(q, keys, values, [4, 10])
    keys[0, :, 4:], values[0, :, 4:] = np.nan, np.nan
    np.testing.assert_array_equal(decode_attention(q, keys, values, [4, 10]), before)


def twin(q, keys, values, lengths):  # the decoder's prefill path for one new position per row
    b, kvh, group, hd = q.shape
    positions = np.asarray(lengths)[:, None] - 1  # [B, 1]
    m = int(positions.max()) + 1
    unscaled = (q / np.float32(hd ** -0.5)).reshape(b, 1, kvh * group, hd)
    out = decoder._prefill_attention(unscaled, keys[:, :, :m], values[:, :, :m], positions, group)
    return out.reshape(q.shape)


def test_hostile_rows_are_defined_and_match_the_twin():
    """A NaN query, or one whose scores overflow to inf, gives a NaN row (softmax of a row without a finite
    maximum); a huge finite query puts all weight on its best key. Nothing raises."""
    rng = np.random.default_rng(9)
    keys = np.abs(rng.standard_normal((5, 2, 12, 16))).astype(np.float32) + 0.5  # positive: q . k overflows
    values = rng.standard_normal(keys.shape).astype(np.float32)
    q = rng.standard_normal((5, 2, 2, 16)).astype(np.float32)
    q[0, 0, 0, 3] = np.nan
    q[1, 1, 1] = 3e38
    q[2, 0, 1] = rng.standard_normal(16) * 1e30
    q[3, 1] = -np.inf
    lengths = [12, 7, 12, 5, 1]
    with np.errstate(invalid="ignore", over="ignore"):
        want = twin(q, keys, values, lengths)
    got = decode_attention(q, keys, values, lengths)
    nan_heads = np.isnan(got).all(-1)
    assert nan_heads[0, 0, 0] and nan_heads[1, 1, 1] and nan_heads[3, 1].all()
    assert not np.isnan(got[2]).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    best = np.argmax(keys[2, 0, :12] @ q[2, 0, 1].astype(np.float64))
    np.testing.assert_array_equal(got[2, 0, 1], values[2, 0, best])


@pytest.mark.parametrize("lengths", [[0, 3], [3, 11], [3]])
def test_lengths_outside_the_cache_are_refused(lengths):
    q = np.zeros((2, 1, 1, 8), np.float32)
    keys = np.zeros((2, 1, 10, 8), np.float32)
    with pytest.raises(ValueError, match="one length per row, each 1 to 10"):
        decode_attention(q, keys, keys, lengths)


def new_position_case(batch=3, kv_heads=2, group=3, head_dim=8, capacity=12, seed=5):
    rng = np.random.default_rng(seed)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    q = f32(batch, kv_heads * group, head_dim)
    k, v = f32(batch, kv_heads, head_dim), f32(batch, kv_heads, head_dim)
    norms = np.abs(f32(2, head_dim)) + 0.5
    angles = rng.uniform(-3, 3, (batch, head_dim)).astype(np.float32)
    cache = f32(2, batch + 1, kv_heads, capacity, head_dim)  # rows after the first, as a decoder passes them
    positions = rng.integers(0, capacity, batch)
    keys, values = cache[0, 1:], cache[1, 1:]
    return q, k, v, norms[0], norms[1], 1e-6, np.cos(angles), np.sin(angles), 0.35, keys, values, positions


def rotated_reference(x, norm, eps, cos, sin):  # float64: RMS-normalized rows of x [heads, d], rotated
    x = x.astype(np.float64)
    x = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * norm
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[:, half:], x[:, :half]], -1) * sin


def test_new_position_against_the_formula_and_the_cache_it_writes():
    q, k, v, qn, kn, eps, cos, sin, scale, keys, values, positions = new_position_case()
    before_k, before_v = keys.copy(), values.copy()
    got = new_position(q, k, v, qn, kn, eps, cos, sin, scale, keys, values, positions)
    written = np.zeros(keys.shape[:3], bool)
    for b, p in enumerate(positions):
        want_q = rotated_reference(q[b], qn, eps, cos[b], sin[b]) * scale
        np.testing.assert_allclose(got[b], want_q, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(keys[b, :, p], rotated_reference(k[b], kn, eps, cos[b], sin[b]), rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_array_equal(values[b, :, p], v[b])
        written[b, :, p] = True
    np.testing.assert_array_equal(keys[~written], before_k[~written])
    np.testing.assert_array_equal(values[~written], before_v[~written])


def test_new_position_gives_the_bits_of_the_kernels_it_stands_for():
    """rms_norm, apply_rope and the scaling, each its own call, as the prefill path runs them."""
    q, k, v, qn, kn, eps, cos, sin, scale, keys, values, positions = new_position_case(group=2, head_dim=128)
    got = new_position(q, k, v, qn, kn, eps, cos, sin, scale, keys, values, positions)

    def apart(x, w):
        normed = elementwise.rms_norm(x[:, None], w, eps)
        return elementwise.apply_rope(normed, cos[:, None], sin[:, None])[:, 0]

    np.testing.assert_array_equal(got, apart(q, qn) * np.float32(scale))
    np.testing.assert_array_equal(keys[np.arange(len(q)), :, positions], apart(k, kn))


@pytest.mark.parametrize("position", [-1, 12])
def test_new_positions_outside_the_cache_are_refused_before_anything_is_written(position):
    q, k, v, qn, kn, eps, cos, sin, scale, keys, values, positions = new_position_case()
    positions[1] = position
    before = keys.copy(), values.copy()
    with pytest.raises(ValueError, match="outside the cache"):
        new_position(q, k, v, qn, kn, eps, cos, sin, scale, keys, values, positions)
    np.testing.assert_array_equal(keys, before[0])
    np.testing.assert_array_equal(values, before[1])


def prefill_case(kv_heads, group, n, start, hd=16, seed=0):
    rng = np.random.default_rng(seed)
    m = start + n
    q = rng.standard_normal((1, n, kv_heads * group, hd)).astype(np.float32)
    keys, values = rng.standard_normal((2, 1, kv_heads, m, hd)).astype(np.float32)
    positions = start + np.arange(n)[None, :]
    return q, keys, values, positions


def reference_prefill(q, keys, values, positions, group):  # float64, causal, one query row at a time
    _, n, heads, hd = q.shape
    out = np.zeros((n, heads, hd))
    for i, p in enumerate(positions[0]):
        for h in range(heads):
            k, v = keys[0, h // group, :p + 1].astype(np.float64), values[0, h // group, :p + 1]
            s = k @ q[0, i, h].astype(np.float64) * hd ** -0.5
            e = np.exp(s - s.max())
            out[i, h] = e / e.sum() @ v
    return out.reshape(1, n, -1)


def test_blocks_of_kv_heads_give_the_bits_of_one_block(monkeypatch):
    """Each kv head's product is its own GEMM either way, so splitting the heads changes no bit."""
    q, keys, values, positions = prefill_case(kv_heads=4, group=2, n=30, start=9)
    whole = decoder._prefill_attention(q, keys, values, positions, 2)
    per_head = 4 * 2 * 30 * 39
    for heads in (1, 3):
        monkeypatch.setattr(decoder, "PREFILL_SCORE_BYTES", heads * per_head)
        assert decoder._score_blocks(1, 4, 2, 30, 39) == (heads, 30)
        np.testing.assert_array_equal(decoder._prefill_attention(q, keys, values, positions, 2), whole)


def test_blocks_of_query_rows_keep_the_causal_mask(monkeypatch):
    """Blocks of 7 query rows (and a last one of 2): each block masks its own keys. BLAS rounds a row's
    products by its place in the matrix, so row blocks agree with one block to float32 rounding, not bits."""
    q, keys, values, positions = prefill_case(kv_heads=2, group=2, n=30, start=5, seed=1)
    whole = decoder._prefill_attention(q, keys, values, positions, 2)
    monkeypatch.setattr(decoder, "PREFILL_SCORE_BYTES", 4 * 2 * 7 * 35)
    assert decoder._score_blocks(1, 2, 2, 30, 35) == (1, 7)
    blocked = decoder._prefill_attention(q, keys, values, positions, 2)
    want = reference_prefill(q, keys, values, positions, 2)
    np.testing.assert_allclose(blocked, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(blocked, whole, rtol=1e-6, atol=1e-7)


def test_prefill_scores_stay_within_the_bound_whatever_the_prompt_length(monkeypatch):
    """4,000 positions: one block's scores would be 8 x 4000 x 4000 x 4 bytes = 512 MB; bounded to 1 MiB, the
    whole call allocates a few MiB (its inputs and output are 2 MB)."""
    q, keys, values, positions = prefill_case(kv_heads=4, group=2, n=4000, start=0, hd=8, seed=2)
    monkeypatch.setattr(decoder, "PREFILL_SCORE_BYTES", 1 << 20)
    decoder._prefill_attention(*prefill_case(kv_heads=1, group=2, n=3, start=0), 2)  # load the kernels first
    tracemalloc.start()
    try:
        out = decoder._prefill_attention(q, keys, values, positions, 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 << 20, f"{peak / 2**20:.1f} MiB"
    rows = [0, 1, 2345, 3999]
    want = reference_prefill(q[:, rows], keys, values, positions[:, rows], 2)
    np.testing.assert_allclose(out[:, rows], want, rtol=1e-5, atol=1e-6)


def test_self_attention_on_head_split_views_against_the_formula():
    """ops.attention takes the head-split views of [T, H * d] projections as they are: against float64 per
    head."""
    rng = np.random.default_rng(7)
    t, heads, d = 9, 3, 4
    q, k, v = (rng.standard_normal((t, heads * d)).astype(np.float32) for _ in range(3))
    split = lambda x: x.reshape(t, heads, d).transpose(1, 0, 2)  # noqa: E731
    got = ops.attention(split(q), split(k), split(v))  # [H, T, d]
    for h in range(heads):
        qh, kh, vh = (x[:, h * d:(h + 1) * d].astype(np.float64) for x in (q, k, v))
        scores = qh @ kh.T / np.sqrt(d)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        np.testing.assert_allclose(got[h], p / p.sum(-1, keepdims=True) @ vh, rtol=2e-5, atol=2e-6)


needs_two_threads = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")


@needs_two_threads
@pytest.mark.parametrize("batch, heads", [(1, 8), (2, 3)])
def test_heads_shared_among_numba_threads_give_the_bits_of_one_blas_call(monkeypatch, batch, heads):
    """Head-split views (strided, as the encoder's) and an odd head count split into uneven runs: every
    head's product is the same BLAS call, so the same bits as one stacked matmul."""
    monkeypatch.setattr(blas_split, "SPLIT_MACS", 0)
    rng = np.random.default_rng(heads)
    q, k = (rng.standard_normal((batch, 37, heads * 16)).astype(np.float32) for _ in range(2))
    split = lambda x: x.reshape(batch, 37, heads, 16).transpose(0, 2, 1, 3)  # noqa: E731
    with host.threads(2):
        got = blas_split.products(split(q), split(k))
    np.testing.assert_array_equal(got, split(q) @ np.swapaxes(split(k), -1, -2))
    assert blas_split.products(split(q)[:, :1], split(k)[:, :1]) is None  # one head: nothing to share
    assert blas_split.products(split(q).astype(np.float64), split(k)) is None


@needs_two_threads
def test_attention_inside_numba_products_shares_out_its_heads_for_the_same_bits(monkeypatch):
    """Where numba's threads run the products (BLAS kept to the calling thread), large attention products
    go to blas_split, and the encoder's attention and the decoder's prefill attention give the bits of one
    BLAS thread doing every head; small ones stay one call."""
    calls = []
    original = blas_split._split_matmul
    monkeypatch.setattr(blas_split, "_split_matmul",
                        lambda *args: calls.append(args[0].shape) or original(*args))
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((4, 300, 64)).astype(np.float32) for _ in range(3))
    prompt = prefill_case(kv_heads=4, group=2, n=300, start=0, hd=64, seed=3)
    with threadpool_limits(limits=1, user_api="blas"):  # as in the scope below: BLAS's own threads may sum
        alone = ops.attention(q, k, v), decoder._prefill_attention(*prompt, 2)  # in another order
    assert calls == []
    with host.threads(2, numba_products=True):
        shared = ops.attention(q, k, v), decoder._prefill_attention(*prompt, 2)
        small = ops.attention(q[:, :20], k[:, :20], v[:, :20])
    assert len(calls) == 4 and all(shape[0] == 1 for shape in calls)
    for got, want in zip(shared, alone):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(small, ops.attention(q[:, :20], k[:, :20], v[:, :20]))
    assert len(calls) == 4
