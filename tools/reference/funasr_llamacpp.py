"""A Transformers-layout checkpoint as the two files of FunASR's llama.cpp runtime, as its converters do it.

    python -m tools.reference.funasr_llamacpp CHECKPOINT_DIR OUT_DIR [--wtype f32|f16|q8_0]
                                              [--outtype f32|bf16]

OUT_DIR/funasr-encoder.gguf follows modelscope/FunASR runtime/llama.cpp/fun-asr-nano/export_encoder_gguf.py
(commit 3c58cb5, 2026-08-21): the model.pt state dict's audio_encoder.* and audio_adaptor.* tensors under
their own names as float32, each FSMN kernel (D, 1, K) stored as (K, D), 2-D non-norm matrices as F16 with
`--wtype f16` or as Q8_0 (gguf.quants) with `--wtype q8_0` where the row length is a multiple of 32, and the
funasr.enc/adp/frontend keys. The script writes the full model's values as constants; here the same keys
take this checkpoint's values, so the tiny model is described truly.

OUT_DIR/qwen3.gguf follows llama.cpp's convert_hf_to_gguf.py (as vendored in llama-cpp-python 0.3.36:
conversion/qwen.py Qwen3Model, conversion/base.py TextModel) run on the decoder as a Qwen3ForCausalLM folder:
tensor names from gguf.TensorNameMap, the hyperparameters TextModel.set_gguf_parameters writes, the
vocabulary as get_vocab_base builds it (every id below vocab_size, `[PAD{i}]` where no token has it) with
gguf.SpecialVocab's merges, special ids and chat template.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from tools.lib.gguf_file import finish
from tools.reference.funasr_checkpoint import funasr_state_dict, qwen_config

ENCODER_FILE, DECODER_FILE = "funasr-encoder.gguf", "qwen3.gguf"


def encoder_metadata(config: dict) -> dict[str, int]:
    a, p = config["audio_config"], config["adaptor_config"]
    return {
        "funasr.enc.input_size": a["num_stacked_frames"] * a["num_mel_bins"],
        "funasr.enc.output_size": a["hidden_size"],
        "funasr.enc.attention_heads": a["num_attention_heads"],
        "funasr.enc.linear_units": a["intermediate_size"],
        "funasr.enc.num_blocks": a["num_hidden_layers"] - a["num_timestamp_prediction_layers"],
        "funasr.enc.tp_blocks": a["num_timestamp_prediction_layers"],
        "funasr.enc.kernel_size": a["fsmn_kernel_size"],
        "funasr.enc.sanm_shfit": 0,
        "funasr.adp.llm_dim": p["hidden_size"],
        "funasr.adp.encoder_dim": a["hidden_size"],
        "funasr.adp.ffn_dim": p["projector_hidden_size"],
        "funasr.adp.n_layer": p["num_hidden_layers"],
        "funasr.adp.attention_heads": p["num_attention_heads"],
        "funasr.adp.downsample_rate": 1,
        "funasr.frontend.n_mels": a["num_mel_bins"],
        "funasr.frontend.lfr_m": a["num_stacked_frames"],
        "funasr.frontend.lfr_n": 6,
    }


def write_encoder(state: dict, metadata: dict[str, int], out: Path, wtype: str = "f32") -> Path:
    import gguf
    import numpy as np
    import torch

    w = gguf.GGUFWriter(str(out), "funasr-sensevoice-encoder")
    for key, value in metadata.items():
        w.add_uint32(key, value)
    for name, t in state.items():
        if not name.startswith(("audio_encoder.", "audio_adaptor.")):
            continue
        arr = t.detach().to(torch.float32).contiguous().numpy()
        if name.endswith("fsmn_block.weight"):
            arr = np.ascontiguousarray(arr[:, 0, :].T)
        elif wtype == "f16" and arr.ndim == 2 and "norm" not in name:
            arr = arr.astype(np.float16)
        if (wtype == "q8_0" and arr.ndim == 2 and "norm" not in name and "fsmn_block" not in name
                and arr.shape[1] % 32 == 0):
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(arr, q8), raw_dtype=q8)
        else:
            w.add_tensor(name, arr)
    finish(w)
    return out


def _qwen3_folder(logical: dict, config: dict, src: Path, out: Path) -> Path:
    """The decoder as a Transformers Qwen3ForCausalLM folder (what convert_hf_to_gguf.py reads)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    prefix = "model.language_model."
    decoder = {"model." + k[len(prefix):]: v.contiguous() for k, v in logical.items() if k.startswith(prefix)}
    save_file(decoder, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(qwen_config(config), indent=2), encoding="utf-8")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, out / name)
    return out


def _looks_special(token: str) -> bool:
    return token.startswith("<|") and token.endswith("|>")  # does_token_look_special's rule for such tokens


def _vocab(folder: Path, vocab_size: int) -> tuple[list[str], list[int]]:
    """get_vocab_base: one entry per id below vocab_size; added tokens normalised by a round trip when the
    tokenizer does not normalise them, CONTROL when special or special-looking, else USER_DEFINED."""
    import gguf
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    reverse = {i: t for t, i in tokenizer.vocab.items()}
    added, decoder = tokenizer.get_added_vocab(), tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token, kind = reverse[i], gguf.TokenType.NORMAL
        if token in added:
            if not decoder[i].normalized:
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            special = decoder[i].special or _looks_special(token)
            kind = gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED
        tokens.append(token)
        types.append(kind)
    return tokens, types


def write_decoder(folder: Path, out: Path, outtype: str = "f32") -> Path:
    import gguf
    import torch
    from safetensors.torch import load_file

    hp = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    w = gguf.GGUFWriter(str(out), "qwen3")
    w.add_block_count(hp["num_hidden_layers"])
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(hp["num_key_value_heads"])
    w.add_rope_freq_base(hp["rope_theta"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if outtype == "f32" else gguf.LlamaFileType.MOSTLY_BF16)
    tokens, types = _vocab(folder, hp["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=True).add_to_gguf(w)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, hp["num_hidden_layers"])
    for name, t in load_file(str(folder / "model.safetensors")).items():
        new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if outtype == "bf16" and t.ndim == 2:  # norms stay float32, as the converter keeps 1-D tensors
            w.add_tensor(new_name, t.view(torch.int16).numpy().view("uint16"),
                         raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(new_name, t.to(torch.float32).numpy())
    finish(w)
    return out


def write(checkpoint_dir, out_dir, wtype: str = "f32", outtype: str = "f32") -> Path:
    """OUT_DIR with funasr-encoder.gguf and qwen3.gguf for the checkpoint in `checkpoint_dir`."""
    from safetensors.torch import load_file

    src, out = Path(checkpoint_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    logical = load_file(str(src / "model.safetensors"))
    write_encoder(funasr_state_dict(logical, config), encoder_metadata(config), out / ENCODER_FILE, wtype)
    write_decoder(_qwen3_folder(logical, config, src, out / "Qwen3-0.6B"), out / DECODER_FILE, outtype)
    shutil.rmtree(out / "Qwen3-0.6B")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--wtype", default="f32", choices=["f32", "f16", "q8_0"])
    parser.add_argument("--outtype", default="f32", choices=["f32", "bf16"])
    args = parser.parse_args(argv)
    print(write(args.checkpoint_dir, args.out_dir, args.wtype, args.outtype))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
