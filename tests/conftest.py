import gzip
import pathlib
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TINY = ROOT / "tests" / "fixtures" / "tiny"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> pathlib.Path:
    """The committed tiny checkpoint as a checkpoint directory (its tokenizer.json is stored gzipped)."""
    out = tmp_path_factory.mktemp("tiny")
    for f in TINY.iterdir():
        if f.name == "tokenizer.json.gz":
            (out / "tokenizer.json").write_bytes(gzip.decompress(f.read_bytes()))
        elif f.name != "reference.npz":
            shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    from nanoasr.api import Model

    return Model.load(str(tiny_dir))
