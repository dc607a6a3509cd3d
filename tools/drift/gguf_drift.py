"""Drift of each GGUF type from the BF16 safetensors path, on one checkpoint: docs/reports/gguf_drift.md.

    python tools/drift/gguf_drift.py CHECKPOINT_DIR --work DIR [--report docs/reports/gguf_drift.md]

For F16, Q8_0 and Q4_K_M: file size, load time, peak RSS (each model in its own process), relative
error of the prefill logits against the BF16 path, and top-1 agreement over 64 decode steps forced
along the BF16 path's greedy ids (teacher forcing, so one early difference does not cascade).
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are unset for the child processes (tools/lib/measure.py).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.lib.measure import environ_without_blas_vars  # noqa: E402

TYPES = ("f16", "q8_0", "q4_k_m")
STEPS, SECONDS = 64, 10


def child(model_path: str, out_prefix: str, forced: str | None) -> dict:
    import numpy as np

    from nanoasr.api import Model
    from tools.lib.synth import speech_like
    from tools.lib.parity import stage_outputs, teacher_forced_logits

    start = time.perf_counter()
    model = Model.load(model_path, threads=2, activations="exact")
    load_s = time.perf_counter() - start
    with model.thread_scope():
        ours = stage_outputs(model, speech_like(SECONDS, 3), "funasr", {})
        if forced is None:  # the BF16 path chooses the ids everyone is forced along
            from nanoasr.model import generate

            ids = generate.generate([ours["embeds"]], [STEPS], model.weights, model.config.text,
                                    model.tokenizer.stop_ids, ignore_stop=True)[0].ids
        else:
            ids = np.load(forced).tolist()
        logits = teacher_forced_logits(model, ours["embeds"], ids, STEPS)
    np.save(out_prefix + ".prefill.npy", logits[0])
    np.save(out_prefix + ".top1.npy", logits.argmax(axis=1))
    np.save(out_prefix + ".ids.npy", np.array(ids))
    return {"load_s": load_s, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_child(model_path: Path, prefix: Path, forced: Path | None) -> dict:
    env = environ_without_blas_vars()
    cmd = ([sys.executable, __file__, "--child", str(model_path), str(prefix)]
           + ([str(forced)] if forced else []))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{model_path}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(*sys.argv[2:4], sys.argv[4] if len(sys.argv) > 4 else None)))
        return 0
    import numpy as np

    from nanoasr import convert
    from nanoasr.checkpoints.load import load_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--work", required=True, help="folder for the GGUF files and intermediate arrays")
    parser.add_argument("--report", default=str(ROOT / "docs" / "reports" / "gguf_drift.md"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    source = Path(args.checkpoint)
    rows = {"bf16 safetensors": dict(
        run_child(source, work / "bf16", None),
        size_mb=sum(f.stat().st_size for f in source.glob("*.safetensors")) / 2**20)}
    base_prefill, base_top1 = np.load(work / "bf16.prefill.npy"), np.load(work / "bf16.top1.npy")
    for target in TYPES:
        path = work / f"model-{target}.gguf"
        if not path.exists():
            convert.write(path, load_checkpoint(source), target, report=False, progress=None)
        result = run_child(path, work / target, work / "bf16.ids.npy")
        prefill = np.load(work / f"{target}.prefill.npy")
        top1 = np.load(work / f"{target}.top1.npy")
        result.update(size_mb=path.stat().st_size / 2**20,
                      prefill_rel_err=float(np.linalg.norm(prefill - base_prefill)
                                            / np.linalg.norm(base_prefill)),
                      top1_agreement=float((top1 == base_top1).mean()))
        rows[f"{target} gguf"] = result
    lines = ["# GGUF drift", "",
             f"Produced by `python tools/drift/gguf_drift.py {' '.join(sys.argv[1:])}`: {SECONDS} s of "
             f"speech-like audio, funasr profile, {STEPS} decode steps forced along the BF16 path's greedy "
             "ids, "
             "2 threads (checkpoint and files: [README.md](README.md)). The weights are random, not "
             "trained: drift on the real checkpoint is not measured here.", "",
             "| model | file MB | load s | peak RSS MB | prefill logits rel. error | top-1 agreement |",
             "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['size_mb']:.0f} | {r['load_s']:.2f} | {r['peak_rss_mb']:.0f} | "
                     f"{r.get('prefill_rel_err', 0):.2e} | {r.get('top1_agreement', 1):.3f} |")
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
