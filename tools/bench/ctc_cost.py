"""What word timestamps add to a segment: the CTC branch and the alignment, next to the encoder, on full-size
random BF16 weights (no checkpoint needed).

    python -m tools.bench.ctc_cost [--seconds 30] [--tokens 150] [--threads N] [--repeats 3]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from nanoasr import backend as backend_mod
from nanoasr import timestamps
from nanoasr.backend import host
from nanoasr.checkpoints import ctc as ctc_checkpoint
from nanoasr.checkpoints.spec import expected_tensors
from nanoasr.model import ctc, encoder
from nanoasr.model.config import Config
from nanoasr.tensor import StoredTensor


def random_bf16(shapes: dict, rng) -> dict[str, StoredTensor]:
    out = {}
    for name, shape in shapes.items():
        x = rng.standard_normal(shape, dtype=np.float32) * (0.02 if len(shape) > 1 else 0.1)
        out[name] = StoredTensor((x.view(np.uint32) >> 16).astype(np.uint16), "bf16", tuple(shape))
    return out


def weights(rng):
    """(encoder weights, CTC weights), placed on the CPU backend."""
    cpu = backend_mod.resolve("cpu")
    spec = {n: entry for n, entry in expected_tensors(Config()).items() if n.startswith("model.audio_tower.")}
    ctc_table = ctc_checkpoint.expected_tensors(ctc.CtcConfig())
    encoder_w = cpu.place(random_bf16({n: s for n, (s, _) in spec.items()}, rng),
                          {n for n, (_, kind) in spec.items() if kind != "matrix"})
    return encoder_w, cpu.place(random_bf16(ctc_table, rng), {n for n, s in ctc_table.items() if len(s) == 1})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--tokens", type=int, default=150, help="CTC tokens of the transcript to align")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    enc_w, ctc_w = weights(rng)
    cfg, frames = ctc.CtcConfig(), int(round(args.seconds / ctc.FRAME_S))
    feats = rng.standard_normal((frames, 560), dtype=np.float32)
    targets = rng.integers(0, cfg.blank_id, args.tokens).tolist()
    with host.threads(args.threads):
        for _ in range(args.repeats):  # the first includes numba's compilation
            t0 = time.perf_counter()
            enc = encoder.encode(feats, enc_w, Config().audio)
            t1 = time.perf_counter()
            logp = ctc.log_probs(enc, ctc_w, cfg)
            t2 = time.perf_counter()
            ctc.greedy_ids(logp, cfg.blank_id)
            timestamps.token_spans(*ctc.target_columns(logp, targets, cfg.blank_id), targets)
            t3 = time.perf_counter()
            print(f"{frames} frames: encoder {1e3 * (t1 - t0):.0f} ms; CTC branch {1e3 * (t2 - t1):.0f} ms "
                  f"({(t2 - t1) / (t1 - t0):.0%} of the encoder); greedy text + alignment of {args.tokens} "
                  f"tokens {1e3 * (t3 - t2):.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
