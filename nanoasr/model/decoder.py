"""Qwen3 decoder over a preallocated float32 KV cache (DESIGN §1): GQA attention with per-head q/k RMS norm
before rotate-half RoPE, SwiGLU MLP, tied LM head.

One forward serves prefill and decode: `x` [B, n, H] are new positions for cache rows `rows` (a slice of the
batch), item b's new positions starting at `start[b]`. Prefill is n > 1 for one row; batched decode is n = 1
for the active rows, each at its own position.
"""
from __future__ import annotations

import numpy as np

from nanoasr.backend import array_module
from nanoasr.model.config import TextConfig
from nanoasr.ops import apply_rope, linear, mask_inplace, rms_norm, rope_tables, softmax_inplace, swiglu
from nanoasr.tensor import StoredTensor, take_rows

P = "model.language_model."
EMBED = P + "embed_tokens.weight"


class KVCache:
    """k, v: [layers, batch, kv_heads, capacity, head_dim] float32;
    lengths: filled positions per batch row."""

    def __init__(self, cfg: TextConfig, batch: int, capacity: int, xp=np):
        shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, capacity, cfg.head_dim)
        self.k = xp.zeros(shape, dtype=np.float32)
        self.v = xp.zeros(shape, dtype=np.float32)
        self.lengths = np.zeros(batch, dtype=np.int64)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def reserve(self, capacity: int) -> None:
        """Room for at least `capacity` positions per row (grown by copying; filled positions are kept)."""
        if capacity <= self.capacity:
            return
        xp = array_module(self.k)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = xp.zeros(old.shape[:3] + (capacity,) + old.shape[4:], dtype=np.float32)
            new[:, :, :, :old.shape[3]] = old
            setattr(self, name, new)

    def swap(self, a: int, b: int) -> None:
        """Exchange two batch rows (keeps the active rows a contiguous prefix as items finish)."""
        for buf in (self.k, self.v):
            tmp = buf[:, a].copy()
            buf[:, a] = buf[:, b]
            buf[:, b] = tmp
        self.lengths[[a, b]] = self.lengths[[b, a]]


def embed(ids, w):  # [n] token ids -> [n, H]
    table = w[EMBED]
    if isinstance(table, StoredTensor):
        return array_module(w[P + "norm.weight"]).asarray(take_rows(table, ids))
    return table[array_module(table).asarray(ids)]


def _write_cache(cache: KVCache, layer, rows: slice, start, k, v):  # k, v [B, n, kvh, hd]
    b, n = k.shape[:2]
    if n == 1:
        batch = np.arange(rows.start, rows.start + b)
        cache.k[layer, batch, :, start] = k[:, 0]
        cache.v[layer, batch, :, start] = v[:, 0]
    else:  # prefill of one row
        s = int(start[0])
        cache.k[layer, rows.start, :, s:s + n] = k[0].transpose(1, 0, 2)
        cache.v[layer, rows.start, :, s:s + n] = v[0].transpose(1, 0, 2)


def _prefill_attention(q, keys, values, mask, group):  # q [B, n, heads, hd], cache views -> [B, n, heads*hd]
    xp = array_module(q)
    b, n, _, hd = q.shape
    kvh, m = keys.shape[1], mask.shape[-1]
    keys, values = keys[:, :, :m], values[:, :, :m]  # [B, kvh, m, hd]
    # the query heads sharing a kv head become one [g*n, hd] matrix, so each product is one plain GEMM
    q = xp.ascontiguousarray((q * np.float32(hd ** -0.5)).reshape(b, n, kvh, group, hd)
                             .transpose(0, 2, 3, 1, 4))
    scores = (q.reshape(b, kvh, group * n, hd) @ xp.swapaxes(keys, -1, -2)).reshape(b, kvh, group, n, m)
    probs = softmax_inplace(mask_inplace(scores, mask[:, None, None]))
    attn = probs.reshape(b, kvh, group * n, m) @ values  # [B, kvh, g*n, hd]
    return attn.reshape(b, kvh, group, n, hd).transpose(0, 3, 1, 2, 4).reshape(b, n, -1)


def decoder_layer(x, w, i, cfg: TextConfig, cache: KVCache, rows: slice, start, rope, mask):  # [B, n, H]
    xp = array_module(x)
    p = f"{P}layers.{i}."
    b, n, _ = x.shape
    kvh, hd = cfg.num_key_value_heads, cfg.head_dim
    group = cfg.num_attention_heads // kvh
    h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
    q = linear(h, w[p + "self_attn.q_proj.weight"]).reshape(b, n, cfg.num_attention_heads, hd)
    k = linear(h, w[p + "self_attn.k_proj.weight"]).reshape(b, n, kvh, hd)
    v = linear(h, w[p + "self_attn.v_proj.weight"]).reshape(b, n, kvh, hd)
    q = apply_rope(rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps), *rope)
    k = apply_rope(rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps), *rope)
    _write_cache(cache, i, rows, start, k, v)
    if n == 1 and xp is np:  # decode: one new position per row, straight over the cache
        from nanoasr.kernels.attention import decode_attention

        q = (q * np.float32(hd ** -0.5)).reshape(b, kvh, group, hd)
        attn = decode_attention(q, cache.k[i, rows], cache.v[i, rows], start + 1).reshape(b, 1, -1)
    else:
        attn = _prefill_attention(q, cache.k[i, rows], cache.v[i, rows], mask, group)
    x = x + linear(attn, w[p + "self_attn.o_proj.weight"])
    h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
    gated = swiglu(linear(h, w[p + "mlp.gate_proj.weight"]), linear(h, w[p + "mlp.up_proj.weight"]))
    return x + linear(gated, w[p + "mlp.down_proj.weight"])


def forward(x, w, cfg: TextConfig, cache: KVCache, rows: slice, start):  # [B, n, H] -> last hidden [B, H]
    """Run new positions through the decoder, filling the cache; returns the final-normed last position."""
    xp = array_module(x)
    b, n, _ = x.shape
    start = np.asarray(start, dtype=np.int64)
    positions = start[:, None] + np.arange(n)[None, :]  # [B, n]
    cos, sin = rope_tables(xp.asarray(positions.reshape(-1)), cfg.head_dim, cfg.rope_theta)
    rope = (cos.reshape(b, n, -1), sin.reshape(b, n, -1))
    key_positions = np.arange(int(positions.max()) + 1)
    # [B, n, m] causal + per-row length
    mask = xp.asarray(key_positions[None, None, :] <= positions[:, :, None])
    for i in range(cfg.num_hidden_layers):
        x = decoder_layer(x, w, i, cfg, cache, rows, start, rope, mask)
    cache.lengths[rows] = positions[:, -1] + 1
    return rms_norm(x[:, -1], w[P + "norm.weight"], cfg.rms_norm_eps)


def logits(hidden, w):  # [B, H] -> [B, vocab]: the tied LM head, in the embedding's stored type
    return linear(hidden, w.get("lm_head.weight", w[EMBED]))
