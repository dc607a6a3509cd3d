"""FunASR's CTC branch, the network: a Transformer over the encoder output (`ctc_decoder.*`, the Transformer
class of funasr/models/llm_asr/adaptor.py with downsample_rate 1, the audio adaptor's design) and a projection
to the CTC vocabulary (`ctc.ctc_lo`, funasr/models/fun_asr_nano/ctc.py), log-softmaxed. Its posteriors give
word timestamps and a greedy second transcript; nanoasr.checkpoints.ctc reads it from FunASR's model.pt.
"""
from __future__ import annotations

from dataclasses import dataclass

from nanoasr.model.adaptor import transformer_block
from nanoasr.ops import linear
from nanoasr.xp import array_module, to_numpy

FRAME_S = 0.06  # one encoder frame: 6 stacked fbank frames of 10 ms
LAYER_NORM_EPS = 1e-12  # FunASR's transformer LayerNorm default, which the CTC decoder's blocks use
P = "ctc_decoder."


@dataclass(frozen=True)
class CtcConfig:
    """config.yaml's ctc_decoder_conf, ctc_vocab_size and ctc_conf; defaults are Fun-ASR-Nano-2512's."""

    input_size: int = 512  # encoder_dim: the encoder output width
    projector_hidden_size: int = 2048  # ffn_dim
    hidden_size: int = 512  # llm_dim: the blocks' width, which ctc.ctc_lo reads
    num_hidden_layers: int = 5  # n_layer
    num_attention_heads: int = 8  # attention_heads (FunASR's default when config.yaml leaves it out)
    vocab_size: int = 60515  # ctc_vocab_size
    blank_id: int = 60514  # ctc_conf.blank_id, by default the last id


def log_probs(enc, w, cfg: CtcConfig):  # enc [T, input] -> [T, vocab] log-probabilities
    xp = array_module(enc)
    x = linear(linear(enc, w[P + "linear_1.weight"], w[P + "linear_1.bias"], relu=True),
               w[P + "linear_2.weight"], w[P + "linear_2.bias"])  # [T, hidden]
    for i in range(cfg.num_hidden_layers):
        x = transformer_block(x, w, f"{P}layers.{i}.", cfg.num_attention_heads, LAYER_NORM_EPS)
    logits = linear(x, w["ctc.ctc_lo.weight"], w["ctc.ctc_lo.bias"])  # [T, vocab]
    top = logits.max(axis=-1, keepdims=True)
    return logits - (top + xp.log(xp.exp(logits - top).sum(axis=-1, keepdims=True)))


def greedy_ids(logp, blank_id: int) -> list[int]:  # [T, vocab] -> best id a frame, repeats merged, no blank
    best = to_numpy(logp.argmax(axis=-1))  # [T]
    keep = best != blank_id
    keep[1:] &= best[1:] != best[:-1]
    return best[keep].tolist()


def target_columns(logp, targets: list[int], blank_id: int):  # [T, vocab] -> host [T, L], [T]
    """The log-probabilities forced alignment reads: the transcript's tokens' columns and the blank's."""
    xp = array_module(logp)
    return to_numpy(logp[:, xp.asarray(targets, dtype=xp.int64)]), to_numpy(logp[:, blank_id])
