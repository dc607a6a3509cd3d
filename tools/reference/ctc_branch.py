"""A random CTC branch added to a FunASR folder (tools/reference/funasr_checkpoint.py's), in FunASR's names
and shapes, with a small tiktoken-format vocabulary; and a torch reference of the branch's forward pass.

    python -m tools.reference.ctc_branch FUNASR_DIR [--seed N]

Names and shapes follow funasr 1.4.16 (PyPI wheel): funasr/models/fun_asr_nano/model.py builds `ctc_decoder`
from the adaptor table's Transformer class (funasr/models/llm_asr/adaptor.py: linear1 [ffn_dim,
encoder_dim * downsample_rate], linear2 [llm_dim, ffn_dim], `blocks` of funasr/models/transformer/encoder.py
EncoderLayer(llm_dim) with MultiHeadedAttention linear_q/k/v/out and PositionwiseFeedForward
w_1 [llm_dim // 4, llm_dim], w_2, norm1, norm2) and `ctc` from funasr/models/fun_asr_nano/ctc.py
(ctc_lo [ctc_vocab_size, encoder output size]); blank_id defaults to ctc_vocab_size - 1. The vocabulary's
special tokens follow funasr/models/sense_voice/whisper_lib/tokenizer.py get_encoding: 1,679 after the ranks.
"""
from __future__ import annotations

import argparse
import base64
import collections
from pathlib import Path

# endoftext, startoftranscript, 105 languages, 11 events, 4 emotions, 6 task tokens, 50 spare, 1501 times
N_SPECIAL = 1679
WORDS = ["the", " the", " and", " of", "ing", " to", "er", " a", " is", "你好", "世界", "我们", "的", "是",
         "こんにちは", " hello", " world"]


def vocabulary_text(words=WORDS) -> str:
    """256 byte ranks, then each word's prefixes as merges: a tiktoken file FunASR's reader takes."""
    ranks = {bytes([b]): b for b in range(256)}
    for word in words:
        data = word.encode("utf-8")
        for end in range(2, len(data) + 1):
            ranks.setdefault(data[:end], len(ranks))
    return "".join(f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in ranks.items())


def random_state(encoder_dim: int, ffn_dim: int, layers: int, vocab_size: int, seed: int):
    """FunASR's ctc_decoder.* and ctc.ctc_lo.* tensors (BF16, as the published model.pt), random."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    h, inner = encoder_dim, encoder_dim // 4
    state = collections.OrderedDict()
    state["ctc_decoder.linear1.weight"], state["ctc_decoder.linear1.bias"] = rand(ffn_dim, h), rand(ffn_dim)
    state["ctc_decoder.linear2.weight"], state["ctc_decoder.linear2.bias"] = rand(h, ffn_dim), rand(h)
    for i in range(layers):
        p = f"ctc_decoder.blocks.{i}."
        for proj in ("linear_q", "linear_k", "linear_v", "linear_out"):
            state[f"{p}self_attn.{proj}.weight"], state[f"{p}self_attn.{proj}.bias"] = rand(h, h), rand(h)
        state[f"{p}feed_forward.w_1.weight"], state[f"{p}feed_forward.w_1.bias"] = rand(inner, h), rand(inner)
        state[f"{p}feed_forward.w_2.weight"], state[f"{p}feed_forward.w_2.bias"] = rand(h, inner), rand(h)
        for norm in ("norm1", "norm2"):
            state[f"{p}{norm}.weight"], state[f"{p}{norm}.bias"] = 1 + rand(h, scale=0.1), rand(h, scale=0.1)
    state["ctc.ctc_lo.weight"], state["ctc.ctc_lo.bias"] = rand(vocab_size, h, scale=1.0), rand(vocab_size)
    return state


def config_yaml_lines(encoder_dim: int, ffn_dim: int, layers: int, heads: int, vocab_size: int) -> str:
    return "\n".join(["ctc_decoder: Transformer", "ctc_decoder_conf:", "  downsample_rate: 1",
                      f"  ffn_dim: {ffn_dim}", f"  llm_dim: {encoder_dim}", f"  encoder_dim: {encoder_dim}",
                      f"  n_layer: {layers}", f"  attention_heads: {heads}", f"ctc_vocab_size: {vocab_size}",
                      "ctc_conf:", "  dropout_rate: 0.0", "dataset_conf:",
                      "  ctc_tokenizer: SenseVoiceTokenizer",
                      "  ctc_tokenizer_conf:", "    vocab_path: null", "    is_multilingual: true",
                      "    num_languages: 8749", ""])


def write(funasr_dir, seed: int = 0, ffn_dim: int = 48, layers: int = 2, heads: int = 4) -> Path:
    """Adds the branch to `funasr_dir` (model.pt, config.yaml); writes multilingual.tiktoken beside them."""
    import torch

    folder = Path(funasr_dir)
    saved = torch.load(folder / "model.pt")
    state = saved.get("state_dict", saved)
    encoder_dim = state["audio_encoder.after_norm.weight"].shape[0]
    vocab = vocabulary_text()
    vocab_size = len(vocab.splitlines()) + N_SPECIAL
    state.update(random_state(encoder_dim, ffn_dim, layers, vocab_size, seed))
    torch.save(saved, folder / "model.pt")
    (folder / "multilingual.tiktoken").write_text(vocab, encoding="ascii")
    yaml_text = (folder / "config.yaml").read_text(encoding="utf-8")
    (folder / "config.yaml").write_text(yaml_text + config_yaml_lines(encoder_dim, ffn_dim, layers, heads,
                                                                      vocab_size), encoding="utf-8")
    return folder


# --- the torch reference ---------------------------------------------------------------------------------

def _block(x, state: dict, p: str, heads: int):
    """funasr/models/transformer/encoder.py EncoderLayer, normalize_before: LayerNorm eps 1e-12, attention
    scores scaled by 1/sqrt(d_k), ReLU feed-forward."""
    import torch
    import torch.nn.functional as F

    w = lambda name: state[p + name].float()  # noqa: E731
    h = F.layer_norm(x, x.shape[-1:], w("norm1.weight"), w("norm1.bias"), 1e-12)
    t, d = h.shape[1], h.shape[2]
    split = lambda y: y.view(1, t, heads, d // heads).transpose(1, 2)  # noqa: E731
    q, k, v = (split(F.linear(h, w(f"self_attn.linear_{n}.weight"), w(f"self_attn.linear_{n}.bias")))
               for n in "qkv")
    scores = torch.matmul(q, k.transpose(-2, -1)) / (d // heads) ** 0.5
    context = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(1, t, d)
    x = x + F.linear(context, w("self_attn.linear_out.weight"), w("self_attn.linear_out.bias"))
    h = F.layer_norm(x, x.shape[-1:], w("norm2.weight"), w("norm2.bias"), 1e-12)
    hidden = torch.relu(F.linear(h, w("feed_forward.w_1.weight"), w("feed_forward.w_1.bias")))
    return x + F.linear(hidden, w("feed_forward.w_2.weight"), w("feed_forward.w_2.bias"))


def log_probs(encoder_out, state: dict, layers: int, heads: int):  # [T, D] -> [T, vocab] (numpy)
    """FunASR's inference_llm: ctc_decoder (Transformer, downsample_rate 1), then ctc.log_softmax; float32."""
    import torch
    import torch.nn.functional as F

    w = lambda name: state[name].float()  # noqa: E731
    x = torch.as_tensor(encoder_out, dtype=torch.float32)[None]
    x = torch.relu(F.linear(x, w("ctc_decoder.linear1.weight"), w("ctc_decoder.linear1.bias")))
    x = F.linear(x, w("ctc_decoder.linear2.weight"), w("ctc_decoder.linear2.bias"))
    for i in range(layers):
        x = _block(x, state, f"ctc_decoder.blocks.{i}.", heads)
    logits = F.linear(x, w("ctc.ctc_lo.weight"), w("ctc.ctc_lo.bias"))
    return F.log_softmax(logits, dim=2)[0].numpy()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("funasr_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write(args.funasr_dir, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
