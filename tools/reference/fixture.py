"""Rebuild the committed tiny fixture, tests/fixtures/tiny/: checkpoint, gzipped tokenizer, references.

    python -m tools.reference.fixture

The tokenizer.json (8 MB) is committed gzipped; tests/conftest.py unpacks it into a temporary copy.
"""
from __future__ import annotations

import gzip
import shutil
import tempfile
from pathlib import Path

from tools.reference import checkpoint, dump

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "tiny"
SEED = 0


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        built = checkpoint.build(Path(tmp) / "tiny", "tiny", SEED)
        dump.dump(built, Path(tmp) / "reference.npz")
        if FIXTURE.exists():
            shutil.rmtree(FIXTURE)
        FIXTURE.mkdir(parents=True)
        for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json"):
            shutil.copy(built / name, FIXTURE / name)
        with open(built / "tokenizer.json", "rb") as src, gzip.GzipFile(FIXTURE / "tokenizer.json.gz", "wb",
                                                                        compresslevel=9, mtime=0) as dst:
            shutil.copyfileobj(src, dst)
        shutil.copy(Path(tmp) / "reference.npz", FIXTURE / "reference.npz")
    print(FIXTURE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
