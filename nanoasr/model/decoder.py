"""Qwen3 decoder over a preallocated float32 KV cache (DESIGN §1): GQA attention with per-head q/k RMS norm
before rotate-half RoPE, SwiGLU MLP, tied LM head.

One forward serves prefill and decode: `x` [B, n, H] are new positions for cache rows `rows` (a slice of the
batch), item b's new positions starting at `start[b]`. Prefill is n > 1 for rows that start empty, each
prompt padded on the right to the longest (a causal query never sees the padding after it, so a row's
results are its own); batched decode is n = 1 for the active rows, each at its own position. `Session` keeps
the cache rows and their positions for that loop: prefill prompts into free rows (one pass over the weights
for all of them), step every active row, retire a finished row. Where the backend has one, a decode step's
layer runs as one compiled call (ops.compiled_layer: on the CPU, made once per Session) computing what the
op-by-op layer below computes, bit for bit.

A draft (Session.prefill_draft) rides along a one-row prefill: positions after the prompt whose tokens are
guessed, each computed as a decode step computes its one row (_draft_layer), so that its logits and cache
rows carry a step's bits. A prefill's many-row products do not: BLAS, the int8 GEMM and the bf16 GEMM sum in
another order than the decode kernels, and a logit of a prefilled position differs from the step's in its
last bits on every product path (float32, int8 and bf16 rows alike).
"""
from __future__ import annotations

import numpy as np

from nanoasr.model.config import TextConfig
from nanoasr.ops import (apply_rope, compiled_layer, decode_attention, decode_rows, linear, mask_inplace,
                         new_position, products, rms_norm, rope_inv_freq, rope_tables, softmax_inplace,
                         swiglu, take_rows)
from nanoasr.tensor import StoredTensor
from nanoasr.xp import array_module

P = "model.language_model."
EMBED = P + "embed_tokens.weight"
# A layer's matrices and norms in the order ops.compiled_layer takes them
MATRICES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj")
NORMS = ("input_layernorm", "self_attn.q_norm", "self_attn.k_norm", "post_attention_layernorm")


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


def cache_bytes_per_position(cfg: TextConfig) -> int:
    """Bytes one position of one batch row takes in a KVCache (k and v, every layer, float32)."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4


def embed(ids, w):  # [n] token ids -> [n, H]
    table = w[EMBED]
    if isinstance(table, StoredTensor):
        return take_rows(table, ids)
    return table[array_module(table).asarray(ids)]


def _write_cache(cache: KVCache, layer, rows: slice, start, k, v):  # k, v [B, n, kvh, hd] of a prefill
    # (padding included: past each row's prompt, where its tokens will overwrite it)
    b, n = k.shape[:2]
    for r in range(b):
        s = int(start[r])
        cache.k[layer, rows.start + r, :, s:s + n] = k[r].transpose(1, 0, 2)
        cache.v[layer, rows.start + r, :, s:s + n] = v[r].transpose(1, 0, 2)


# Prefill scores are [B, kv heads, group, n, m] float32, for a long prompt more memory than the weights. They
# are made a block of kv heads at a time (one GEMM per head either way, so the bits do not change) and, when
# one head's scores are too big, a block of query rows at a time: a block's scores never pass this many bytes
# (for up to PREFILL_SCORE_BYTES / (4 * B * group) keys; a block holds at least one query row).
PREFILL_SCORE_BYTES = 64 << 20


def _score_blocks(b, kv_heads, group, n, m):  # -> (kv heads, query rows) per block
    per_head = 4 * b * group * n * m
    if per_head <= PREFILL_SCORE_BYTES:
        return max(1, min(kv_heads, PREFILL_SCORE_BYTES // per_head)), n
    return 1, max(1, PREFILL_SCORE_BYTES // (4 * b * group * m))


def _prefill_attention(q, keys, values, positions, group, activations="exact"):  # q [B, n, heads, hd],
    # keys/values [B, kvh, m, hd] (the cache up to the last query), positions [B, n] of the queries
    # -> [B, n, heads*hd]
    xp = array_module(q)
    b, n, _, hd = q.shape
    kvh, m = keys.shape[1], keys.shape[2]
    # the query heads sharing a kv head become one [g*n, hd] matrix, so each product is one plain GEMM
    q = xp.ascontiguousarray((q * np.float32(hd ** -0.5)).reshape(b, n, kvh, group, hd)
                             .transpose(0, 2, 3, 1, 4))  # [B, kvh, g, n, hd]
    heads, rows = _score_blocks(b, kvh, group, n, m)
    key_positions = xp.arange(m)
    out = xp.empty((b, n, kvh, group, hd), np.float32)
    for h in range(0, kvh, heads):
        for r in range(0, n, rows):
            keep = key_positions <= positions[:, r:r + rows, None]  # [B, rows, m]: causal + per-row length
            kv, qs = slice(h, h + heads), slice(r, r + rows)
            out[:, qs, kv] = _attend_block(q[:, kv, :, qs], keys[:, kv], values[:, kv], keep, activations)
    return out.reshape(b, n, -1)


def _attend_block(q, keys, values, keep, activations):  # q [B, h, g, c, hd], keys/values [B, h, m, hd], keep
    # [B, c, m] -> [B, c, h, g, hd] (a view)
    xp = array_module(q)
    b, h, g, c, hd = q.shape
    m = keys.shape[2]
    scores = products(q.reshape(b, h, g * c, hd), keys, activations).reshape(b, h, g, c, m)
    probs = softmax_inplace(mask_inplace(scores, keep[:, None, None]))
    attended = products(probs.reshape(b, h, g * c, m), xp.swapaxes(values, -1, -2), activations)
    return attended.reshape(b, h, g, c, hd).transpose(0, 3, 1, 2, 4)


def row_products(x, weight, per: int):  # [n, in] -> [n, out] in products of at most `per` rows (decode_rows),
    # so that each row has the bits a decode step gives it alone
    if len(x) <= per:
        return linear(x, weight)
    return array_module(x).concatenate([linear(x[a:a + per], weight) for a in range(0, len(x), per)])


def _draft_layer(d, w, i, cfg: TextConfig, cache: KVCache, row: int, start: int, rope, positions, per: int):
    """d [k, H]: the draft positions start, start + 1, ... of cache row `row`, after the layer's prompt
    positions are in the cache -> [k, H]. Each is computed as a decode step computes its one row, op by op
    (which the compiled layer matches bit for bit): products of at most `per` rows, then its own
    new_position and decode_attention over the cache, which hold every position before it."""
    p = f"{P}layers.{i}."
    k = len(d)
    kvh, hd = cfg.num_key_value_heads, cfg.head_dim
    group = cfg.num_attention_heads // kvh
    h = rms_norm(d, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
    q = row_products(h, w[p + "self_attn.q_proj.weight"], per).reshape(k, cfg.num_attention_heads, hd)
    keys_new = row_products(h, w[p + "self_attn.k_proj.weight"], per).reshape(k, kvh, hd)
    v = row_products(h, w[p + "self_attn.v_proj.weight"], per).reshape(k, kvh, hd)
    q_norm, k_norm = w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"]
    keys, values = cache.k[i, row:row + 1], cache.v[i, row:row + 1]
    attn = array_module(d).empty((k, cfg.num_attention_heads * hd), np.float32)
    for j in range(k):
        one = slice(j, j + 1)
        qj = new_position(q[one], keys_new[one], v[one], q_norm, k_norm, cfg.rms_norm_eps, rope[0][one],
                          rope[1][one], hd ** -0.5, keys, values, positions[one])
        length = np.array([start + j + 1], np.int64)
        attn[j] = decode_attention(qj.reshape(1, kvh, group, hd), keys, values, length).reshape(-1)
    d = d + row_products(attn, w[p + "self_attn.o_proj.weight"], per)
    h = rms_norm(d, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
    gated = swiglu(row_products(h, w[p + "mlp.gate_proj.weight"], per),
                   row_products(h, w[p + "mlp.up_proj.weight"], per))
    return d + row_products(gated, w[p + "mlp.down_proj.weight"], per)


def compiled_layers(w, cfg: TextConfig) -> list:
    """Each layer's compiled decode call (ops.compiled_layer), or None where the device has none."""
    def weights(i, names):
        return [w[f"{P}layers.{i}.{name}.weight"] for name in names]
    return [compiled_layer(weights(i, MATRICES), weights(i, NORMS)) for i in range(cfg.num_hidden_layers)]


class _FirstLayerCall(Exception):
    """compile_step_beside's stop: the first layer's compiled call, with its arguments."""


def compile_step_beside(w, cfg: TextConfig) -> bool:
    """Start compiling the decode step's compiled layers (each distinct one) in child processes, from the
    arguments the first layer gets in a step of one row (CompiledLayer.compile_beside), where the disk cache
    lacks them; True when any child was started, False also where the device has no compiled layer."""
    layers = compiled_layers(w, cfg)
    if any(layer is None or not hasattr(layer, "compile_beside") for layer in layers):
        return False

    def first(*args):
        raise _FirstLayerCall(args)
    inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta)
    try:  # a step runs up to the first layer's call, as Session.step runs it
        forward(np.zeros((1, 1, cfg.hidden_size), np.float32), w, cfg, KVCache(cfg, 1, 1), slice(0, 1), [0],
                inv_freq, compiled=[first] * len(layers))
    except _FirstLayerCall as call:
        args = call.args[0]
    distinct = {layer.products: layer for layer in layers}.values()  # one or two kinds of layer a model
    return any([layer.compile_beside(*args) for layer in distinct])


def decoder_layer(x, w, i, cfg: TextConfig, cache: KVCache, rows: slice, start, rope, positions,
                  compiled=None):  # [B, n, H]; compiled: the layer's compiled decode call, or None
    p = f"{P}layers.{i}."
    b, n, _ = x.shape
    kvh, hd = cfg.num_key_value_heads, cfg.head_dim
    group = cfg.num_attention_heads // kvh
    if n == 1 and compiled is not None:  # decode: the whole layer in one call
        whole = compiled(x[:, 0], cfg.rms_norm_eps, rope[0][:, 0], rope[1][:, 0], hd ** -0.5,
                         cache.k[i, rows], cache.v[i, rows], positions[:, 0])
        if whole is not None:
            return whole[:, None]
    h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
    q = linear(h, w[p + "self_attn.q_proj.weight"]).reshape(b, n, cfg.num_attention_heads, hd)
    k = linear(h, w[p + "self_attn.k_proj.weight"]).reshape(b, n, kvh, hd)
    v = linear(h, w[p + "self_attn.v_proj.weight"]).reshape(b, n, kvh, hd)
    q_norm, k_norm = w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"]
    if n == 1:  # decode: one new position per row, straight over the cache
        keys, values = cache.k[i, rows], cache.v[i, rows]
        q = new_position(q[:, 0], k[:, 0], v[:, 0], q_norm, k_norm, cfg.rms_norm_eps, rope[0][:, 0],
                         rope[1][:, 0], hd ** -0.5, keys, values, positions[:, 0])
        attn = decode_attention(q.reshape(b, kvh, group, hd), keys, values, start + 1).reshape(b, 1, -1)
    else:
        q = apply_rope(rms_norm(q, q_norm, cfg.rms_norm_eps), *rope)
        k = apply_rope(rms_norm(k, k_norm, cfg.rms_norm_eps), *rope)
        _write_cache(cache, i, rows, start, k, v)
        m = int(start.max()) + n  # keys up to the last query's position
        attn = _prefill_attention(q, cache.k[i, rows, :, :m], cache.v[i, rows, :, :m], positions, group,
                                  w[p + "self_attn.q_proj.weight"].activations)
    x = x + linear(attn, w[p + "self_attn.o_proj.weight"])
    h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
    gated = swiglu(linear(h, w[p + "mlp.gate_proj.weight"]), linear(h, w[p + "mlp.up_proj.weight"]))
    return x + linear(gated, w[p + "mlp.down_proj.weight"])


def forward(x, w, cfg: TextConfig, cache: KVCache, rows: slice, start, inv_freq, counts=None, compiled=None,
            draft=None):
    """[B, n, H] -> [B, H]: run new positions through the decoder, filling the cache; returns each row's
    final-normed last position. `inv_freq` [head_dim/2]: the rotary frequencies (ops.rope_inv_freq), on x's
    device. `counts` [B] (host): the positions of each row that are real, the rest padding (all n if None).
    `compiled`: compiled_layers(w, cfg) for a decode step (made here when None). `draft` [k, H]: positions
    that follow the new ones of a single row (B = 1, no padding), each computed as a decode step computes it
    (_draft_layer), layer by layer beside them; they are returned after the last position: [1 + k, H]."""
    xp = array_module(x)
    b, n, _ = x.shape
    counts = np.full(b, n, np.int64) if counts is None else np.asarray(counts, dtype=np.int64)
    start = np.asarray(start, dtype=np.int64)
    positions = start[:, None] + np.arange(n)[None, :]  # [B, n]
    on_device = xp.asarray(positions)  # the one copy of the positions to x's device
    cos, sin = rope_tables(on_device.reshape(-1), inv_freq)
    rope = (cos.reshape(b, n, -1), sin.reshape(b, n, -1))
    if n == 1 and compiled is None:
        compiled = compiled_layers(w, cfg)
    if draft is not None:  # positions n, n + 1, ... of row 0, on the decode steps' tables
        after = int(start[0]) + n
        drafted = xp.asarray(after + np.arange(len(draft)))
        draft_rope, per = rope_tables(drafted, inv_freq), decode_rows(draft)
    for i in range(cfg.num_hidden_layers):
        x = decoder_layer(x, w, i, cfg, cache, rows, start, rope, on_device, compiled and compiled[i])
        if draft is not None:
            draft = _draft_layer(draft, w, i, cfg, cache, rows.start, after, draft_rope, drafted, per)
    cache.lengths[rows] = start + counts + (0 if draft is None else len(draft))
    last = x[:, -1]
    if (counts < n).any():  # prompts padded to the longest: each row's last real position
        last = last.copy()
        for r in np.flatnonzero(counts < n).tolist():
            last[r] = x[r, counts[r] - 1]
    if draft is not None:
        last = xp.concatenate([last, draft])
    return rms_norm(last, w[P + "norm.weight"], cfg.rms_norm_eps)


def logits(hidden, w):  # [B, H] -> [B, vocab]: the tied LM head, in the embedding's stored type
    return linear(hidden, w.get("lm_head.weight", w[EMBED]))


class Session:
    """Cache rows decoded together. Prompts are prefilled into the next free rows, together; a step
    advances every active row by one token. The active rows are the cache's first `active` rows: retiring a
    row moves the last active row into its place. `bf16_rope` rounds the rotary frequencies as FunASR does
    (the funasr profile); without it they are exact, as in Transformers."""

    def __init__(self, w, cfg: TextConfig, rows: int, bf16_rope: bool = False):
        self.w, self.cfg, self.rows = w, cfg, rows
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, bf16_rope)  # moved to the cache's device
        self.cache: KVCache | None = None  # made by the first prefill, on the device of its embeddings
        self.active = 0
        self.compiled: list | None = None  # compiled_layers, made by the first step

    def prefill(self, embeds, room: int = 0):  # [L, H] -> logits [1, vocab] of its last position
        """Run a prompt into the next free row, keeping `room` positions free after it for its tokens."""
        return self.prefill_many([embeds], [room])

    def prefill_many(self, prompts, rooms):  # k prompts [L_i, H] -> logits [k, vocab] of their last positions
        """Run prompts into the next free rows in one forward (padded on the right to the longest), keeping
        rooms[i] positions free after prompt i for its tokens."""
        if len(prompts) != len(rooms) or not prompts:
            raise ValueError(f"prefill takes one room per prompt, at least one; got {len(prompts)} prompts "
                             f"and {len(rooms)} rooms")
        if self.active + len(prompts) > self.rows:
            free = self.rows - self.active
            raise ValueError(f"{len(prompts)} prompt(s) to prefill but {free} of {self.rows} cache rows are "
                             "free; retire rows first")
        xp = array_module(prompts[0])
        counts = [len(p) for p in prompts]
        needed = max(c + r for c, r in zip(counts, rooms))  # rooms are never negative: the padding fits too
        if self.cache is None:
            self.cache = KVCache(self.cfg, self.rows, needed, xp)
            self.inv_freq = xp.asarray(self.inv_freq)
        self.cache.reserve(needed)
        if len(prompts) == 1:
            x = prompts[0][None]
        else:
            x = xp.zeros((len(prompts), max(counts), prompts[0].shape[1]), np.float32)
            for i, p in enumerate(prompts):
                x[i, :len(p)] = p
        rows = slice(self.active, self.active + len(prompts))
        hidden = forward(x, self.w, self.cfg, self.cache, rows, [0] * len(prompts), self.inv_freq, counts)
        self.active += len(prompts)
        return logits(hidden, self.w)

    def prefill_draft(self, embeds, draft, room: int = 0):  # [L, H], k token ids -> hidden [1 + k, H]
        """Run a prompt and the draft tokens after it into the next free row in one forward: the final-normed
        last prompt position, then each draft position, with a decode step's bits (forward's `draft`); the
        row holds L + k positions (rewind drops the rejected ones) and room for L + max(room, k)."""
        if self.active >= self.rows:
            raise ValueError(f"no free cache row for a prompt: {self.rows} of {self.rows} are active")
        if decode_rows(embeds) == 0:
            raise ValueError("this device does not compute a draft's positions with a decode step's bits")
        xp = array_module(embeds)
        if self.cache is None:
            self.cache = KVCache(self.cfg, self.rows, len(embeds) + max(room, len(draft)), xp)
            self.inv_freq = xp.asarray(self.inv_freq)
        self.cache.reserve(len(embeds) + max(room, len(draft)))
        rows = slice(self.active, self.active + 1)
        hidden = forward(embeds[None], self.w, self.cfg, self.cache, rows, [0], self.inv_freq,
                         draft=embed(list(draft), self.w))
        self.active += 1
        return hidden

    def rewind(self, row: int, length: int) -> None:
        """Keep the first `length` positions of active row `row` (a draft's rejected positions are dropped:
        the next step writes over them)."""
        if not 0 <= row < self.active or not 0 <= length <= self.cache.lengths[row]:
            raise ValueError(f"row {row} of {self.active} active rows cannot keep {length} positions")
        self.cache.lengths[row] = length

    def step(self, ids):  # one token id per active row [active] -> logits [active, vocab]
        if len(ids) != self.active:
            raise ValueError(f"a step takes one token per active row ({self.active}); got {len(ids)}")
        x = embed(ids, self.w)[:, None, :]  # [active, 1, H]
        rows = slice(0, self.active)
        start = self.cache.lengths[rows].copy()
        if self.compiled is None:
            self.compiled = compiled_layers(self.w, self.cfg)
        hidden = forward(x, self.w, self.cfg, self.cache, rows, start, self.inv_freq, compiled=self.compiled)
        return logits(hidden, self.w)

    def retire(self, row: int) -> None:
        """Free active row `row`; the last active row (its cache and position) moves into its place."""
        if not 0 <= row < self.active:
            raise ValueError(f"row {row} is not one of the {self.active} active rows")
        self.active -= 1
        if row != self.active:
            self.cache.swap(row, self.active)
