"""The decode-attention kernel against a float64 softmax(q k^T) v written out per row and head."""
import numpy as np
import pytest

from nanoasr.kernels.attention import decode_attention


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
