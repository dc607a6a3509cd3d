"""Long-audio segmentation: cut a 16 kHz mono waveform into speech spans of at most `max_s` seconds.

The model reads at most 30 s at once and invents text on silence, so long input is split first and
only the spans that hold speech are decoded.

1. Frame energy: RMS in dB of 25 ms frames every 10 ms, after removing each frame's mean, so digital
   silence and a constant (DC) signal both read as -120 dB.
2. Speech frames: the threshold adapts to the recording, `noise floor + NOISE_MARGIN_DB` (the floor is
   a low percentile of the frame energies), capped `SPEECH_HEADROOM_DB` below the loud end so a
   recording without pauses still finds its speech, and never below `SILENCE_FLOOR_DB`, so hiss alone
   is silence. A run of frames above the threshold is speech when it also rises `HYSTERESIS_DB`
   above it somewhere (hysteresis: noise wobbling around the threshold does not start speech).
3. Regions: pauses shorter than `MIN_PAUSE_S` are bridged, speech shorter than `MIN_SPEECH_S` is
   dropped (clicks), and each region is padded by `PAD_S` so word onsets and tails are kept.
4. Segments: consecutive regions are merged greedily up to `TARGET_S` (never across a pause longer
   than `MAX_JOIN_GAP_S`, so silence stays out); a region longer than `max_s` is cut at the quietest
   point in the last third of each `max_s` window, so pieces stay long and cuts fall between words
   whenever a quieter point exists.

With `vad="silero"`, step 2 takes Silero VAD's speech probability (nanoasr.audio.silero, one per 32 ms, each
10 ms frame reading the chunk its centre lies in) instead of the energy threshold: a run of frames above
`SILERO_LOW` is speech when it rises above `SILERO_HIGH` somewhere (Silero's own 0.5 and 0.35). Steps 3
and 4 are the same; cuts still seek the quietest point.

`split` returns the speech spans only, in order, non-overlapping, inside the audio, none longer than
`max_s`; what lies between them is silence to skip. All-zero or constant input gives no spans.
Speech quieter than `SILENCE_FLOOR_DB` (RMS) is treated as silence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nanoasr.audio import SAMPLE_RATE, silero
from nanoasr.errors import AudioError, OptionError

FRAME_S, HOP_S = 0.025, 0.010  # the usual speech analysis frame: short enough to see gaps between words
SILENCE_FLOOR_DB = -50.0  # dBFS RMS; below this nothing is speech, whatever the recording's own levels
NOISE_PERCENTILE = 10  # the quietest tenth of the frames estimates the noise floor
NOISE_MARGIN_DB = 10.0  # speech stands at least this far above the noise floor
SPEECH_PERCENTILE = 99  # the loud end of the recording, a robust "speech level"
SPEECH_HEADROOM_DB = 15.0  # the threshold stays this far below the speech level, for pause-free input
HYSTERESIS_DB = 6.0  # a speech run must reach threshold + this somewhere
MIN_PAUSE_S = 0.3  # shorter dips are gaps between words, not pauses
MIN_SPEECH_S = 0.2  # shorter bursts are clicks or breaths
PAD_S = 0.2  # keeps soft onsets and word tails that sit under the threshold
TARGET_S = 20.0  # preferred segment length when pauses allow (shorter segments decode more reliably)
MAX_JOIN_GAP_S = 1.0  # a longer pause always ends a segment, so silence is not decoded
CUT_SEARCH_FRACTION = 1 / 3  # an overlong region is cut in the last third of the window
CUT_SMOOTH_FRAMES = 5  # the cut seeks a quiet 50 ms stretch, not a single quiet frame
MIN_POWER = 1e-12  # -120 dB, the floor for log of zero power
BLOCK_FRAMES = 1024  # frames measured at once: a few MB of float64 temporaries, whatever the length
BLOCK_SAMPLES = 1 << 20  # samples checked for NaN at once, so the check's temporary stays small
SILERO_HIGH, SILERO_LOW = 0.5, 0.35  # speech probability that starts a run, and that keeps it going
SEGMENT_VADS = ("energy", "silero")
DEFAULT_SEGMENT_VAD = "energy"


@dataclass(frozen=True)
class Span:
    """Samples [start, end) of the input that hold speech."""

    start: int
    end: int
    sample_rate: int = SAMPLE_RATE

    @property
    def start_s(self) -> float:
        return self.start / self.sample_rate

    @property
    def end_s(self) -> float:
        return self.end / self.sample_rate


def frame_db(wave, frame: int, hop: int):  # [N] -> [F] RMS of each mean-removed frame, dB
    n_frames = max(0, 1 + (len(wave) - frame) // hop)
    db = np.empty(n_frames)
    for first in range(0, n_frames, BLOCK_FRAMES):  # blocks keep the float64 temporaries O(block)
        count = min(BLOCK_FRAMES, n_frames - first)
        db[first:first + count] = _block_db(wave[first * hop:(first + count - 1) * hop + frame], frame, hop)
    return db


def _block_db(x, frame: int, hop: int):  # [S] -> [1 + (S - frame) // hop] dB, by running sums
    x = x.astype(np.float64)
    total = np.concatenate(([0.0], np.cumsum(x)))  # [S + 1]
    total_sq = np.concatenate(([0.0], np.cumsum(x * x)))
    starts = np.arange(1 + (len(x) - frame) // hop) * hop
    mean = (total[starts + frame] - total[starts]) / frame
    mean_sq = (total_sq[starts + frame] - total_sq[starts]) / frame
    return 10.0 * np.log10(np.maximum(mean_sq - mean * mean, MIN_POWER))


def speech_threshold(db) -> float:  # [F] -> dB above which a frame may be speech
    noise = np.percentile(db, NOISE_PERCENTILE)
    loud = np.percentile(db, SPEECH_PERCENTILE)
    return max(SILENCE_FLOOR_DB, min(noise + NOISE_MARGIN_DB, loud - SPEECH_HEADROOM_DB))


def _runs(mask):  # [F] bool -> (starts [R], ends [R]) of its True runs, ends exclusive
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def speech_regions(db, threshold: float, hop_s: float, rise: float = HYSTERESIS_DB):
    """[F] levels -> (starts [R], ends [R]) in frames: runs over `threshold` that rise `rise` above it."""
    starts, ends = _runs(db > threshold)
    if len(starts) == 0:
        return starts, ends
    peaks = np.maximum.reduceat(db, starts)  # frames after each run's end lie under the threshold
    keep = peaks > threshold + rise
    starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return starts, ends
    is_pause = starts[1:] - ends[:-1] >= round(MIN_PAUSE_S / hop_s)
    starts, ends = starts[np.concatenate(([True], is_pause))], ends[np.concatenate((is_pause, [True]))]
    keep = ends - starts >= round(MIN_SPEECH_S / hop_s)
    return starts[keep], ends[keep]


def padded_samples(starts, ends, frame: int, hop: int, pad: int, n: int):  # frames [R] -> samples [R]
    first, last = starts * hop, (ends - 1) * hop + frame
    mid = (last[:-1] + first[1:]) // 2  # padding stops halfway into a pause, so regions never overlap
    lo = np.maximum(first - pad, np.concatenate(([0], mid)))
    hi = np.minimum(last + pad, np.concatenate((mid, [n])))
    return lo, hi


def cut_points(db, start: int, end: int, max_len: int, frame: int, hop: int):  # -> sample cuts
    """Cut samples [start, end) into pieces of at most max_len, each at the quietest point available."""
    if end - start <= max_len:
        return []  # most regions: no need to smooth the whole recording's power
    power = np.convolve(10.0 ** (db / 10.0), np.ones(CUT_SMOOTH_FRAMES) / CUT_SMOOTH_FRAMES, "same")
    cuts = []
    while end - start > max_len:
        lo = start + math.ceil(max_len * (1 - CUT_SEARCH_FRACTION))
        hi = start + max_len
        k_lo = max(0, math.ceil((lo - frame / 2) / hop))  # frames whose centre lies in [lo, hi]
        k_hi = min(len(power) - 1, math.floor((hi - frame / 2) / hop))
        if k_hi < k_lo:
            cut = hi
        else:
            window = power[k_lo:k_hi + 1]
            k = k_hi - int(np.argmin(window[::-1]))  # the latest of equal minima keeps pieces long
            cut = min(max(k * hop + frame // 2, start + 1), hi)
        cuts.append(cut)
        start = cut
    return cuts


def _merge(lo, hi, target: int, max_gap: int):  # region samples -> [(start, end)] greedy segments
    segments = []
    for start, end in zip(lo.tolist(), hi.tolist()):
        if segments and end - segments[-1][0] <= target and start - segments[-1][1] <= max_gap:
            segments[-1] = (segments[-1][0], end)
        else:
            segments.append((start, end))
    return segments


def silero_frames(wave, n_frames: int, frame: int, hop: int):  # [N] at 16 kHz -> [F] speech probability
    stream, block = silero.SileroStream(), silero.BLOCK_CHUNKS * silero.CHUNK  # fed in blocks: bounded copies
    parts = [stream.feed(wave[i:i + block]) for i in range(0, len(wave), block)]
    parts.append(stream.feed(np.zeros(-len(wave) % silero.CHUNK, np.float32)))  # the last chunk completed
    p = np.concatenate(parts)  # [ceil(N / CHUNK)]
    return p[(np.arange(n_frames) * hop + frame // 2) // silero.CHUNK]


def speech_samples(wave, db, vad: str, sample_rate: int):  # [N], [F] -> (lo [R], hi [R]) padded regions
    """The speech regions of `wave` as samples, padded by PAD_S, by the detector `vad`."""
    frame, hop = round(FRAME_S * sample_rate), round(HOP_S * sample_rate)
    if vad == "silero":
        if sample_rate != SAMPLE_RATE:
            raise OptionError(f"vad='silero' reads 16 kHz audio; got sample_rate={sample_rate}", "vad")
        level = silero_frames(wave, len(db), frame, hop)
        starts, ends = speech_regions(level, SILERO_LOW, HOP_S, rise=SILERO_HIGH - SILERO_LOW)
    else:
        starts, ends = speech_regions(db, speech_threshold(db), HOP_S)
    return padded_samples(starts, ends, frame, hop, round(PAD_S * sample_rate), len(wave))


def split(wave, max_s: float = 30.0, sample_rate: int = SAMPLE_RATE,
          vad: str = DEFAULT_SEGMENT_VAD) -> list[Span]:
    """The speech spans of `wave` ([N] float mono), in order, each at most `max_s` seconds long; `vad` picks
    the detector of speech frames ("energy" or "silero")."""
    if vad not in SEGMENT_VADS:
        raise OptionError(f"vad must be one of {', '.join(SEGMENT_VADS)}; got {vad!r}", "vad")
    wave = np.asarray(wave)
    if wave.ndim != 1 or not np.issubdtype(wave.dtype, np.floating):
        raise AudioError(f"segmenting expects a 1-D float mono waveform, got {wave.dtype} "
                         f"of shape {wave.shape}")
    if not all(np.isfinite(wave[i:i + BLOCK_SAMPLES]).all() for i in range(0, len(wave), BLOCK_SAMPLES)):
        raise AudioError("segmenting expects finite samples, got NaN or infinity")
    if not (sample_rate > 0 and max_s * sample_rate >= 1):
        raise OptionError(f"max_s and sample_rate must be positive, got max_s={max_s}, "
                          f"sample_rate={sample_rate}")
    frame, hop = round(FRAME_S * sample_rate), round(HOP_S * sample_rate)
    if len(wave) < frame:
        return []
    db = frame_db(wave, frame, hop)
    lo, hi = speech_samples(wave, db, vad, sample_rate)
    max_len = int(max_s * sample_rate)
    bounds = []  # overlong regions are cut first; the pieces then merge like any region
    for start, end in zip(lo.tolist(), hi.tolist()):
        edges = [start, *cut_points(db, start, end, max_len, frame, hop), end]
        bounds.extend(zip(edges[:-1], edges[1:]))
    if not bounds:
        return []
    pieces = np.array(bounds).reshape(-1, 2)
    target = min(round(TARGET_S * sample_rate), max_len)
    segments = _merge(pieces[:, 0], pieces[:, 1], target, round(MAX_JOIN_GAP_S * sample_rate))
    return [Span(start, end, sample_rate) for start, end in segments]
