"""The transcription prompt (DESIGN §3): chat template text around n audio placeholder tokens.

The text pieces before and after the audio slot are tokenized separately, as the reference does, once per
call (a Template); each segment fills its audio slot.
"""
from __future__ import annotations

import difflib
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

# The checkpoints know languages by the Chinese names of FunAudioLLM/Fun-ASR's README usage example (中文、英文、
# 日文 for Fun-ASR-Nano-2512; 31 for Fun-ASR-MLT-Nano-2512, in this order); users give ISO codes or names.
LANGUAGES = {  # ISO code -> (the name the prompt uses, English name)
    "zh": ("中文", "chinese"), "en": ("英文", "english"), "yue": ("粤语", "cantonese"),
    "ja": ("日文", "japanese"), "ko": ("韩文", "korean"), "vi": ("越南语", "vietnamese"),
    "id": ("印尼语", "indonesian"), "th": ("泰语", "thai"), "ms": ("马来语", "malay"),
    "tl": ("菲律宾语", "filipino"), "ar": ("阿拉伯语", "arabic"), "hi": ("印地语", "hindi"),
    "bg": ("保加利亚语", "bulgarian"), "hr": ("克罗地亚语", "croatian"), "cs": ("捷克语", "czech"),
    "da": ("丹麦语", "danish"), "nl": ("荷兰语", "dutch"), "et": ("爱沙尼亚语", "estonian"),
    "fi": ("芬兰语", "finnish"), "el": ("希腊语", "greek"), "hu": ("匈牙利语", "hungarian"),
    "ga": ("爱尔兰语", "irish"), "lv": ("拉脱维亚语", "latvian"), "lt": ("立陶宛语", "lithuanian"),
    "mt": ("马耳他语", "maltese"), "pl": ("波兰语", "polish"), "pt": ("葡萄牙语", "portuguese"),
    "ro": ("罗马尼亚语", "romanian"), "sk": ("斯洛伐克语", "slovak"), "sl": ("斯洛文尼亚语", "slovenian"),
    "sv": ("瑞典语", "swedish"),
}
LANGUAGE_NAMES = {code: name for code, (name, _) in LANGUAGES.items()}
LANGUAGE_ALIASES = {alias: code for code, names in LANGUAGES.items() for alias in (code, *names)}
LANGUAGE_ALIASES.update(mandarin="zh", tagalog="tl", slovene="sl")
VARIANT_LANGUAGES = {"fun-asr-nano-2512": ("zh", "en", "ja"), "fun-asr-mlt-nano-2512": tuple(LANGUAGES)}
DEFAULT_VARIANT = "fun-asr-nano-2512"


def language_code(language: str | None, trained: tuple[str, ...] | None = None) -> str | None:
    """ISO code for a language given as code, English or Chinese name; None for automatic. With `trained`
    (the loaded model's languages), a language outside them is an error naming them."""
    if language is None or language.strip().lower() in ("", "auto"):
        return None
    code = LANGUAGE_ALIASES.get(language.strip().lower())
    known = tuple(LANGUAGES) if trained is None else trained
    if code is None:
        raise OptionError(f"unknown language {language!r}{_did_you_mean(language, known)}; accepted: ISO "
                          f"codes, English or Chinese names of {', '.join(known)}, or auto", "language")
    if code not in known:
        raise OptionError(f"language {language!r} ({code}): the model was not trained for it; its "
                          f"languages are {', '.join(trained)} (Fun-ASR-MLT-Nano-2512 has 31)", "language")
    return code


def _did_you_mean(language: str, known: tuple[str, ...]) -> str:
    """' (did you mean 'english'?)' for a misspelt name of one of the `known` languages; else ''."""
    names = [alias for alias, code in LANGUAGE_ALIASES.items() if code in known]
    close = difflib.get_close_matches(language.strip().lower(), names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def instruction(language=None, itn=True, hotwords=(), context=None) -> str:
    """The user instruction before the audio: [context block] + 语音转写[成X][，不进行文本规整]："""
    hotwords = _checked_hotwords(hotwords)
    context = (context or "").strip()
    if len(context) > MAX_CONTEXT_CHARS:
        raise OptionError(f"context is limited to {MAX_CONTEXT_CHARS} characters; got {len(context)}",
                          "context")
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
        raise OptionError(f"at most {MAX_HOTWORDS} hotwords are accepted; got {len(hotwords)}", "hotwords")
    longest = max(hotwords, key=len, default="")
    if len(longest) > MAX_HOTWORD_CHARS:
        raise OptionError(f"a hotword is limited to {MAX_HOTWORD_CHARS} characters; got {len(longest)} in "
                          f"{longest[:40]!r}...", "hotwords")
    total = sum(map(len, hotwords))
    if total > MAX_HOTWORDS_CHARS:
        raise OptionError(f"hotwords are limited to {MAX_HOTWORDS_CHARS} characters in all; got {total}",
                          "hotwords")
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
        field = "context" if options.get("context") else "hotwords"
        raise OptionError(f"the prompt is limited to {MAX_PROMPT_TOKENS} text tokens; hotwords and context "
                          f"make it {len(before) + len(after)}", field)
    return Template(before, after, tokenizer.audio)


def n_audio_tokens(n_frames: int, reference: str, low_frame_rate: bool = True) -> int:
    """Audio rows given to the decoder: FunASR keeps fake_token_len(T) of them for a model configured with
    use_low_frame_rate (Fun-ASR-Nano), all T otherwise (Fun-ASR-MLT-Nano); Transformers all T."""
    if reference == "transformers" or not low_frame_rate:
        return n_frames
    o = 1 + (n_frames - 1) // 2
    o = 1 + (o - 1) // 2
    return (o - 1) // 2 + 1
