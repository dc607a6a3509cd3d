"""A Transformers-layout checkpoint rewritten as FunASR's own folder, with real torch.save.

    python -m tools.reference.funasr_checkpoint CHECKPOINT_DIR OUT_DIR [--container KEY] [--module-prefix]

Writes OUT_DIR/model.pt, OUT_DIR/config.yaml and OUT_DIR/Qwen3-0.6B/ (config.json, tokenizer.json,
tokenizer_config.json), the layout of FunAudioLLM/Fun-ASR-Nano-2512. Names follow funasr 1.4.16 (PyPI wheel):
funasr/models/sense_voice/model.py (SenseVoiceEncoderSmall: encoders0, encoders, tp_encoders, after_norm,
tp_norm; EncoderLayerSANM: norm1, norm2, feed_forward.w_1/w_2; MultiHeadedAttentionSANM: linear_q_k_v fused
in q, k, v order, linear_out, fsmn_block), funasr/models/llm_asr/adaptor.py (Transformer: linear1, linear2,
blocks with funasr/models/transformer attention linear_q/k/v/out), and funasr/models/fun_asr_nano/model.py
(the LLM as `llm`: llm.model.*, llm.lm_head.weight). The config.yaml keys are those FunASR passes to
SenseVoiceEncoderSmall and the Transformer adaptor (audio_encoder_conf, audio_adaptor_conf, frontend_conf).
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
from pathlib import Path

AUDIO_SUBLAYERS = [("self_attn.o_proj.", "self_attn.linear_out."),
                   ("self_attn.fsmn.conv.", "self_attn.fsmn_block."),
                   ("mlp.fc1.", "feed_forward.w_1."), ("mlp.fc2.", "feed_forward.w_2."),
                   ("input_layernorm.", "norm1."), ("post_attention_layernorm.", "norm2.")]
ADAPTOR_SUBLAYERS = AUDIO_SUBLAYERS + [("self_attn.q_proj.", "self_attn.linear_q."),
                                       ("self_attn.k_proj.", "self_attn.linear_k."),
                                       ("self_attn.v_proj.", "self_attn.linear_v.")]


def _rename(tail: str, pairs) -> str:
    for ours, theirs in pairs:
        tail = tail.replace(ours, theirs)
    return tail


def _audio_block(layer: int, n_main: int) -> str:
    if layer == 0:
        return "audio_encoder.encoders0.0"
    if layer < n_main:
        return f"audio_encoder.encoders.{layer - 1}"
    return f"audio_encoder.tp_encoders.{layer - n_main}"


def funasr_state_dict(logical: dict, config: dict) -> collections.OrderedDict:
    """Logical (Transformers) tensors -> FunASR's names, q/k/v fused, lm_head tied to the embeddings."""
    import torch

    audio = config["audio_config"]
    n_main = audio["num_hidden_layers"] - audio["num_timestamp_prediction_layers"]
    out = collections.OrderedDict()
    for name, t in logical.items():
        m = re.match(r"model\.audio_tower\.layers\.(\d+)\.(.+)$", name)
        if m:
            layer, tail = int(m.group(1)), m.group(2)
            if re.match(r"self_attn\.[kv]_proj\.", tail):
                continue  # fused with q below
            if tail.startswith("final_layernorm."):
                norm = "after_norm" if layer == n_main - 1 else "tp_norm"
                out[f"audio_encoder.{norm}.{tail.split('.')[-1]}"] = t
            elif tail.startswith("self_attn.q_proj."):
                kind = tail.split(".")[-1]
                prefix = f"model.audio_tower.layers.{layer}.self_attn."
                parts = [logical[f"{prefix}{x}_proj.{kind}"] for x in "qkv"]
                out[f"{_audio_block(layer, n_main)}.self_attn.linear_q_k_v.{kind}"] = torch.cat(parts)
            else:
                out[f"{_audio_block(layer, n_main)}.{_rename(tail, AUDIO_SUBLAYERS)}"] = t
        elif name.startswith("model.multi_modal_projector.linear_"):
            out[name.replace("model.multi_modal_projector.linear_", "audio_adaptor.linear")] = t
        elif name.startswith("model.multi_modal_projector.layers."):
            tail = name[len("model.multi_modal_projector.layers."):]
            out["audio_adaptor.blocks." + _rename(tail, ADAPTOR_SUBLAYERS)] = t
        elif name.startswith("model.language_model."):
            out["llm.model." + name[len("model.language_model."):]] = t
    out["llm.lm_head.weight"] = out["llm.model.embed_tokens.weight"]  # the same tensor: one shared storage
    return out


def config_yaml(config: dict) -> str:
    """FunASR's config.yaml for this model: the keys its encoder, adaptor and frontend constructors take."""
    a, p = config["audio_config"], config["adaptor_config"]
    n_tp = a["num_timestamp_prediction_layers"]
    return "\n".join([
        "model: FunASRNano",
        "audio_encoder: SenseVoiceEncoderSmall",
        "audio_encoder_conf:",
        f"  output_size: {a['hidden_size']}",
        f"  attention_heads: {a['num_attention_heads']}",
        f"  linear_units: {a['intermediate_size']}",
        f"  num_blocks: {a['num_hidden_layers'] - n_tp}",
        f"  tp_blocks: {n_tp}",
        f"  kernel_size: {a['fsmn_kernel_size']}",
        "  sanm_shfit: 0",
        "  normalize_before: true",
        "audio_adaptor: Transformer",
        "audio_adaptor_conf:",
        "  downsample_rate: 1",
        "  use_low_frame_rate: true",
        f"  ffn_dim: {p['projector_hidden_size']}",
        f"  llm_dim: {p['hidden_size']}",
        f"  encoder_dim: {a['hidden_size']}",
        f"  n_layer: {p['num_hidden_layers']}",
        f"  attention_heads: {p['num_attention_heads']}",
        "llm: Qwen3-0.6b",
        "llm_conf:",
        "  hub: hf",
        "  llm_dtype: bf16",
        "  init_param_path: Qwen3-0.6B",
        "tokenizer: HuggingfaceTokenizer",
        "tokenizer_conf:",
        "  init_param_path: Qwen3-0.6B",
        "frontend: WavFrontend",
        "frontend_conf:",
        "  fs: 16000",
        "  window: hamming",
        f"  n_mels: {a['num_mel_bins']}",
        "  frame_length: 25",
        "  frame_shift: 10",
        f"  lfr_m: {a['num_stacked_frames']}",
        "  lfr_n: 6",
        "  cmvn_file: null",
        "",
    ])


def qwen_config(config: dict) -> dict:
    """Qwen3-0.6B/config.json as Transformers writes a Qwen3 config (rope_theta at the top)."""
    text = dict(config["text_config"])
    text["rope_theta"] = text.pop("rope_parameters")["rope_theta"]
    return dict(text, architectures=["Qwen3ForCausalLM"], tie_word_embeddings=True)


def write(checkpoint_dir, out_dir, container: str | None = "state_dict", module_prefix: bool = False) -> Path:
    """FunASR's folder for the Transformers-layout checkpoint in `checkpoint_dir` (with its tokenizer)."""
    import torch
    from safetensors.torch import load_file

    src, out = Path(checkpoint_dir), Path(out_dir)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    state = funasr_state_dict(load_file(src / "model.safetensors"), config)
    if module_prefix:  # as DistributedDataParallel saves it
        state = collections.OrderedDict(("module." + k, v) for k, v in state.items())
    qwen = out / "Qwen3-0.6B"
    qwen.mkdir(parents=True, exist_ok=True)
    torch.save({container: state, "step": 0} if container else state, out / "model.pt")
    (out / "config.yaml").write_text(config_yaml(config), encoding="utf-8")
    (qwen / "config.json").write_text(json.dumps(qwen_config(config), indent=2), encoding="utf-8")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, qwen / name)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--container", default="state_dict",
                        help="key the state dict is saved under ('' for none)")
    parser.add_argument("--module-prefix", action="store_true", help="prefix every name with 'module.'")
    args = parser.parse_args(argv)
    print(write(args.checkpoint_dir, args.out_dir, args.container or None, args.module_prefix))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
