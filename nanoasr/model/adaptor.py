"""Projector + adaptor: [T, 512] encoder output -> [T, 1024] audio embeddings for the decoder."""
from __future__ import annotations

from nanoasr.model.config import AdaptorConfig
from nanoasr.ops import layer_norm, linear, self_attention

P = "model.multi_modal_projector."


def transformer_block(x, w, p, heads, eps):  # [T, d] -> [T, d]
    """FunASR's transformer EncoderLayer (pre-LN attention, pre-LN ReLU feed-forward, both residual), with the
    weights under prefix `p`: the adaptor's blocks and the CTC decoder's."""
    h = layer_norm(x, w[p + "input_layernorm.weight"], w[p + "input_layernorm.bias"], eps)
    attn, _ = self_attention(h, w, p + "self_attn.", heads)
    x = x + linear(attn, w[p + "self_attn.o_proj.weight"], w[p + "self_attn.o_proj.bias"])
    h = layer_norm(x, w[p + "post_attention_layernorm.weight"], w[p + "post_attention_layernorm.bias"], eps)
    return x + linear(linear(h, w[p + "mlp.fc1.weight"], w[p + "mlp.fc1.bias"], relu=True),
                      w[p + "mlp.fc2.weight"], w[p + "mlp.fc2.bias"])


def adaptor_block(x, w, i, cfg: AdaptorConfig, eps):  # [T, 1024] -> [T, 1024]
    return transformer_block(x, w, f"{P}layers.{i}.", cfg.num_attention_heads, eps)


def adapt(enc, w, cfg: AdaptorConfig, eps: float, taps=None):  # [T, 512] -> [T, 1024]
    """`eps` is the profile's LayerNorm eps (1e-12 funasr, the config's value for transformers)."""
    x = linear(linear(enc, w[P + "linear_1.weight"], w[P + "linear_1.bias"], relu=True),
               w[P + "linear_2.weight"], w[P + "linear_2.bias"])
    if taps is not None:
        taps["projector"] = x
    for i in range(cfg.num_hidden_layers):
        x = adaptor_block(x, w, i, cfg, eps)
        if taps is not None:
            taps[i] = x
    return x
