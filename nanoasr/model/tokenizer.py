"""The checkpoint's tokenizer.json through `tokenizers`; special tokens found by their strings."""
from __future__ import annotations

import re

from tokenizers import Tokenizer as HFTokenizer

from nanoasr.errors import ModelError

IM_START, IM_END, END_OF_TEXT, AUDIO = "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|object_ref_start|>"


class Tokenizer:
    def __init__(self, tokenizer_json: str, audio_token_id: int, where: str = "model"):
        try:
            self._tok = HFTokenizer.from_str(tokenizer_json)
        except Exception as exc:  # tokenizers raises a bare Exception for malformed JSON
            raise ModelError(f"{where}: tokenizer.json cannot be read by the tokenizers library "
                             f"({exc})") from None
        ids = {}
        for token in (IM_START, IM_END, END_OF_TEXT, AUDIO):
            ids[token] = self._tok.token_to_id(token)
            if ids[token] is None:
                raise ModelError(f"{where}: tokenizer.json: special token {token} is missing")
        if ids[AUDIO] != audio_token_id:
            raise ModelError(f"{where}: tokenizer.json: {AUDIO} has id {ids[AUDIO]} "
                             f"but config audio_token_id is {audio_token_id}")
        self.im_end, self.end_of_text, self.audio = ids[IM_END], ids[END_OF_TEXT], ids[AUDIO]
        self.stop_ids = (self.im_end, self.end_of_text)

    def encode(self, text: str) -> list[int]:
        """Ids of one text piece; special-token strings in it become their ids; no BOS is added."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """Text of generated ids: special tokens skipped, `/sil` read as a pause, whitespace collapsed."""
        text = self._tok.decode(list(ids), skip_special_tokens=True)
        return re.sub(r"\s+", " ", text.replace("/sil", " ")).strip()
