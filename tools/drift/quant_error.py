"""nanoasr's Q4_K / Q6_K quantizers against llama.cpp's own, on the same tensors: docs/reports/quant_error.md.

    python tools/drift/quant_error.py CHECKPOINT_DIR --llama-python PY --work DIR
                                [--report docs/reports/quant_error.md]

The decoder is exported as a stock qwen3 GGUF in F32, llama.cpp quantizes it to Q4_K_M
(`llama_model_quantize` through llama-cpp-python, run by the interpreter PY, which has it installed),
and every tensor llama.cpp stored as Q4_K or Q6_K is quantized again by nanoasr to the same type. Both
are dequantized by the gguf package; the table gives each one's relative RMS error and their ratio.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
QUANTIZE = """import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype, p.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))
"""


def rel_rms(x: np.ndarray, restored: np.ndarray) -> float:
    return float(np.sqrt(np.mean((restored - x) ** 2) / np.mean(x ** 2)))


def main() -> int:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from nanoasr.checkpoints.load import load_checkpoint
    from nanoasr.convert import write_qwen3
    from nanoasr.quant.quantize import quantize

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--llama-python", required=True, help="a Python interpreter with llama-cpp-python")
    parser.add_argument("--work", required=True)
    parser.add_argument("--report", default=str(ROOT / "docs" / "reports" / "quant_error.md"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    f32, q4 = work / "decoder-f32.gguf", work / "decoder-q4_k_m-llama.gguf"
    if not f32.exists():
        write_qwen3(f32, load_checkpoint(args.checkpoint), "f32", report=False, progress=None)
    if not q4.exists():
        subprocess.run([args.llama_python, "-c", QUANTIZE, str(f32), str(q4)], check=True)
    source = {t.name: t for t in GGUFReader(f32).tensors}
    rows = []
    for t in GGUFReader(q4).tensors:
        kind = t.tensor_type.name.lower()
        if kind not in ("q4_k", "q6_k"):
            continue
        x = np.asarray(source[t.name].data, np.float32).reshape(-1, int(t.shape[0]))
        theirs = dequantize(np.asarray(t.data), t.tensor_type).reshape(x.shape)
        ours = dequantize(quantize(x, kind), t.tensor_type).reshape(x.shape)
        rows.append((t.name, kind, rel_rms(x, theirs), rel_rms(x, ours)))
    lines = ["# Quantizer error: nanoasr vs llama.cpp", "",
             f"Produced by `python tools/drift/quant_error.py {' '.join(sys.argv[1:])}`: every tensor "
             "llama.cpp's Q4_K_M quantizer stored as Q4_K or Q6_K, quantized again by nanoasr to the same "
             "type; relative RMS error of each after the gguf package's dequantizer.", ""]
    for kind in ("q4_k", "q6_k"):
        picked = [r for r in rows if r[1] == kind]
        if picked:
            ratios = np.array([r[3] / r[2] for r in picked])
            lines.append(f"- {kind}: {len(picked)} tensors; error ratio nanoasr / llama.cpp: median "
                         f"{np.median(ratios):.4f}, worst {ratios.max():.4f}")
    lines += ["", "| tensor | type | llama.cpp rel. RMS | nanoasr rel. RMS | ratio |",
              "|---|---|---|---|---|"]
    lines += [f"| {name} | {kind} | {a:.5f} | {b:.5f} | {b / a:.4f} |" for name, kind, a, b in rows]
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:8]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
