import gzip
import os
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
def full_size_dir(tmp_path_factory) -> pathlib.Path:
    """A random checkpoint of the real model's sizes (about 1.6 GB in BF16), built once for the slow tier."""
    pytest.importorskip("transformers")
    from tools.reference import checkpoint

    return checkpoint.build(tmp_path_factory.mktemp("full"), "full", seed=5)


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_dir):
    """The tiny checkpoint as loaded from its directory: what every other layout of it must equal."""
    from nanoasr.checkpoints.load import load_checkpoint

    return load_checkpoint(tiny_dir)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    from nanoasr.api import Model

    return Model.load(str(tiny_dir), activations="exact")  # the parity tests compare its float32 numbers


@pytest.fixture(scope="session")
def default_model(tiny_dir):
    """The tiny model as the command line loads it: the default activations, which on a CPU with bf16
    products are bf16 rows against its BF16 weights (the parity tests' tiny_model is exact)."""
    from nanoasr.api import Model

    return Model.load(str(tiny_dir))


@pytest.fixture(scope="session")
def fast_model(tiny_model):
    """The tiny model on one thread: on a machine shared with other work a pool of threads makes its small
    products many times slower (a live session's tests decode often)."""
    from nanoasr.api import Model

    return Model(tiny_model.checkpoint, threads=1)


# CI sets NANOASR_NO_SKIPS=1: every tier it installs for must run, so a skip there (a broken torch or
# transformers import, a missing ffmpeg) fails the run instead of hiding a tier. Only the GPU tier and the
# kernel paths for CPU features the machine lacks (marked cpu_path) may skip.
STRICT_SKIPS = os.environ.get("NANOASR_NO_SKIPS") == "1"
# The fast lane: locally, tests marked slow or live are skipped unless asked for (`--all`, or `-m` naming
# them). The full run is every tier: `--all`, or CI (CI=true, or NANOASR_NO_SKIPS=1 as .ci/run sets).
FULL_RUN = STRICT_SKIPS or os.environ.get("CI") == "true"
LANE_MARKERS = ("slow", "live")
_unexpected_skips: list[str] = []


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", dest="all_tiers",
                     help="run the slow and live tests too (the full run; CI always does)")


def pytest_collection_modifyitems(config, items):
    if FULL_RUN or config.getoption("all_tiers") or config.getoption("markexpr"):
        return
    for item in items:
        tier = next((m for m in LANE_MARKERS if m in item.keywords), None)
        if tier is not None:
            item.add_marker(pytest.mark.skip(reason=f"{tier}: outside the fast lane; --all runs it"))


def _note_skip(report) -> None:
    keywords = getattr(report, "keywords", {})
    if STRICT_SKIPS and report.skipped and "cuda" not in keywords and "cpu_path" not in keywords:
        _unexpected_skips.append(f"{report.nodeid}: {report.longrepr[-1] if report.longrepr else ''}")


def pytest_collectreport(report):
    _note_skip(report)


def pytest_runtest_logreport(report):
    _note_skip(report)


def pytest_sessionfinish(session, exitstatus):
    if _unexpected_skips and exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if _unexpected_skips:
        terminalreporter.section("skips CI does not allow (NANOASR_NO_SKIPS=1)")
        for line in _unexpected_skips:
            terminalreporter.write_line(line)
