"""SAN-M audio encoder: [T, 560] LFR features -> [T, 512] (70 pre-LN blocks; DESIGN §1).

Each segment is encoded alone, so every frame is valid: nothing is padded, nothing masked.
"""
from __future__ import annotations

import numpy as np

from nanoasr.model.config import AudioConfig
from nanoasr.ops import fsmn, layer_norm, linear, self_attention
from nanoasr.xp import array_module


def sinusoid_positions(n: int, depth: int, xp=np):  # -> [n, depth], positions 1..n, [sin | cos]
    half = depth // 2
    inv = np.exp(-np.log(10000.0) / (half - 1) * np.arange(half, dtype=np.float32)).astype(np.float32)
    angles = np.arange(1, n + 1, dtype=np.float32)[:, None] * inv[None, :]
    return xp.asarray(np.concatenate([np.sin(angles), np.cos(angles)], axis=1))


def encoder_block(x, w, i, cfg: AudioConfig):  # [T, d_in] -> [T, D]
    p = f"model.audio_tower.layers.{i}."
    h = layer_norm(x, w[p + "input_layernorm.weight"], w[p + "input_layernorm.bias"], cfg.layer_norm_eps)
    attn, v = self_attention(h, w, p + "self_attn.", cfg.num_attention_heads)
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


def encode(feats, w, cfg: AudioConfig, taps=None):  # [T, 560] -> [T, 512]
    """`taps`, when a dict, receives the hidden state after each block (stage tests)."""
    xp = array_module(feats)
    x = feats * np.float32(cfg.hidden_size ** 0.5) + sinusoid_positions(feats.shape[0], cfg.input_size, xp)
    for i in range(cfg.num_hidden_layers):
        x = encoder_block(x, w, i, cfg)
        if taps is not None:
            taps[i] = x
    return x
