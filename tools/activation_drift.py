"""Drift and speed of int8 activations against exact (float32) ones on block-quantized GGUFs.

    python tools/activation_drift.py MODEL.gguf [MODEL.gguf ...] [--tiny] [--rounds 5] [--report PATH]

Q8_0, Q4_K and Q6_K matrices take int8 rows.
For each model (--tiny adds the committed tiny checkpoint converted to Q8_0): on speech-like clips
(tools/synth.py), the exact path's greedy ids are decoded; both paths are then forced along them (teacher
forcing, so one early difference does not cascade) and compared step by step: top-1 agreement and the mean
KL(exact || int8) per token; each path's own greedy ids are compared as well. Speed: decode ms/token of the
two paths on each model given (not the tiny one), in interleaved rounds (exact, int8, exact, int8, ...)
after one prefill each; medians with min and max.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CLIPS = ((4.0, 1), (10.0, 2), (10.0, 3))  # (seconds, seed) of tools/synth.py speech_like
STEPS = 48


def log_softmax(logits: np.ndarray) -> np.ndarray:  # [steps, vocab] -> float64 [steps, vocab]
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def greedy(model, embeds, steps: int) -> list[int]:
    from nanoasr.model import generate

    return generate.generate([embeds], [steps], model.weights, model.config.text, model.tokenizer.stop_ids,
                             ignore_stop=True)[0].ids


def compare_clip(exact, int8, seconds: float, seed: int) -> dict:
    """Teacher-forced top-1 agreement and mean KL per token, and both paths' greedy ids, on one clip."""
    from tools.parity import stage_outputs, teacher_forced_logits
    from tools.synth import speech_like

    embeds = stage_outputs(exact, speech_like(seconds, seed), "funasr", {})["embeds"]
    ids = greedy(exact, embeds, STEPS)
    p, q = (log_softmax(teacher_forced_logits(m, embeds, ids, STEPS)) for m in (exact, int8))
    kl = (np.exp(p) * (p - q)).sum(axis=1)  # [steps]
    own = greedy(int8, embeds, STEPS)
    first = next((i for i, (a, b) in enumerate(zip(ids, own)) if a != b), None)
    return {"clip": f"{seconds:g} s seed {seed}", "top1": float((p.argmax(1) == q.argmax(1)).mean()),
            "kl": float(kl.mean()), "kl_max": float(kl.max()), "greedy_equal": ids == own,
            "first_difference": first}


def decode_ms(model, embeds, steps: int) -> float:
    """ms per decode step after one (untimed) prefill, forced along token 0's row of ids."""
    from nanoasr.model import decoder

    session = decoder.Session(model.weights, model.config.text, rows=1)
    token = int(session.prefill(embeds, room=steps)[0].argmax())
    start = time.perf_counter()
    for _ in range(steps):
        token = int(session.step([token])[0].argmax())
    return (time.perf_counter() - start) * 1e3 / steps


def speed(exact, int8, rounds: int, steps: int) -> dict:
    """Interleaved rounds on a 10 s clip: {path: [ms/token per round]}."""
    from tools.parity import stage_outputs
    from tools.synth import speech_like

    embeds = stage_outputs(exact, speech_like(10.0, 2), "funasr", {})["embeds"]
    times = {"exact": [], "int8": []}
    for _ in range(rounds):
        for name, model in (("exact", exact), ("int8", int8)):
            times[name].append(decode_ms(model, embeds, steps))
    return times


def tiny_q8_0(work: Path) -> Path:
    """The committed tiny checkpoint converted to a Q8_0 GGUF under work."""
    import gzip
    import shutil

    from nanoasr import convert
    from nanoasr.model.load import load_checkpoint

    src, out = ROOT / "tests" / "fixtures" / "tiny", work / "tiny"
    out.mkdir()
    for f in src.iterdir():
        if f.name == "tokenizer.json.gz":
            (out / "tokenizer.json").write_bytes(gzip.decompress(f.read_bytes()))
        elif f.is_file():
            shutil.copy(f, out / f.name)
    path = work / "tiny-q8_0.gguf"
    convert.write(path, load_checkpoint(out), "q8_0", report=False, progress=None)
    return path


def report(results: dict, times: dict, args, cpu: str) -> str:
    """The markdown report."""
    lines = ["# Int8 activations against exact ones (block-quantized weights)", "",
             f"Produced by `python tools/activation_drift.py {' '.join(sys.argv[1:])}` on {cpu}, "
             f"{args.threads} threads (a machine shared with other work: absolute times vary between runs, "
             "the ratio is within one run).", "",
             f"Teacher-forced over {STEPS} steps along the exact path's greedy ids; KL(exact || int8) per "
             "token in nats; greedy: each path decoding on its own.", "",
             "| model | clip | top-1 agreement | mean KL | max KL | greedy ids |",
             "|---|---|---|---|---|---|"]
    for name, rows in results.items():
        for r in rows:
            same = "identical" if r["greedy_equal"] else f"differ from step {r['first_difference']}"
            lines.append(f"| {name} | {r['clip']} | {r['top1']:.4f} | {r['kl']:.2e} | {r['kl_max']:.2e} "
                         f"| {same} |")
    if times:
        lines += ["", f"Decode ms/token, 10 s clip, {args.steps} steps a round, {args.rounds} interleaved "
                  "rounds (exact, int8, ...) per model:", "",
                  "| model | path | median | min | max | int8 / exact (medians) |",
                  "|---|---|---|---|---|---|"]
        for name, paths in times.items():
            med = {k: float(np.median(v)) for k, v in paths.items()}
            ratio = {"exact": "", "int8": f"{med['int8'] / med['exact']:.3f}"}
            lines += [f"| {name} | {k} | {med[k]:.1f} | {min(v):.1f} | {max(v):.1f} | {ratio[k]} |"
                      for k, v in paths.items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, help="Q8_0 GGUF files")
    parser.add_argument("--tiny", action="store_true", help="also the tiny fixture converted to Q8_0")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="speed rounds per path (0: no speed figures)")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per speed round")
    parser.add_argument("--report", type=Path, default=None, help="write the markdown report here")
    args = parser.parse_args()
    import llvmlite.binding as llvm

    from nanoasr import backend
    from nanoasr.api import Model
    from nanoasr.kernels.int8_dot import host_path

    cpu = f"{llvm.get_host_cpu_name()} (integer path: {host_path()})"
    with tempfile.TemporaryDirectory() as work, backend.threads(args.threads):
        paths = ([tiny_q8_0(Path(work))] if args.tiny else []) + args.models
        results, times = {}, {}
        for path in paths:
            exact = Model.load(str(path), threads=args.threads)
            int8 = Model(exact.checkpoint, "cpu", args.threads, activations="int8")
            results[path.name] = [compare_clip(exact, int8, s, seed) for s, seed in CLIPS]
            if path in args.models and args.rounds:
                times[path.name] = speed(exact, int8, args.rounds, args.steps)
    text = report(results, times, args, cpu)
    print(text)
    if args.report:
        args.report.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
