"""Word timing: a segment's words timed by FunASR's CTC branch (`with_words`), from the forced alignment of
its transcript against the CTC log-probabilities (host numpy), and how far the branch's greedy text agrees
with the decoder's.

The alignment is the Viterbi path FunASR takes from torchaudio's forced_align: states blank, t1, blank, t2,
..., blank; each frame stays, moves one state, or skips a blank between two different tokens; ties keep the
state, and the path ends on the last token unless the trailing blank scores higher.
"""
from __future__ import annotations

import dataclasses
import logging
import unicodedata
from dataclasses import dataclass

import numpy as np

from nanoasr.checkpoints.ctc import CtcBranch
from nanoasr.model import ctc
from nanoasr.transcript import Segment, Word

NEG_INF = np.float32(-np.inf)
log = logging.getLogger(__name__)


def with_words(segment: Segment, enc, branch: CtcBranch, weights) -> Segment:
    """The segment with its words, the CTC branch's greedy text and their agreement (FunASR's
    inference_llm: the decoder's text aligned against the CTC posteriors of the segment's frames).
    `enc` [T, 512] is the segment's encoder output; `weights` the branch's, placed."""
    cfg, vocab = branch.config, branch.vocabulary
    logp = ctc.log_probs(enc, weights, cfg)  # [T, vocab]
    ctc_text = vocab.decode(ctc.greedy_ids(logp, cfg.blank_id))
    targets = vocab.encode(segment.text)
    spans = token_spans(*ctc.target_columns(logp, targets, cfg.blank_id), targets)
    if spans is None:  # no alignment exists: no word times rather than made-up ones
        log.warning("segment at %.2f s: its %d CTC tokens do not fit in its %d frames; it has no word "
                    "times", segment.start, len(targets), logp.shape[0])
    pieces = words(segment.text, [vocab.token_bytes(t) for t in targets], spans or [])
    seconds = lambda frame: round(segment.start + frame * ctc.FRAME_S, 3)  # noqa: E731
    timed = tuple(Word(w, seconds(a), seconds(b), p) for w, a, b, p in pieces)
    return dataclasses.replace(segment, words=timed, ctc_text=ctc_text,
                               ctc_agreement=round(agreement(segment.text, ctc_text), 4))


@dataclass(frozen=True)
class TokenSpan:
    start: int  # first frame
    end: int  # one past the last frame
    probability: float  # the best frame's probability, as FunASR scores a token


def _emissions(target_logp, blank_logp):  # [T, L], [T] -> [T, 2L+1]: blank, t1, blank, t2, ..., blank
    t, n = target_logp.shape
    emit = np.empty((t, 2 * n + 1), np.float32)
    emit[:, 0::2] = blank_logp[:, None]
    emit[:, 1::2] = target_logp
    return emit


def viterbi(target_logp, blank_logp, targets):  # [T, L], [T], L ids -> state path [T], or None if none fits
    emit = _emissions(target_logp, blank_logp)  # [T, S]
    frames, states = emit.shape
    ids = np.asarray(targets)
    skip = np.zeros(states, bool)  # a token state reached from two states back: no repeat in between
    skip[3::2] = ids[1:] != ids[:-1]
    alpha = np.full(states, NEG_INF)
    alpha[:2] = emit[0, :2]
    back = np.zeros((frames, states), np.int8)
    for t in range(1, frames):  # a recurrence over frames; each step is vectorised over the states
        stay = alpha
        step = np.concatenate(([NEG_INF], alpha[:-1]))
        jump = np.where(skip, np.concatenate(([NEG_INF, NEG_INF], alpha[:-2])), NEG_INF)
        move = np.where((jump > step) & (jump > stay), 2, np.where((step > stay) & (step > jump), 1, 0))
        alpha = np.choose(move, [stay, step, jump]) + emit[t]
        back[t] = move
    state = states - 1 if states == 1 or alpha[-1] > alpha[-2] else states - 2
    if not np.isfinite(alpha[state]):
        return None
    path = np.empty(frames, np.int64)
    for t in range(frames - 1, -1, -1):
        path[t] = state
        state -= int(back[t, state])
    return path


def token_spans(target_logp, blank_logp, targets) -> list[TokenSpan] | None:
    """Frames each target token holds on the best path, or None when the tokens cannot fit in the frames
    (more tokens, with the blanks repeats need, than frames)."""
    if not len(targets):
        return []
    path = viterbi(target_logp, blank_logp, targets)
    if path is None:
        return None
    frames = np.nonzero(path % 2 == 1)[0]  # frames on a token state, in order
    index = path[frames] // 2
    firsts = np.concatenate(([0], np.nonzero(np.diff(index))[0] + 1))  # where each token's run begins
    probs = np.exp(target_logp[frames, index])
    best = np.maximum.reduceat(probs, firsts)
    lasts = np.concatenate((firsts[1:], [len(frames)])) - 1
    return [TokenSpan(int(frames[a]), int(frames[b]) + 1, float(p)) for a, b, p in zip(firsts, lasts, best)]


# --- words -----------------------------------------------------------------------------------------------

def _written_without_spaces(ch: str) -> bool:  # Han, kana: one word per character
    o = ord(ch)
    return (0x3040 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF or 0x3400 <= o <= 0x4DBF or 0x4E00 <= o <= 0x9FFF
            or 0xF900 <= o <= 0xFAFF or 0xFF66 <= o <= 0xFF9F or 0x20000 <= o <= 0x3134F)


def _wide_punctuation(ch: str) -> bool:  # CJK symbols and fullwidth forms (，。！？「」)
    return 0x3000 <= ord(ch) <= 0x303F or 0xFF00 <= ord(ch) <= 0xFF65


def _is_punctuation(ch: str) -> bool:
    return unicodedata.category(ch)[0] in "PS"


def word_starts(text: str) -> list[int]:
    """Character offsets where words begin, each word with the whitespace before it: a character of a
    language written without spaces is a word; elsewhere words are split by whitespace; punctuation stays
    with the word before it."""
    starts = [0]
    for i in range(1, len(text)):
        ch, prev = text[i], text[i - 1]
        if ch.isspace():
            continue
        after_wide = (_written_without_spaces(prev) or _wide_punctuation(prev)) and not _is_punctuation(ch)
        if prev.isspace() or _written_without_spaces(ch) or after_wide:
            start = i
            while start > 0 and text[start - 1].isspace():
                start -= 1
            if start > starts[-1]:
                starts.append(start)
    return starts


def words(text: str, token_bytes: list[bytes], spans: list[TokenSpan]) -> list[tuple[str, int, int, float]]:
    """(word, first frame, end frame, probability) for each word of `text`, whose tokens (their bytes, in
    order, spelling `text`) hold `spans`. A word boundary inside a token joins the words on either side (a
    token's frames cannot be split); a word's probability is the mean of its tokens'."""
    if not spans:
        return []
    char_bytes = np.cumsum([0] + [len(ch.encode("utf-8")) for ch in text])  # char offset -> byte offset
    token_starts = np.cumsum([0] + [len(b) for b in token_bytes])[:-1]  # [n_tokens]
    boundaries = set(token_starts.tolist())
    starts = [s for s in word_starts(text) if s == 0 or char_bytes[s] in boundaries]
    out = []
    for a, b in zip(starts, starts[1:] + [len(text)]):
        word = text[a:b].strip()
        inside = np.nonzero((token_starts >= char_bytes[a]) & (token_starts < char_bytes[b]))[0]
        if word and len(inside):
            first, last = spans[inside[0]], spans[inside[-1]]
            probability = float(np.mean([spans[i].probability for i in inside]))
            out.append((word, first.start, last.end, probability))
    return out


# --- agreement -------------------------------------------------------------------------------------------

def _letters(text: str) -> np.ndarray:  # code points, case folded, without whitespace and punctuation
    folded = unicodedata.normalize("NFKC", text).casefold()
    return np.array([ord(c) for c in folded if not (c.isspace() or _is_punctuation(c))], np.int64)


def agreement(text: str, other: str) -> float:
    """1 - the character edit distance between the two texts (case, spaces and punctuation ignored) over the
    longer one's length: 1.0 for the same words, near 0 for unrelated ones; 1.0 when both are empty."""
    x, y = _letters(text), _letters(other)
    if not len(x) or not len(y):
        return float(len(x) == len(y))
    columns = np.arange(len(y) + 1)
    row = columns.copy()  # distances from the first i characters of x to each prefix of y
    for i, code in enumerate(x, 1):
        best = np.empty_like(row)
        best[0] = i
        best[1:] = np.minimum(row[:-1] + (y != code), row[1:] + 1)  # substitute or match, delete
        row = np.minimum.accumulate(best - columns) + columns  # insert: a running minimum along the row
    return float(1 - row[-1] / max(len(x), len(y)))
