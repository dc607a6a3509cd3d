"""A Transformers-layout checkpoint as CrispASR's `funasr` GGUF, written as its converter does it.

    python -m tools.reference.crispasr CHECKPOINT_DIR OUT.gguf [--ada-n-heads N]

Follows CrispStrobe/CrispASR models/convert-funasr-to-gguf.py (commit 72d3c38, 2026-08-22) on the FunASR
folder that tools/reference/funasr_checkpoint.py writes: encoder blocks numbered 0..N-1 (`funasr.enc.blk.L`,
L = 0 for encoders0, then encoders, then tp_encoders), the FSMN kernel squeezed to (D, K), the adaptor under
`funasr.adaptor.*`, the decoder under llama.cpp's names with `output.weight` written out; F16 for every
tensor of two or more dimensions except norms, F32 for the rest; the token list from tokenizer.json ("" for
ids no token has), merges, no token types. The script writes the full model's hyperparameters as constants
(and loops over 70 encoder blocks); here the same keys take this checkpoint's values. `--ada-n-heads 16`
writes the head count early conversions carried.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tools.lib.gguf_file import finish
from tools.reference.funasr_checkpoint import funasr_state_dict

ENCODER = [("norm1.w", "norm1.weight"), ("norm1.b", "norm1.bias"), ("norm2.w", "norm2.weight"),
           ("norm2.b", "norm2.bias"), ("attn.qkv.w", "self_attn.linear_q_k_v.weight"),
           ("attn.qkv.b", "self_attn.linear_q_k_v.bias"), ("attn.out.w", "self_attn.linear_out.weight"),
           ("attn.out.b", "self_attn.linear_out.bias"), ("attn.fsmn.w", "self_attn.fsmn_block.weight"),
           ("ffn.l1.w", "feed_forward.w_1.weight"), ("ffn.l1.b", "feed_forward.w_1.bias"),
           ("ffn.l2.w", "feed_forward.w_2.weight"), ("ffn.l2.b", "feed_forward.w_2.bias")]
ADAPTOR = [("norm1.w", "norm1.weight"), ("norm1.b", "norm1.bias"), ("norm2.w", "norm2.weight"),
           ("norm2.b", "norm2.bias")] + [
    (f"attn.{ours}.{k[0]}", f"self_attn.linear_{theirs}.{k}")
    for ours, theirs in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "out")) for k in ("weight", "bias")] + [
    ("ffn.l1.w", "feed_forward.w_1.weight"), ("ffn.l1.b", "feed_forward.w_1.bias"),
    ("ffn.l2.w", "feed_forward.w_2.weight"), ("ffn.l2.b", "feed_forward.w_2.bias")]

LLM_DIRECT = {"llm.model.embed_tokens.weight": "token_embd.weight",
              "llm.model.norm.weight": "output_norm.weight", "llm.lm_head.weight": "output.weight"}
LLM_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def llm_name(name: str) -> str:
    """remap_llm: FunASR's llm.* name -> llama.cpp's."""
    if name in LLM_DIRECT:
        return LLM_DIRECT[name]
    layer, sub = name[len("llm.model.layers."):].split(".", 1)
    return f"blk.{layer}.{LLM_LAYER[sub.rsplit('.', 1)[0]]}.weight"


def _block(layer: int, n_main: int) -> str:
    if layer == 0:
        return "audio_encoder.encoders0.0"
    if layer < n_main:
        return f"audio_encoder.encoders.{layer - 1}"
    return f"audio_encoder.tp_encoders.{layer - n_main}"


def _metadata(w, config: dict, ada_n_heads: int | None) -> None:
    a, p, t = config["audio_config"], config["adaptor_config"], config["text_config"]
    n_tp = a["num_timestamp_prediction_layers"]
    for key, value in {"n_mels": a["num_mel_bins"], "lfr_m": a["num_stacked_frames"], "lfr_n": 6,
                       "sample_rate": 16000, "frame_length_ms": 25, "frame_shift_ms": 10,
                       "d_model": a["hidden_size"], "n_heads": a["num_attention_heads"],
                       "ffn_dim": a["intermediate_size"], "n_blocks_base": a["num_hidden_layers"] - n_tp,
                       "n_blocks_tp": n_tp, "sanm_kernel": a["fsmn_kernel_size"],
                       "ada_d_in": a["hidden_size"], "ada_ffn": p["projector_hidden_size"],
                       "ada_d_out": p["hidden_size"], "ada_n_layers": p["num_hidden_layers"],
                       "ada_n_heads": ada_n_heads or p["num_attention_heads"],
                       "ada_ffn_inner": p["intermediate_size"]}.items():
        w.add_uint32(f"funasr.{key}", int(value))
    w.add_bool("funasr.use_low_frame_rate", True)
    for key, value in {"n_layers": t["num_hidden_layers"], "d_model": t["hidden_size"],
                       "n_heads": t["num_attention_heads"], "n_kv_heads": t["num_key_value_heads"],
                       "head_dim": t["head_dim"], "ff_dim": t["intermediate_size"]}.items():
        w.add_uint32(f"funasr.llm.{key}", int(value))
    w.add_float32("funasr.llm.rope_theta", float(t["rope_parameters"]["rope_theta"]))
    w.add_float32("funasr.llm.rms_norm_eps", float(t["rms_norm_eps"]))
    w.add_uint32("funasr.llm.vocab_size", int(t["vocab_size"]))
    w.add_uint32("funasr.llm.max_pos", int(t["max_position_embeddings"]))


def _vocabulary(w, tokenizer: dict) -> None:
    vocab = tokenizer["model"]["vocab"]
    tokens = [None] * (max(vocab.values()) + 1)
    for token, i in vocab.items():
        tokens[i] = token
    for added in tokenizer.get("added_tokens", []):
        tokens.extend([None] * (added["id"] - len(tokens) + 1))
        tokens[added["id"]] = added["content"]
    w.add_tokenizer_model("gpt2")
    w.add_token_list([t if t is not None else "" for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tokenizer["model"]["merges"]])
    ids = {a["content"]: a["id"] for a in tokenizer.get("added_tokens", [])}
    for token, key in (("<|startofspeech|>", "audio_start_token_id"),
                       ("<|endofspeech|>", "audio_end_token_id")):
        if token in ids:
            w.add_uint32(f"funasr.{key}", ids[token])


def write(checkpoint_dir, out, ada_n_heads: int | None = None) -> Path:
    """CrispASR's F16 GGUF of the Transformers-layout checkpoint in `checkpoint_dir`."""
    import gguf
    import numpy as np
    from safetensors.torch import load_file

    src, out = Path(checkpoint_dir), Path(out)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    sd = funasr_state_dict(load_file(str(src / "model.safetensors")), config)
    w = gguf.GGUFWriter(str(out), "funasr")
    _metadata(w, config, ada_n_heads)
    _vocabulary(w, json.loads((src / "tokenizer.json").read_text(encoding="utf-8")))

    def add(name: str, t, force_f32: bool = False) -> None:
        arr = t.detach().float().numpy()
        if arr.ndim == 3 and arr.shape[1] == 1:  # the FSMN kernel
            arr = arr.squeeze(1)
        dtype = np.float16 if (not force_f32 and arr.ndim >= 2) else np.float32
        w.add_tensor(name, np.ascontiguousarray(arr.astype(dtype)))

    a = config["audio_config"]
    n_main = a["num_hidden_layers"] - a["num_timestamp_prediction_layers"]
    for layer in range(a["num_hidden_layers"]):
        for ours, theirs in ENCODER:
            add(f"funasr.enc.blk.{layer}.{ours}", sd[f"{_block(layer, n_main)}.{theirs}"],
                force_f32=ours.startswith("norm") or ours.endswith(".b"))
    for norm in ("after_norm", "tp_norm"):
        for k in ("w", "b"):
            kind = "weight" if k == "w" else "bias"
            add(f"funasr.enc.{norm}.{k}", sd[f"audio_encoder.{norm}.{kind}"], True)
    for n in (1, 2):
        add(f"funasr.adaptor.linear{n}.w", sd[f"audio_adaptor.linear{n}.weight"])
        add(f"funasr.adaptor.linear{n}.b", sd[f"audio_adaptor.linear{n}.bias"], True)
    for layer in range(config["adaptor_config"]["num_hidden_layers"]):
        for ours, theirs in ADAPTOR:
            add(f"funasr.adaptor.blk.{layer}.{ours}", sd[f"audio_adaptor.blocks.{layer}.{theirs}"],
                force_f32=ours.startswith("norm") or ours.endswith(".b"))
    for name in sorted(k for k in sd if k.startswith("llm.")):
        ours = llm_name(name)
        add(ours, sd[name], force_f32="norm" in ours or ours.endswith(".bias"))
    finish(w)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir")
    parser.add_argument("out")
    parser.add_argument("--ada-n-heads", type=int,
                        help="the adaptor head count to state (default: the true one)")
    args = parser.parse_args(argv)
    print(write(args.checkpoint_dir, args.out, args.ada_n_heads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
