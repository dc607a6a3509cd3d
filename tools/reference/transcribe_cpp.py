"""A Transformers-layout checkpoint as transcribe.cpp's `funasr_nano` GGUF, written as its converter does it.

    python -m tools.reference.transcribe_cpp CHECKPOINT_DIR OUT.gguf [--variant fun-asr-nano-2512]

Follows handy-computer/transcribe.cpp scripts/convert-funasr_nano.py (commit ea077b8, 2026-08-20) on the
FunASR folder that tools/reference/funasr_checkpoint.py writes: the model.pt names renamed by its ENC/ADAPTOR/
LLM tables, every tensor through float32 into BF16 except biases, norms and FSMN kernels (F32), the LM head
dropped as a copy of the embeddings, the stt.funasr_nano / stt.frontend keys from config.yaml and the Qwen3
config, and the vocabulary from vocab.json, merges.txt and tokenizer_config.json's added_tokens_decoder
(ids no token has become `<|unused_{i}|>`). The script writes the adaptor's head count as the constant 8;
here it is this checkpoint's value, so the tiny model is described truly.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tools.lib.gguf_file import finish
from tools.reference.funasr_checkpoint import funasr_state_dict

ENCODER = ["self_attn.linear_q_k_v.weight", "self_attn.linear_q_k_v.bias", "self_attn.linear_out.weight",
           "self_attn.linear_out.bias", "self_attn.fsmn_block.weight", "feed_forward.w_1.weight",
           "feed_forward.w_1.bias", "feed_forward.w_2.weight", "feed_forward.w_2.bias", "norm1.weight",
           "norm1.bias", "norm2.weight", "norm2.bias"]
ADAPTOR = ["self_attn.linear_q.weight", "self_attn.linear_q.bias", "self_attn.linear_k.weight",
           "self_attn.linear_k.bias", "self_attn.linear_v.weight", "self_attn.linear_v.bias",
           "self_attn.linear_out.weight", "self_attn.linear_out.bias", "feed_forward.w_1.weight",
           "feed_forward.w_1.bias", "feed_forward.w_2.weight", "feed_forward.w_2.bias", "norm1.weight",
           "norm1.bias", "norm2.weight", "norm2.bias"]
DECODER = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
           "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
           "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight",
           "mlp.up_proj.weight", "mlp.down_proj.weight"]
RENAMES = [  # model.pt sublayer -> transcribe.cpp sublayer, first match wins
    ("self_attn.linear_q_k_v.", "attn.qkv."),
    ("self_attn.linear_out.", "attn.out."),
    ("self_attn.fsmn_block.", "attn.fsmn."),
    ("feed_forward.w_1.", "ffn.fc1."),
    ("feed_forward.w_2.", "ffn.fc2."),
    ("self_attn.linear_q.", "attn.q."),
    ("self_attn.linear_k.", "attn.k."),
    ("self_attn.linear_v.", "attn.v."),
    ("norm1.", "norm_attn."),
    ("norm2.", "norm_ffn."),
    ("post_attention_layernorm.", "norm_ffn."),
    ("input_layernorm.", "norm_attn."),
    ("self_attn.q_proj.", "attn.q."),
    ("self_attn.k_proj.", "attn.k."),
    ("self_attn.v_proj.", "attn.v."),
    ("self_attn.o_proj.", "attn.o."),
    ("self_attn.q_norm.", "attn.q_norm."),
    ("self_attn.k_norm.", "attn.k_norm."),
    ("mlp.gate_proj.", "ffn.gate."),
    ("mlp.up_proj.", "ffn.up."),
    ("mlp.down_proj.", "ffn.down."),
]
LANGUAGES = {  # the converter's VARIANT_LANGUAGES
    "fun-asr-nano-2512": ["zh", "en", "ja"],
    "fun-asr-mlt-nano-2512": ["zh", "en", "yue", "ja", "ko", "vi", "id", "th", "ms", "tl", "ar", "hi",
                              "bg", "hr", "cs", "da", "nl", "et", "fi", "el", "hu", "ga", "lv", "lt", "mt",
                              "pl", "pt", "ro", "sk", "sl", "sv"],
}
F32_SUFFIXES = (".bias", ".norm_attn.weight", ".norm_ffn.weight", ".after_norm.weight", ".tp_norm.weight",
                ".output_norm.weight", ".q_norm.weight", ".k_norm.weight", ".attn.fsmn.weight")


def _renamed(suffix: str) -> str:
    for old, new in RENAMES:
        if suffix.startswith(old):
            return new + suffix[len(old):]
    raise KeyError(suffix)


def tensor_pairs(config: dict) -> list[tuple[str, str]]:
    """(model.pt name, GGUF name) in the converter's order."""
    a, p, t = config["audio_config"], config["adaptor_config"], config["text_config"]
    n_main = a["num_hidden_layers"] - a["num_timestamp_prediction_layers"]
    pairs = [(f"audio_encoder.encoders0.0.{s}", f"enc.encoders0.0.{_renamed(s)}") for s in ENCODER]
    for i in range(n_main - 1):
        pairs += [(f"audio_encoder.encoders.{i}.{s}", f"enc.encoders.{i}.{_renamed(s)}") for s in ENCODER]
    pairs += [(f"audio_encoder.after_norm.{k}", f"enc.after_norm.{k}") for k in ("weight", "bias")]
    for i in range(a["num_timestamp_prediction_layers"]):
        pairs += [(f"audio_encoder.tp_encoders.{i}.{s}", f"enc.tp_encoders.{i}.{_renamed(s)}")
                  for s in ENCODER]
    pairs += [(f"audio_encoder.tp_norm.{k}", f"enc.tp_norm.{k}") for k in ("weight", "bias")]
    pairs += [(f"audio_adaptor.linear{n}.{k}", f"adaptor.linear{n}.{k}")
              for n in (1, 2) for k in ("weight", "bias")]
    for i in range(p["num_hidden_layers"]):
        pairs += [(f"audio_adaptor.blocks.{i}.{s}", f"adaptor.blocks.{i}.{_renamed(s)}") for s in ADAPTOR]
    pairs += [("llm.model.embed_tokens.weight", "dec.token_embd.weight"),
              ("llm.model.norm.weight", "dec.output_norm.weight")]
    for i in range(t["num_hidden_layers"]):
        pairs += [(f"llm.model.layers.{i}.{s}", f"dec.layers.{i}.{_renamed(s)}") for s in DECODER]
    return pairs


def _vocab(tokenizer: dict, tokenizer_config: dict, vocab_size: int) -> dict:
    """extract_tokenizer: vocab.json and merges.txt (the tokenizer.json model's vocab and merges, as the Hub
    folder holds them), added_tokens_decoder, special ids from tokenizer_config.json."""
    import gguf

    base = tokenizer["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    added = tokenizer_config.get("added_tokens_decoder", {})
    by_id = {int(i): (t, False) for t, i in base.items()}
    by_id.update({int(i): (info["content"], bool(info.get("special", False))) for i, info in added.items()})
    tokens = [by_id.get(i, (f"<|unused_{i}|>", False))[0] for i in range(vocab_size)]
    types = [int(gguf.TokenType.CONTROL if by_id.get(i, ("", False))[1] else gguf.TokenType.NORMAL)
             for i in range(vocab_size)]

    def token_id(field: str) -> int | None:
        token = tokenizer_config.get(field)
        token = token.get("content") if isinstance(token, dict) else token
        if not token:
            return None
        if token in base:
            return base[token]
        return next((int(i) for i, info in added.items() if info["content"] == token), None)

    return {"tokens": tokens, "types": types, "merges": merges, "bos": token_id("bos_token"),
            "eos": token_id("eos_token"), "pad": token_id("pad_token"),
            "chat_template": tokenizer_config.get("chat_template")}


def qwen_tokenizer_config(tokenizer: dict, tokenizer_config: dict) -> dict:
    """tokenizer_config.json as the Qwen3-0.6B folder has it: added_tokens_decoder and the special roles."""
    fields = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    added = {str(t["id"]): {k: t[k] for k in fields} for t in tokenizer["added_tokens"]}
    return dict(tokenizer_config, added_tokens_decoder=added, bos_token=None, eos_token="<|im_end|>",
                pad_token="<|endoftext|>")


def _add_metadata(w, config: dict, state: dict, variant: str) -> None:
    a, p, t = config["audio_config"], config["adaptor_config"], config["text_config"]
    w.add_string("stt.variant", variant)
    w.add_array("general.languages", LANGUAGES[variant])
    n_tp = a["num_timestamp_prediction_layers"]
    for key, value in [("encoder.n_blocks", a["num_hidden_layers"] - n_tp), ("encoder.tp_blocks", n_tp),
                       ("encoder.d_model", a["hidden_size"]),
                       ("encoder.d_input", a["num_mel_bins"] * a["num_stacked_frames"]),
                       ("encoder.n_heads", a["num_attention_heads"]),
                       ("encoder.d_ff", a["intermediate_size"]),
                       ("encoder.kernel_size", a["fsmn_kernel_size"]), ("encoder.sanm_shift", 0)]:
        w.add_uint32(f"stt.funasr_nano.{key}", value)
    w.add_string("stt.funasr_nano.encoder.attention_type", "sanm")
    w.add_bool("stt.funasr_nano.encoder.normalize_before", True)
    q = state["audio_adaptor.blocks.0.self_attn.linear_q.weight"]
    for key, value in [("n_blocks", p["num_hidden_layers"]), ("encoder_dim", a["hidden_size"]),
                       ("llm_dim", p["hidden_size"]),
                       ("pre_ffn_dim", state["audio_adaptor.linear1.weight"].shape[0]),
                       ("block_ffn_dim", state["audio_adaptor.blocks.0.feed_forward.w_1.weight"].shape[0]),
                       ("n_heads", p["num_attention_heads"]),
                       ("d_head", q.shape[0] // p["num_attention_heads"])]:
        w.add_uint32(f"stt.funasr_nano.adaptor.{key}", int(value))
    w.add_float32("stt.funasr_nano.adaptor.layer_norm_eps", 1e-12)
    w.add_string("stt.funasr_nano.adaptor.activation", "relu")
    w.add_uint32("stt.funasr_nano.adaptor.downsample_rate", 1)
    w.add_bool("stt.funasr_nano.adaptor.use_low_frame_rate", True)
    for key, value in [("n_layers", t["num_hidden_layers"]), ("hidden_size", t["hidden_size"]),
                       ("intermediate_size", t["intermediate_size"]), ("n_heads", t["num_attention_heads"]),
                       ("n_kv_heads", t["num_key_value_heads"]), ("head_dim", t["head_dim"]),
                       ("vocab_size", t["vocab_size"]),
                       ("max_position_embeddings", t["max_position_embeddings"])]:
        w.add_uint32(f"stt.funasr_nano.decoder.{key}", value)
    w.add_float32("stt.funasr_nano.decoder.rms_norm_eps", t["rms_norm_eps"])
    w.add_float32("stt.funasr_nano.decoder.rope_theta", t["rope_parameters"]["rope_theta"])
    w.add_bool("stt.funasr_nano.decoder.tie_word_embeddings", True)
    w.add_string("stt.funasr_nano.decoder.activation", t.get("hidden_act", "silu"))
    _add_frontend(w, a)


def _add_frontend(w, a: dict) -> None:
    for key, value in [("type", "kaldi_fbank_lfr"), ("window", "hamming"), ("normalize", "none"),
                       ("fbank_style", "kaldi_htk")]:
        w.add_string(f"stt.frontend.{key}", value)
    for key, value in [("num_mels", a["num_mel_bins"]), ("sample_rate", 16000), ("n_fft", 400),
                       ("win_length", 400), ("hop_length", 160), ("lfr_m", a["num_stacked_frames"]),
                       ("lfr_n", 6)]:
        w.add_uint32(f"stt.frontend.{key}", value)
    w.add_float32("stt.frontend.dither", 0.0)
    for key, value in [("upscale_samples", True), ("snip_edges", True), ("apply_cmvn", False)]:
        w.add_bool(f"stt.frontend.{key}", value)


def write(checkpoint_dir, out, variant: str = "fun-asr-nano-2512") -> Path:
    """transcribe.cpp's BF16 GGUF of the Transformers-layout checkpoint in `checkpoint_dir`."""
    import gguf
    import numpy as np
    import torch
    from safetensors.torch import load_file

    src, out = Path(checkpoint_dir), Path(out)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    tokenizer = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    raw_config = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    tokenizer_config = qwen_tokenizer_config(tokenizer, raw_config)
    state = funasr_state_dict(load_file(str(src / "model.safetensors")), config)
    vocab = _vocab(tokenizer, tokenizer_config, config["text_config"]["vocab_size"])
    w = gguf.GGUFWriter(str(out), "funasr_nano")
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_BF16))
    _add_metadata(w, config, state, variant)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", vocab["tokens"])
    w.add_array("tokenizer.ggml.token_type", vocab["types"])
    w.add_array("tokenizer.ggml.merges", vocab["merges"])
    for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id")):
        if vocab[role] is not None:
            w.add_uint32(f"tokenizer.ggml.{key}", vocab[role])
    if vocab["chat_template"]:
        w.add_string("tokenizer.chat_template", vocab["chat_template"])
    for name, ours in tensor_pairs(config):
        arr = np.ascontiguousarray(state[name].detach().to(torch.float32).numpy())
        if ours.endswith(F32_SUFFIXES):
            w.add_tensor(ours, arr)
        else:
            bf16 = gguf.GGMLQuantizationType.BF16
            w.add_tensor(ours, gguf.quants.quantize(arr, bf16), raw_dtype=bf16)
    finish(w)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir")
    parser.add_argument("out")
    parser.add_argument("--variant", default="fun-asr-nano-2512", choices=sorted(LANGUAGES))
    args = parser.parse_args(argv)
    print(write(args.checkpoint_dir, args.out, args.variant))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
