"""SAN-M audio encoder: [B, T, 560] LFR features -> [B, T, 512] (70 pre-LN blocks; DESIGN §1).

Batched over padded inputs: `mask` marks valid frames, and the valid rows equal single-item inference
(padded keys are masked out of attention and padded values are zeroed before the FSMN convolution).
"""
from __future__ import annotations

import numpy as np

from nanoasr.backend import array_module
from nanoasr.model.config import AudioConfig
from nanoasr.ops import attention, layer_norm, linear


def sinusoid_positions(n: int, depth: int, xp=np):  # -> [n, depth], positions 1..n, [sin | cos]
    half = depth // 2
    inv = np.exp(-np.log(10000.0) / (half - 1) * np.arange(half, dtype=np.float32)).astype(np.float32)
    angles = np.arange(1, n + 1, dtype=np.float32)[:, None] * inv[None, :]
    return xp.asarray(np.concatenate([np.sin(angles), np.cos(angles)], axis=1))


def fsmn(v, kernel):  # v [B, T, D] (padding zeroed), kernel [D, 1, K] -> [B, T, D]: depthwise conv + v
    if array_module(v) is np:
        from nanoasr.kernels.elementwise import fsmn as one_pass

        return one_pass(v, kernel)
    return fsmn_xp(v, kernel)


def fsmn_xp(v, kernel):  # the array-module twin of the kernel (CuPy runs it)
    xp = array_module(v)
    taps = kernel.shape[-1]
    pad = (taps - 1) // 2
    padded = xp.pad(v, ((0, 0), (pad, taps - 1 - pad), (0, 0)))
    out = v.copy()
    for k in range(taps):  # one vectorised multiply-add per tap
        out += padded[:, k:k + v.shape[1]] * kernel[:, 0, k]
    return out


def self_attention(h, w, prefix, heads, mask):  # [B, T, d_in] -> attn [B, T, D], v [B, T, D]
    b, t, _ = h.shape
    q = linear(h, w[prefix + "q_proj.weight"], w[prefix + "q_proj.bias"])
    k = linear(h, w[prefix + "k_proj.weight"], w[prefix + "k_proj.bias"])
    v = linear(h, w[prefix + "v_proj.weight"], w[prefix + "v_proj.bias"])
    split = lambda x: x.reshape(b, t, heads, -1).transpose(0, 2, 1, 3)  # noqa: E731  [B, H, T, dh]
    out = attention(split(q), split(k), split(v), mask[:, None, :])  # [B, H, T, dh]
    return out.transpose(0, 2, 1, 3).reshape(b, t, -1), v


def encoder_block(x, w, i, cfg: AudioConfig, mask):  # [B, T, d_in] -> [B, T, D]
    p = f"model.audio_tower.layers.{i}."
    h = layer_norm(x, w[p + "input_layernorm.weight"], w[p + "input_layernorm.bias"], cfg.layer_norm_eps)
    attn, v = self_attention(h, w, p + "self_attn.", cfg.num_attention_heads, mask)
    v = v * mask[..., None]
    a = linear(attn, w[p + "self_attn.o_proj.weight"], w[p + "self_attn.o_proj.bias"])
    a += fsmn(v, w[p + "self_attn.fsmn.conv.weight"])
    x = x + a if x.shape[-1] == a.shape[-1] else a  # block 0 maps 560 -> 512 and has no residual
    h = layer_norm(x, w[p + "post_attention_layernorm.weight"], w[p + "post_attention_layernorm.bias"],
                   cfg.layer_norm_eps)
    h = linear(linear(h, w[p + "mlp.fc1.weight"], w[p + "mlp.fc1.bias"], relu=True), w[p + "mlp.fc2.weight"],
               w[p + "mlp.fc2.bias"])
    x = x + h
    if i in cfg.final_norm_layers:
        x = layer_norm(x, w[p + "final_layernorm.weight"], w[p + "final_layernorm.bias"], cfg.layer_norm_eps)
    return x


def encode(feats, mask, w, cfg: AudioConfig, taps=None):  # [B, T, 560], mask [B, T] -> [B, T, 512]
    """`taps`, when a dict, receives the hidden state after each block (stage tests)."""
    xp = array_module(feats)
    x = feats * np.float32(cfg.hidden_size ** 0.5) + sinusoid_positions(feats.shape[1], cfg.input_size, xp)
    for i in range(cfg.num_hidden_layers):
        x = encoder_block(x, w, i, cfg, mask)
        if taps is not None:
            taps[i] = x
    return x
