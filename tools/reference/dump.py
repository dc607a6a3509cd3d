"""Reference outputs of Transformers' FunAsrNanoForConditionalGeneration for nanoasr's parity tests.

Everything here is independent of nanoasr's model code: features come from kaldi-native-fbank and
Transformers' own LFR, the prompt is rendered from the published template rules, and every tensor
comes from the Transformers modules. The two profiles of DESIGN §2:
- `transformers`: unit-scale audio, every LFR row as an audio token, the native generate() path;
- `funasr`: audio x 32768, adaptor LayerNorm eps 1e-12, the first fake_token_len(T) rows given
  through inputs_embeds.

    python -m tools.reference.dump CHECKPOINT OUT.npz   (the pinned tiny fixture's references)
"""
from __future__ import annotations

import argparse
import os

import numpy as np

SAMPLE_RATE = 16000
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
HOTWORD_HEADER = ("请结合上下文信息，更加准确地完成语音转写任务。如果没有相关信息，我们会留空。\n\n\n"
                  "**上下文信息：**\n\n\n")
LANGUAGE = {"zh": "中文", "en": "英文", "ja": "日文"}
N_LOGITS = 2048  # logits kept per position: a fixed random subset of the vocabulary plus the top 16


def prompt_texts(language=None, itn=True, hotwords=(), context=None) -> tuple[str, str]:
    """(text before the audio slot, text after it), per the FunASR get_prompt / chat template rules."""
    text = ""
    if hotwords or context:
        text = HOTWORD_HEADER + (context + "\n" if context else "")
        if hotwords:
            text += "热词列表：[" + ", ".join(hotwords) + "]\n"
    text += "语音转写" + (f"成{LANGUAGE[language]}" if language else "")
    text += ("" if itn else "，不进行文本规整") + "："
    return SYSTEM + text, SUFFIX


def fake_token_len(t: int) -> int:
    o = 1 + (t - 1) // 2
    o = 1 + (o - 1) // 2
    return (o - 1) // 2 + 1


def knf_fbank(wave: np.ndarray) -> np.ndarray:  # [N] -> [T, 80]
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0
    opts.frame_opts.window_type = "hamming"
    opts.frame_opts.snip_edges = True
    opts.frame_opts.samp_freq = SAMPLE_RATE
    opts.mel_opts.num_bins = 80
    opts.mel_opts.low_freq = 20
    opts.mel_opts.high_freq = 8000
    fb = knf.OnlineFbank(opts)
    fb.accept_waveform(SAMPLE_RATE, wave.astype(np.float32).tolist())
    fb.input_finished()
    return np.array([fb.get_frame(i) for i in range(fb.num_frames_ready)], np.float32)


def features(wave: np.ndarray, reference: str) -> np.ndarray:  # [N] -> [T, 560]
    import torch
    from transformers.models.fun_asr_nano.feature_extraction_fun_asr_nano import FunAsrNanoFeatureExtractor

    scale = 32768.0 if reference == "funasr" else 1.0
    mel = torch.from_numpy(knf_fbank(wave * scale))
    return FunAsrNanoFeatureExtractor()._apply_lfr(mel).numpy()


def load_model(path, reference: str):
    import torch
    from transformers import FunAsrNanoForConditionalGeneration

    model = FunAsrNanoForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    if reference == "funasr":
        # FunASR casts the LLM as funasr 1.4.16 does under the official llm_dtype bf16: to bfloat16 when it is
        # built (funasr/models/fun_asr_nano/model.py, FunASRNano.__init__), back to float32 for fp32 inference
        # (FunASRNano.inference). The round trip leaves the rotary inv_freq buffer rounded to bfloat16.
        model.model.language_model.to(torch.bfloat16).to(torch.float32)
        model.lm_head.to(torch.bfloat16).to(torch.float32)
        for module in model.model.multi_modal_projector.layers.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.eps = 1e-12
    return model


def load_tokenizer(path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"))


def logit_columns(vocab: int, seed: int = 1234) -> np.ndarray:
    return np.sort(np.random.default_rng(seed).choice(vocab, N_LOGITS, replace=False))


def run(model, tokenizer, wave, reference: str, n_new: int, prompt: dict | None = None) -> dict:
    """Stage tensors, prompt ids, prefill/step logits and greedy ids forced to exactly n_new tokens."""
    import torch

    prompt = prompt or {}
    feats = torch.from_numpy(features(wave, reference))[None]  # [1, T, 560]
    mask = torch.ones(feats.shape[:2], dtype=torch.long)
    with torch.no_grad():
        enc = model.model.audio_tower(input_features=feats, input_features_mask=mask).last_hidden_state
        adapted = model.model.multi_modal_projector(enc, mask)  # [1, T, H]
    t = feats.shape[1]
    n = t if reference == "transformers" else fake_token_len(t)
    before, after = prompt_texts(**prompt)
    audio_id = tokenizer.convert_tokens_to_ids("<|object_ref_start|>")
    head = tokenizer.encode(before, add_special_tokens=False)
    ids = head + [audio_id] * n + tokenizer.encode(after, add_special_tokens=False)
    ids_t = torch.tensor([ids])
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids_t)
        embeds[0, len(head):len(head) + n] = adapted[0, :n]
        kwargs = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, num_beams=1,
                      return_dict_in_generate=True, output_logits=True, pad_token_id=151643)
        if reference == "transformers":  # the native path: features in, placeholders scattered by the model
            out = model.generate(input_ids=ids_t, input_features=feats, input_features_mask=mask, **kwargs)
            new = out.sequences[0, len(ids):]
        else:
            out = model.generate(inputs_embeds=embeds, attention_mask=torch.ones_like(ids_t), **kwargs)
            new = out.sequences[0, -n_new:]
        full = torch.cat([embeds, model.get_input_embeddings()(new[None])], dim=1)
        all_logits = model(inputs_embeds=full).logits[0]  # [L + n_new, V]: full-sequence, no cache
    step_logits = torch.stack([s[0] for s in out.logits])  # [n_new, V], from generate's cached steps
    cols = logit_columns(step_logits.shape[1])
    return dict(wave=wave.astype(np.float32), features=feats[0].numpy(), encoder=enc[0].numpy(),
                adaptor=adapted[0].numpy(), prompt_ids=np.array(ids, np.int64), audio_start=len(head),
                greedy_ids=new.numpy().astype(np.int64), logit_columns=cols,
                prefill_logits=step_logits[0].numpy()[cols],
                step_logits=step_logits[:8].numpy()[:, cols],
                full_logits=all_logits[len(ids) - 1:len(ids) + 7].numpy()[:, cols])


# The pinned cases: (name, seconds, synth seed, prompt options); forced to FORCED_TOKENS new tokens.
CASES = (("short", 1.0, 1, {}), ("english_no_itn", 2.7, 2, {"language": "en", "itn": False}),
         ("hotwords", 4.3, 3, {"hotwords": ("nanoasr", "Fun-ASR"), "context": "a project meeting"}))
FORCED_TOKENS = 72


def dump(checkpoint, out_path) -> None:
    from pathlib import Path

    from tools.lib.synth import speech_like

    checkpoint = Path(checkpoint)
    tokenizer = load_tokenizer(checkpoint)
    arrays = {}
    for reference in ("funasr", "transformers"):
        model = load_model(checkpoint, reference)
        for name, seconds, seed, prompt in CASES:
            result = run(model, tokenizer, speech_like(seconds, seed), reference, FORCED_TOKENS, prompt)
            arrays.update({f"{reference}/{name}/{key}": value for key, value in result.items()})
    np.savez_compressed(out_path, **arrays)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="pinned Transformers references for a checkpoint")
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    args = parser.parse_args(argv)
    dump(args.checkpoint, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
