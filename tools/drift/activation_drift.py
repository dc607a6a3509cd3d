"""Drift and speed of int8 or bf16 activations against exact (float32) ones.

    python tools/drift/activation_drift.py MODEL [MODEL ...] [--activations int8|bf16] [--tiny] [--rounds 5]
                                     [--report PATH]

int8: Q8_0, Q4_K and Q6_K matrices take int8 rows while decoding, and in the encoder, adaptor and prefill
where the CPU has AVX512-VNNI (MODEL: block-quantized GGUFs). bf16: BF16 matrices and attention take bf16 rows
(MODEL: BF16 checkpoints).
For each model (--tiny adds the committed tiny checkpoint, converted to Q8_0 for int8): on speech-like clips
(tools/lib/synth.py), the exact path's greedy ids are decoded; both paths are then forced along them (teacher
forcing, so one early difference does not cascade) and compared step by step: top-1 agreement and the mean
KL(exact || other) per token; each path's own greedy ids are compared as well. Speed, on each model given
(not the tiny one), in interleaved rounds (exact, other, exact, other, ...), medians with min and max:
encoder + adaptor ms on 30 s, and for int8 also decode ms/token after one prefill each.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CLIPS = ((4.0, 1), (10.0, 2), (10.0, 3))  # (seconds, seed) of tools/lib/synth.py speech_like
STEPS = 48


def log_softmax(logits: np.ndarray) -> np.ndarray:  # [steps, vocab] -> float64 [steps, vocab]
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def greedy(model, embeds, steps: int) -> list[int]:
    from nanoasr.model import generate

    return generate.generate([embeds], [steps], model.weights, model.config.text, model.tokenizer.stop_ids,
                             ignore_stop=True)[0].ids


def compare_clip(exact, other, seconds: float, seed: int) -> dict:
    """Teacher-forced top-1 agreement and mean KL per token, and both paths' greedy ids, on one clip."""
    from tools.lib.parity import stage_outputs, teacher_forced_logits
    from tools.lib.synth import speech_like

    with exact.thread_scope():
        embeds = stage_outputs(exact, speech_like(seconds, seed), "funasr", {})["embeds"]
        ids = greedy(exact, embeds, STEPS)
        p = log_softmax(teacher_forced_logits(exact, embeds, ids, STEPS))
    with other.thread_scope():
        own_embeds = stage_outputs(other, speech_like(seconds, seed), "funasr", {})["embeds"]
        q = log_softmax(teacher_forced_logits(other, own_embeds, ids, STEPS))
        own = greedy(other, own_embeds, STEPS)
    kl = (np.exp(p) * (p - q)).sum(axis=1)  # [steps]
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


def audio_ms(model, feats) -> float:
    """ms of the encoder and adaptor over the features given."""
    start = time.perf_counter()
    model.adapt(model.encode(feats), "funasr")
    return (time.perf_counter() - start) * 1e3


def speed(exact, other, rounds: int, steps: int) -> dict:
    """Interleaved rounds, {figure: {path: [ms per round]}}: encoder + adaptor on 30 s; int8 also decode
    ms/token after a 10 s clip's prompt."""
    from tools.lib.parity import stage_outputs
    from tools.lib.synth import speech_like

    name = other.backend.activations
    feats = exact.features(speech_like(30.0, 2), "funasr")
    figures = {"Encoder + adaptor ms, 30 s clip": lambda model: audio_ms(model, feats)}
    if name == "int8":
        embeds = stage_outputs(exact, speech_like(10.0, 2), "funasr", {})["embeds"]
        figures[f"Decode ms/token, 10 s clip, {steps} steps a round"] = lambda model: decode_ms(model, embeds,
                                                                                                steps)
    times = {figure: {"exact": [], name: []} for figure in figures}
    for model in (exact, other):  # compiled and warm
        with model.thread_scope():
            for measure in figures.values():
                measure(model)
    for _ in range(rounds):
        for model in (exact, other):
            with model.thread_scope():
                for figure, measure in figures.items():
                    times[figure][model.backend.activations].append(measure(model))
    return times


def tiny_checkpoint(work: Path) -> Path:
    """The committed tiny (BF16) checkpoint as a directory under work."""
    import gzip
    import shutil

    src, out = ROOT / "tests" / "fixtures" / "tiny", work / "tiny"
    out.mkdir()
    for f in src.iterdir():
        if f.name == "tokenizer.json.gz":
            (out / "tokenizer.json").write_bytes(gzip.decompress(f.read_bytes()))
        elif f.is_file():
            shutil.copy(f, out / f.name)
    return out


def tiny_q8_0(work: Path) -> Path:
    """The committed tiny checkpoint converted to a Q8_0 GGUF under work."""
    from nanoasr import convert
    from nanoasr.checkpoints.load import load_checkpoint

    path = work / "tiny-q8_0.gguf"
    convert.write(path, load_checkpoint(tiny_checkpoint(work)), "q8_0", report=False, progress=None)
    return path


def report(results: dict, times: dict, args, cpu: str) -> str:
    """The markdown report."""
    other = args.activations
    title = {"int8": "Int8 activations against exact ones (block-quantized weights)",
             "bf16": "bf16 activations against exact ones (BF16 weights)"}[other]
    lines = [f"# {title}", "",
             f"Produced by `python tools/drift/activation_drift.py {' '.join(sys.argv[1:])}` on {cpu}, "
             f"{args.threads} threads (a machine shared with other work: absolute times vary between runs, "
             "the ratio is within one run).", "",
             f"Teacher-forced over {STEPS} steps along the exact path's greedy ids; KL(exact || {other}) per "
             "token in nats; greedy: each path decoding on its own.", "",
             "| model | clip | top-1 agreement | mean KL | max KL | greedy ids |",
             "|---|---|---|---|---|---|"]
    for name, rows in results.items():
        for r in rows:
            same = "identical" if r["greedy_equal"] else f"differ from step {r['first_difference']}"
            lines.append(f"| {name} | {r['clip']} | {r['top1']:.4f} | {r['kl']:.2e} | {r['kl_max']:.2e} "
                         f"| {same} |")
    figures = {figure for per_model in times.values() for figure in per_model}
    for figure in sorted(figures):
        lines += ["", f"{figure}, {args.rounds} interleaved rounds (exact, {other}, ...) per model:", "",
                  f"| model | path | median | min | max | {other} / exact (medians) |",
                  "|---|---|---|---|---|---|"]
        for name, per_model in times.items():
            paths = per_model[figure]
            med = {k: float(np.median(v)) for k, v in paths.items()}
            ratio = {"exact": "", other: f"{med[other] / med['exact']:.3f}"}
            lines += [f"| {name} | {k} | {med[k]:.1f} | {min(v):.1f} | {max(v):.1f} | {ratio[k]} |"
                      for k, v in paths.items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, help="GGUF files (int8) or BF16 checkpoints (bf16)")
    parser.add_argument("--activations", choices=("int8", "bf16"), default="int8")
    parser.add_argument("--tiny", action="store_true", help="also the tiny fixture (as Q8_0 for int8)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="speed rounds per path (0: no speed figures)")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per speed round")
    parser.add_argument("--report", type=Path, default=None, help="write the markdown report here")
    args = parser.parse_args()
    import llvmlite.binding as llvm

    from nanoasr.api import Model
    from nanoasr.kernels.bf16 import amx
    from nanoasr.kernels.int8.dot import host_path

    runs_on = (f"integer path: {host_path()}" if args.activations == "int8"
               else f"AMX tiles: {amx.available()}")
    cpu = f"{llvm.get_host_cpu_name()} ({runs_on})"
    with tempfile.TemporaryDirectory() as work:
        tiny = (tiny_q8_0(Path(work)) if args.activations == "int8" else tiny_checkpoint(Path(work)))
        paths = ([tiny] if args.tiny else []) + args.models
        results, times = {}, {}
        for path in paths:
            exact = Model.load(str(path), threads=args.threads, activations="exact")
            other = Model(exact.checkpoint, "cpu", args.threads, activations=args.activations)
            results[path.name] = [compare_clip(exact, other, s, seed) for s, seed in CLIPS]
            if path in args.models and args.rounds:
                times[path.name] = speed(exact, other, args.rounds, args.steps)
    text = report(results, times, args, cpu)
    print(text)
    if args.report:
        args.report.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
