"""Convert a Fun-ASR-Nano checkpoint to a nanoasr GGUF (same as `python -m nanoasr convert`).

    python tools/convert_gguf.py SRC --type q8_0 --output OUT.gguf [--report REPORT.json] [--revision REV]
                                 [--repo ORG/NAME] [--export-qwen3-gguf DECODER.gguf]

SRC is a local checkpoint directory (safetensors), a .gguf file, or a hub id org/name[@revision].
Types: f32, f16, bf16, q8_0, q4_k_m. See docs/gguf.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nanoasr.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(["convert", *sys.argv[1:]]))
