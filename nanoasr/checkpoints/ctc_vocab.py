"""The CTC branch's vocabulary: FunASR's `multilingual.tiktoken` (one `base64-token rank` pair a line), a
byte-level BPE read the way tiktoken reads it (funasr/models/sense_voice/whisper_lib/tokenizer.py
get_encoding: its split pattern, rank-ordered merges, special tokens numbered after the ranks).
"""
from __future__ import annotations

import base64
import binascii
from pathlib import Path

from tokenizers import Regex, pre_tokenizers

from nanoasr.errors import ModelError
from nanoasr.formats import bounds

# the split pattern FunASR gives tiktoken for this vocabulary
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_SPLIT = pre_tokenizers.Split(Regex(PATTERN), behavior="isolated")
MAX_BYTES = 64 << 20  # FunASR's multilingual.tiktoken is about 1 MB


def _ranks(text: str, where: str) -> dict[bytes, int]:
    ranks = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error):
            raise ModelError(f"{where}: line {number}: expected 'base64-token rank', "
                             f"found {line[:60]!r}") from None
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ModelError(f"{where}: byte 0x{missing[0]:02x} has no rank (a byte-level BPE ranks every byte)")
    return ranks


class CtcVocabulary:
    """encode(text) -> ids as tiktoken gives them (special-token strings read as plain text, as FunASR asks);
    ids at or above `n_ranks` are the special tokens (language tags, events, timestamps, the CTC blank)."""

    def __init__(self, text: str, where: str = "multilingual.tiktoken"):
        self.ranks = _ranks(text, where)
        self.n_ranks = len(self.ranks)
        self.pieces = {rank: piece for piece, rank in self.ranks.items()}
        if len(self.pieces) != self.n_ranks or max(self.pieces) != self.n_ranks - 1:
            raise ModelError(f"{where}: expected ranks 0..{self.n_ranks - 1}, each once")

    @classmethod
    def read(cls, path: Path) -> "CtcVocabulary":
        data = bounds.read_file(path, MAX_BYTES, "tiktoken vocabulary")
        try:
            return cls(data.decode("ascii"), str(path))
        except UnicodeDecodeError as exc:
            raise ModelError(f"{path}: cannot be read as a tiktoken vocabulary ({exc})") from None

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece, _ in _SPLIT.pre_tokenize_str(text):
            ids.extend(self._merge(piece.encode("utf-8")))
        return ids

    def _merge(self, data: bytes) -> list[int]:
        """tiktoken's byte-pair merge: join the adjacent pair of lowest rank (the leftmost on a tie) until no
        joined pair has a rank."""
        if data in self.ranks:
            return [self.ranks[data]]
        parts = [data[i:i + 1] for i in range(len(data))]
        while len(parts) > 1:
            joined = [(self.ranks[parts[i] + parts[i + 1]], i) for i in range(len(parts) - 1)
                      if parts[i] + parts[i + 1] in self.ranks]
            if not joined:
                break
            _, i = min(joined)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.ranks[p] for p in parts]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of a ranked token; special tokens have none in text."""
        return self.pieces.get(token_id, b"")

    def decode(self, ids) -> str:
        """Text of ranked ids; special tokens (ids from `n_ranks` on) are left out."""
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")
