"""Pinned torchaudio Kaldi fbank values for the frontend tests: tests/fixtures/frontend_torchaudio.npz.

    PY -m tools.reference.frontend      (PY: a Python with torch 2.9.1 + torchaudio 2.9.1)

torchaudio.compliance.kaldi.fbank is what Transformers' FunAsrNanoFeatureExtractor and FunASR's
WavFrontend call, with the arguments they pass: 80 bins, 25 ms / 10 ms, 16 kHz, Hamming, dither 0
(torchaudio's other defaults: DC removal, pre-emphasis 0.97, snip_edges, 20 Hz to Nyquist). The
`transformers` profile feeds unit-scale audio, the `funasr` profile audio x 32768.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "frontend_torchaudio.npz"


def signals() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    t = np.arange(16000) / 16000
    tone = 0.4 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 3100 * t)
    chirp = 0.3 * np.sin(2 * np.pi * (80 + 3000 * t) * t)
    voiced = np.sign(np.sin(2 * np.pi * 120 * t)) * np.exp(-((t % 0.25) - 0.12) ** 2 / 0.003) * 0.2
    out = {"tone": tone, "chirp": chirp, "voiced": voiced + 0.01 * rng.standard_normal(t.size)}
    for n in (400, 401, 559, 961, 4321):
        out[f"noise{n}"] = 0.05 * rng.standard_normal(n)
    return {k: v.astype(np.float32) for k, v in out.items()}


def main() -> int:
    import torch
    import torchaudio

    arrays = {}
    for name, wave in signals().items():
        arrays[f"{name}/wave"] = wave
        for profile, scale in (("transformers", 1.0), ("funasr", 32768.0)):
            mel = torchaudio.compliance.kaldi.fbank(torch.from_numpy(wave * scale)[None], num_mel_bins=80,
                                                    frame_length=25, frame_shift=10, sample_frequency=16000,
                                                    window_type="hamming", dither=0.0)
            arrays[f"{name}/{profile}"] = mel.numpy()
    arrays["versions"] = np.array([torch.__version__, torchaudio.__version__])
    np.savez_compressed(OUT, **arrays)
    print(OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
