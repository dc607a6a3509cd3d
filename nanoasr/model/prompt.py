"""The transcription prompt (DESIGN §3): chat template text around n audio placeholder tokens.

The text pieces before and after the audio slot are tokenized separately, as the reference does, once per
call (a Template); each segment fills its audio slot.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nanoasr.errors import OptionError

SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
CONTEXT_HEADER = "请结合上下文信息，更加准确地完成语音转写任务。如果没有相关信息，我们会留空。\n\n\n**上下文信息：**\n\n\n"
NO_ITN = "，不进行文本规整"
# Limits on what the user adds to the prompt. Every prompt token is attended to by every decoded token and is
# kept in each batch row's KV cache (about 0.23 MB a token in float32 for Qwen3-0.6B), so past these a prompt
# is a mistake, not a vocabulary: they are far above normal use.
MAX_HOTWORDS = 100  # many hotwords make looping output likely
MAX_HOTWORD_CHARS = 100  # one term or name
MAX_HOTWORDS_CHARS = 4096  # all hotwords together
MAX_CONTEXT_CHARS = 4096  # the server's `prompt` field has the same limit
MAX_PROMPT_TOKENS = 4096  # text tokens around the audio, template included; checked when they are tokenized

# The checkpoint knows the languages by their Chinese names; users give ISO codes or names.
LANGUAGE_NAMES = {"zh": "中文", "en": "英文", "ja": "日文"}
LANGUAGE_ALIASES = {
    "zh": "zh", "chinese": "zh", "mandarin": "zh", "中文": "zh",
    "en": "en", "english": "en", "英文": "en",
    "ja": "ja", "japanese": "ja", "日文": "ja",
}


def language_code(language: str | None) -> str | None:
    """ISO code for a language given as code, English or Chinese name; None for automatic."""
    if language is None or language.strip().lower() in ("", "auto"):
        return None
    code = LANGUAGE_ALIASES.get(language.strip().lower())
    if code is None:
        accepted = ", ".join(sorted(LANGUAGE_ALIASES)) + ", auto"
        raise OptionError(f"unknown language {language!r}; accepted: {accepted}")
    return code


def instruction(language=None, itn=True, hotwords=(), context=None) -> str:
    """The user instruction before the audio: [context block] + 语音转写[成X][，不进行文本规整]："""
    hotwords = _checked_hotwords(hotwords)
    context = (context or "").strip()
    if len(context) > MAX_CONTEXT_CHARS:
        raise OptionError(f"context is limited to {MAX_CONTEXT_CHARS} characters; got {len(context)}")
    text = ""
    if hotwords or context:
        text = CONTEXT_HEADER
        if context:
            text += context + "\n"
        if hotwords:
            text += "热词列表：[" + ", ".join(hotwords) + "]\n"
    code = language_code(language)
    text += "语音转写" + (f"成{LANGUAGE_NAMES[code]}" if code else "")
    return text + ("" if itn else NO_ITN) + "："


def _checked_hotwords(hotwords) -> list[str]:  # stripped, empty ones dropped, within the limits
    hotwords = [h.strip() for h in hotwords if h and h.strip()]
    if len(hotwords) > MAX_HOTWORDS:
        raise OptionError(f"at most {MAX_HOTWORDS} hotwords are accepted; got {len(hotwords)}")
    longest = max(hotwords, key=len, default="")
    if len(longest) > MAX_HOTWORD_CHARS:
        raise OptionError(f"a hotword is limited to {MAX_HOTWORD_CHARS} characters; got {len(longest)} in "
                          f"{longest[:40]!r}...")
    total = sum(map(len, hotwords))
    if total > MAX_HOTWORDS_CHARS:
        raise OptionError(f"hotwords are limited to {MAX_HOTWORDS_CHARS} characters in all; got {total}")
    return hotwords


@dataclass(frozen=True)
class Template:
    """A call's prompt as token ids around the audio slot: tokenized once, filled for each segment."""
    before: tuple[int, ...]
    after: tuple[int, ...]
    audio_id: int

    @property
    def text_tokens(self) -> int:
        return len(self.before) + len(self.after)

    def ids(self, n_audio: int) -> tuple[np.ndarray, int]:
        """(ids [L] int64 with n_audio placeholders, index of the first placeholder)."""
        ids = np.array(self.before + (self.audio_id,) * n_audio + self.after, dtype=np.int64)
        return ids, len(self.before)


def template(tokenizer, **options) -> Template:
    """The prompt's text pieces tokenized, held to MAX_PROMPT_TOKENS; `options` as for `instruction`."""
    before = tuple(tokenizer.encode(SYSTEM + instruction(**options)))
    after = tuple(tokenizer.encode(SUFFIX))
    if len(before) + len(after) > MAX_PROMPT_TOKENS:
        raise OptionError(f"the prompt is limited to {MAX_PROMPT_TOKENS} text tokens; hotwords and context "
                          f"make it {len(before) + len(after)}")
    return Template(before, after, tokenizer.audio)


def n_audio_tokens(n_frames: int, reference: str) -> int:
    """Audio rows given to the decoder: FunASR keeps fake_token_len(T) of them, Transformers all T."""
    if reference == "transformers":
        return n_frames
    o = 1 + (n_frames - 1) // 2
    o = 1 + (o - 1) // 2
    return (o - 1) // 2 + 1
