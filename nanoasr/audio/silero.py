"""Silero VAD (16 kHz), the trained voice-activity detector, in numpy: a speech probability for every
512-sample (32 ms) chunk of a 16 kHz stream.

The network (silero-vad 6.2.3's silero_vad_16k_op15.onnx; weights in silero_vad_16k.npz, converted by
tools/convert_silero_vad.py, MIT licence in silero_vad_16k.LICENSE) reads each chunk with the 64 samples
before it (zeros before the stream's start):
1. STFT as a convolution: the 576 samples, reflect-padded by 64 on the right, in 4 frames of 256 every 128,
   times 258 basis rows (129 real, 129 imaginary) -> the magnitude of 129 bins per frame;
2. encoder: four 3-tap convolutions (padding 1, strides 1, 2, 2, 1) with ReLU: 4 frames -> 1 vector of 128;
3. decoder: one LSTM cell step (128 units; its state carries from chunk to chunk), ReLU, a 128 -> 1
   projection, sigmoid.
Everything but the LSTM is computed for many chunks at once; only the LSTM runs chunk after chunk.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from nanoasr.errors import ModelError

CHUNK = 512  # samples per probability (32 ms at 16 kHz)
CONTEXT = 64  # samples of the previous chunk each chunk is read with
HIDDEN = 128  # LSTM units
N_FFT, STFT_HOP = 256, 128
BLOCK_CHUNKS = 2048  # chunks computed at once (65 s): the batched temporaries stay a few tens of MB
# Products of fewer rows than this run in numpy's own loop (einsum), not BLAS: a threaded BLAS splits even a
# 12-row product across its threads, which on a busy machine made a live session's 0.1 s of audio cost
# tens of ms instead of one.
BLAS_MIN_ROWS = 256
WEIGHTS = Path(__file__).with_name("silero_vad_16k.npz")


@functools.lru_cache(maxsize=4)
def load_weights(path: Path = WEIGHTS) -> dict[str, np.ndarray]:
    """The network's float32 arrays (tools/convert_silero_vad.py writes them), laid out for the products
    below: stft [256, 258]; encoder.{i}.kernel [3 * c_in, c_out] (tap-major) and .bias [c_out];
    lstm.input, lstm.hidden [128, 512] and lstm.bias [512] (both biases summed; the sigmoid gates' columns
    halved, exactly, so one tanh gives every gate: sigmoid(x) = (1 + tanh(x / 2)) / 2); head.weight [128],
    head.bias []."""
    try:
        with np.load(path) as z:
            raw = {k: z[k] for k in z.files if k != "source"}
    except OSError as e:
        raise ModelError(f"Silero VAD weights are not readable at {path} ({e}); tools/convert_silero_vad.py "
                         "writes them from the silero-vad wheel") from None
    w = {"stft": raw["stft.basis"][:, 0, :].T, "lstm.input": raw["lstm.weight_ih"].T,
         "lstm.hidden": raw["lstm.weight_hh"].T, "lstm.bias": raw["lstm.bias_ih"] + raw["lstm.bias_hh"],
         "head.weight": raw["head.weight"][0, :, 0], "head.bias": raw["head.bias"][0]}
    half = np.full(4 * HIDDEN, 0.5, np.float32)
    half[2 * HIDDEN:3 * HIDDEN] = 1.0  # the cell candidate is a tanh already
    for name in ("lstm.input", "lstm.hidden", "lstm.bias"):
        w[name] = w[name] * half
    for i in range(4):
        weight = raw[f"encoder.{i}.weight"]  # [c_out, c_in, 3]
        w[f"encoder.{i}.kernel"] = weight.transpose(2, 1, 0).reshape(-1, weight.shape[0])
        w[f"encoder.{i}.bias"] = raw[f"encoder.{i}.bias"]
    return {name: np.ascontiguousarray(a) for name, a in w.items()}


def product(a, b):  # [..., K] @ [K, N] -> [..., N]
    if a.size // a.shape[-1] < BLAS_MIN_ROWS:
        return np.einsum("...k,kn->...n", a, b)
    return a @ b


def spectrum(windows, w):  # [C, CONTEXT + CHUNK] -> [C, 4, 129] STFT magnitude
    reflected = windows[:, -2:-CONTEXT - 2:-1]  # the right edge mirrored, edge sample excluded
    padded = np.concatenate((windows, reflected), axis=1)  # [C, 640]
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT, axis=1)[:, ::STFT_HOP]  # [C, 4, 256]
    parts = product(frames.reshape(-1, N_FFT), w["stft"])  # [C * 4, 258]: every chunk and frame at once
    parts = parts.reshape(len(windows), -1, parts.shape[1])  # [C, 4, 258]
    half = parts.shape[-1] // 2  # 129 real parts, then 129 imaginary
    return np.sqrt(parts[..., :half] ** 2 + parts[..., half:] ** 2)


def conv3(x, kernel, bias, stride: int):  # [C, T, c_in] -> [C, T', c_out] 3-tap conv, padding 1, ReLU
    t_out = (x.shape[1] - 1) // stride + 1
    edge = np.zeros((len(x), 1, x.shape[2]), x.dtype)
    padded = np.concatenate((edge, x, edge), axis=1)
    taps = np.concatenate([padded[:, k::stride][:, :t_out] for k in range(3)], axis=2)  # [C, T', 3 * c_in]
    y = product(taps.reshape(-1, taps.shape[2]), kernel) + bias  # one product for every chunk and frame
    return np.maximum(y, 0.0).reshape(len(x), t_out, -1)


def encode(windows, w):  # [C, CONTEXT + CHUNK] -> [C, HIDDEN]
    x = spectrum(windows, w)
    for i, stride in enumerate((1, 2, 2, 1)):
        x = conv3(x, w[f"encoder.{i}.kernel"], w[f"encoder.{i}.bias"], stride)
    return x[:, 0]  # the strides leave one frame


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large negative x


def lstm(x, state, w):  # [C, HIDDEN], [2, HIDDEN] (h, c) -> [C, HIDDEN] h per chunk, [2, HIDDEN]
    """PyTorch's LSTM cell, gates in its order (input, forget, cell, output), one step per chunk; the
    weights come with the sigmoid gates halved (load_weights): tanh of the pre-activations gives all four."""
    gates_in = product(x, w["lstm.input"]) + w["lstm.bias"]  # [C, 4 * HIDDEN]
    w_hh = w["lstm.hidden"]
    h, c = state[0], state[1]
    out = np.empty_like(x)
    for t in range(len(x)):
        g = np.tanh(gates_in[t] + np.einsum("k,kn->n", h, w_hh))  # one row: never BLAS (see BLAS_MIN_ROWS)
        i, f, cell, o = g[:HIDDEN], g[HIDDEN:2 * HIDDEN], g[2 * HIDDEN:3 * HIDDEN], g[3 * HIDDEN:]
        c = 0.5 * ((1.0 + f) * c + (1.0 + i) * cell)
        h = 0.5 * (1.0 + o) * np.tanh(c)
        out[t] = h
    return out, np.stack((h, c))


def forward(windows, state, w):  # [C, CONTEXT + CHUNK], [2, HIDDEN] -> [C] probabilities, [2, HIDDEN]
    h, state = lstm(encode(windows, w), state, w)
    logit = product(np.maximum(h, 0.0), w["head.weight"][:, None])[:, 0] + w["head.bias"]
    return _sigmoid(logit).astype(np.float32), state


class SileroStream:
    """Speech probabilities of a 16 kHz stream fed in pieces of any size: one per whole 512-sample chunk, the
    same numbers however the stream is cut. Holds the LSTM state, the last CONTEXT samples and the samples
    not yet in a whole chunk."""

    def __init__(self, weights: dict[str, np.ndarray] | None = None):
        self.weights = load_weights() if weights is None else weights
        self.state = np.zeros((2, HIDDEN), np.float32)
        self.context = np.zeros(CONTEXT, np.float32)
        self.tail = np.zeros(0, np.float32)
        self.chunks = 0  # chunks scored so far: chunk k covers samples [k * CHUNK, (k + 1) * CHUNK)

    def feed(self, samples):  # [N] float32 -> [K] probabilities of the chunks completed
        wave = np.concatenate((self.context, self.tail, np.asarray(samples, np.float32)))
        n_chunks = (len(wave) - CONTEXT) // CHUNK
        self.tail = wave[CONTEXT + n_chunks * CHUNK:]
        out = np.empty(n_chunks, np.float32)
        for first in range(0, n_chunks, BLOCK_CHUNKS):
            count = min(BLOCK_CHUNKS, n_chunks - first)
            span = wave[first * CHUNK:(first + count) * CHUNK + CONTEXT]
            windows = np.lib.stride_tricks.sliding_window_view(span, CONTEXT + CHUNK)[::CHUNK]  # [count, 576]
            out[first:first + count], self.state = forward(windows, self.state, self.weights)
        if n_chunks:
            self.context = wave[CONTEXT + n_chunks * CHUNK - CONTEXT:CONTEXT + n_chunks * CHUNK]
        self.chunks += n_chunks
        return out


def speech_probabilities(wave, weights: dict[str, np.ndarray] | None = None):
    """[N] float32 at 16 kHz -> [N // CHUNK] speech probability of each whole 512-sample chunk."""
    return SileroStream(weights).feed(wave)
