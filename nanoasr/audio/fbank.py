"""Kaldi log-mel fbank and low-frame-rate stacking (DESIGN §1, anchors §8 items 1-3), vectorised on xp.

fbank: 400-sample frames every 160 (snip_edges), per-frame DC removal, pre-emphasis 0.97, symmetric
Hamming window, zero-pad to 512, power spectrum, 80 triangular Kaldi-mel bins 20-8000 Hz, log with
floor FLT_EPSILON, no dither. LFR: 3 copies of frame 0 on the left, 7 frames every 6, last frame repeated.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from nanoasr.audio import SAMPLE_RATE
from nanoasr.errors import AudioError, OptionError
from nanoasr.xp import array_module

FRAME, SHIFT, N_FFT, N_MELS = 400, 160, 512, 80
LOW_HZ, HIGH_HZ = 20.0, 8000.0
PREEMPH = 0.97
LOG_FLOOR = np.float32(np.finfo(np.float32).eps)
LFR_M, LFR_N = 7, 6
REFERENCES = ("funasr", "transformers")  # the two reference profiles (DESIGN §2)
WAVE_SCALE = {"funasr": 32768.0, "transformers": 1.0}


def _mel(hz):
    return 1127.0 * np.log(1.0 + hz / 700.0)


@lru_cache(maxsize=1)
def mel_banks() -> np.ndarray:  # -> [80, 257] float32, mel-space triangles over FFT bins as Kaldi builds them
    fft_mel = _mel(np.arange(N_FFT // 2) * (SAMPLE_RATE / N_FFT))  # Kaldi leaves the Nyquist bin at 0
    lo, hi = _mel(LOW_HZ), _mel(HIGH_HZ)
    delta = (hi - lo) / (N_MELS + 1)
    left = lo + np.arange(N_MELS)[:, None] * delta
    center, right = left + delta, left + 2 * delta
    up = (fft_mel[None, :] - left) / (center - left)
    down = (right - fft_mel[None, :]) / (right - center)
    banks = np.maximum(0.0, np.minimum(up, down))
    return np.pad(banks, ((0, 0), (0, 1))).astype(np.float32)


@lru_cache(maxsize=1)
def hamming() -> np.ndarray:  # -> [400] symmetric
    return (0.54 - 0.46 * np.cos(2 * np.pi * np.arange(FRAME) / (FRAME - 1))).astype(np.float32)


def n_fbank_frames(n_samples: int) -> int:
    return 0 if n_samples < FRAME else (n_samples - FRAME) // SHIFT + 1


def n_lfr_frames(n_samples: int) -> int:
    return math.ceil(n_fbank_frames(n_samples) / LFR_N)


def fbank(wave):  # [N] already scaled -> [T, 80] float32
    xp = array_module(wave)
    t = n_fbank_frames(wave.shape[0])
    index = xp.arange(t)[:, None] * SHIFT + xp.arange(FRAME)[None, :]
    frames = wave.astype(xp.float32)[index]  # [T, 400]
    frames = frames - frames.mean(axis=1, keepdims=True)
    previous = xp.concatenate([frames[:, :1], frames[:, :-1]], axis=1)
    frames = (frames - np.float32(PREEMPH) * previous) * xp.asarray(hamming())
    spectrum = xp.fft.rfft(frames, n=N_FFT, axis=1)  # [T, 257]
    power = (spectrum.real ** 2 + spectrum.imag ** 2).astype(xp.float32)
    return xp.log(xp.maximum(power @ xp.asarray(mel_banks()).T, LOG_FLOOR))


def lfr(feats):  # [T, 80] -> [ceil(T/6), 560]
    xp = array_module(feats)
    t = feats.shape[0]
    t_lfr = math.ceil(t / LFR_N)
    rows = xp.arange(t_lfr)[:, None] * LFR_N + xp.arange(LFR_M)[None, :] - (LFR_M - 1) // 2
    rows = xp.clip(rows, 0, t - 1)  # left: copies of frame 0; right: the last frame repeated
    return feats[rows].reshape(t_lfr, -1)


def check_reference(reference: str) -> None:
    """OptionError for a numerics profile that is not one of REFERENCES (DESIGN §2)."""
    if reference not in REFERENCES:
        raise OptionError(f"reference must be one of {', '.join(REFERENCES)}; got {reference!r}", "reference")


def features(wave, reference: str = "funasr"):  # [N] in [-1, 1] at 16 kHz -> ([T_lfr, 560], T_lfr)
    check_reference(reference)
    if wave.shape[0] < FRAME:
        raise AudioError(f"audio is shorter than one 25 ms frame ({wave.shape[0]} samples; at least {FRAME} "
                         f"at 16 kHz are needed)")
    feats = lfr(fbank(wave * np.float32(WAVE_SCALE[reference])))
    return feats, feats.shape[0]
