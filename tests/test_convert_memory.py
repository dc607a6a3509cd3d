"""`nanoasr convert` in bounded memory: tensors are encoded a chunk of rows at a time, each is written as it
is made, and its source pages are let go; the file is the one whole-tensor encoding writes."""
import gzip
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize

from nanoasr import convert
from nanoasr.formats.mapping import map_read_only, release_pages
from nanoasr.quant.quantize import quantize
from nanoasr.tensor import StoredTensor

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "tiny"
MiB = 1 << 20
# Peak growth of the resident set while tensors are written, beyond the largest tensor's float32 size: one
# chunk's float32/float64 temporaries (CHUNK_ELEMENTS of them, 2 MiB each in float64) and allocator slack.
TENSOR_PHASE_MARGIN = 8 * MiB
# The whole command's peak above a bare interpreter that imported the same modules: the allowance.
# Most of it is the vocabulary (151,936 tokens and the merges, as Python strings and GGUF key-value bytes).
COMMAND_MARGIN = 500 * MiB

TENSOR_PHASE = """
import re, sys
from pathlib import Path
from gguf import GGUFWriter
from nanoasr import convert
from nanoasr.formats.mapping import map_read_only, release_pages
from nanoasr.checkpoints.load import load_checkpoint

def status(field):
    return int(re.search(rf"{field}:\\s+(\\d+)", Path("/proc/self/status").read_text())[1]) * 1024

marks = {}
write_infos = GGUFWriter.write_ti_data_to_file

def reset_peak_after_infos(self):  # the metadata is written: from here on, the tensors alone
    write_infos(self)
    Path("/proc/self/clear_refs").write_text("5")
    marks["start"] = status("VmRSS")

GGUFWriter.write_ti_data_to_file = reset_peak_after_infos
convert.write(sys.argv[2], load_checkpoint(sys.argv[1]), sys.argv[3], report=True)
print(status("VmHWM") - marks["start"])
"""

PEAK_RSS = """
import resource, sys
{work}
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def fixture_dir(tmp_path: Path) -> Path:
    out = tmp_path / "tiny"
    out.mkdir()
    for f in FIXTURE.iterdir():
        if f.name == "tokenizer.json.gz":
            (out / "tokenizer.json").write_bytes(gzip.decompress(f.read_bytes()))
        elif f.is_file():
            shutil.copy(f, out / f.name)
    return out


def run_python(code: str, *args) -> int:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def largest_float32_bytes(source: Path) -> int:
    from nanoasr.checkpoints.load import load_checkpoint

    return max(math.prod(t.shape) for t in load_checkpoint(source).tensors.values()) * 4


def can_reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@pytest.mark.skipif(not can_reset_peak(), reason="needs Linux's /proc/self/clear_refs to reset the peak RSS")
@pytest.mark.parametrize("target", ["f16", "q8_0"])
def test_writing_the_tensors_holds_about_one_tensor(tmp_path, target):
    source = fixture_dir(tmp_path)
    growth = run_python(TENSOR_PHASE, source, tmp_path / "out.gguf", target)
    largest = largest_float32_bytes(source)  # the token embedding, 151,936 x 16
    assert growth <= largest + TENSOR_PHASE_MARGIN, (growth / MiB, largest / MiB)


def test_the_command_stays_within_the_interpreter_plus_the_largest_tensor_plus_the_allowance(tmp_path):
    source = fixture_dir(tmp_path)
    argv = ["convert", str(source), "--type", "q8_0", "--output", str(tmp_path / "out.gguf")]
    command = run_python(PEAK_RSS.format(work=f"from nanoasr.cli import main; assert main({argv!r}) == 0"))
    interpreter = run_python(PEAK_RSS.format(work="import nanoasr.cli.convert, nanoasr.convert"))
    assert command - interpreter <= largest_float32_bytes(source) + COMMAND_MARGIN


def resident_file_bytes() -> int:
    return int(re.search(r"RssFile:\s+(\d+)", Path("/proc/self/status").read_text())[1]) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssFile from /proc/self/status")
def test_release_pages_drops_a_views_pages_from_the_resident_set(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 255, 64 * MiB, np.uint8).tobytes())
    view = map_read_only(path)[12345:60 * MiB]
    total = int(view.sum(dtype=np.int64))  # reads every page
    before = resident_file_bytes()
    release_pages(view[::2])  # not one range of the file: left alone
    assert resident_file_bytes() > before - MiB
    release_pages(view)
    assert resident_file_bytes() < before - 59 * MiB
    assert int(view.sum(dtype=np.int64)) == total  # read again from the page cache


@pytest.fixture(scope="module")
def matrix():
    """BF16 rows spanning three chunks, the last one short."""
    rows = convert.CHUNK_ELEMENTS // 512 * 2 + 37
    x = np.random.default_rng(0).standard_normal((rows, 512)).astype(np.float32)
    bits = gguf_quantize(x, GGMLQuantizationType.BF16).view(np.uint16)
    return StoredTensor(bits, "bf16", x.shape)


def whole(t: StoredTensor, dtype: str, name: str = "") -> np.ndarray:
    """The tensor encoded in one piece."""
    if t.dtype == dtype:
        return np.ascontiguousarray(t.data)
    x = t.numpy()
    if dtype in ("f32", "f16"):
        return x.astype(np.float16 if dtype == "f16" else np.float32)
    if dtype == "bf16":
        return gguf_quantize(x, GGMLQuantizationType.BF16).view(np.uint16)
    return quantize(x.reshape(t.shape[0], -1), dtype)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", "q4_k", "q6_k"])
def test_encoding_in_chunks_equals_encoding_the_whole_tensor(matrix, dtype):
    encoded = convert.encode(matrix, dtype, "m")
    assert encoded.dtype == whole(matrix, dtype).dtype
    np.testing.assert_array_equal(encoded, whole(matrix, dtype))


def test_the_report_in_chunks_equals_the_whole_tensor_error(matrix):
    data = convert.encode(matrix, "q4_k", "m")
    diff = convert.decode(data, "q4_k", matrix.shape).astype(np.float64) - matrix.numpy()
    rms = math.sqrt(np.mean(np.square(diff)))
    norm = math.sqrt(np.mean(np.square(matrix.numpy().astype(np.float64))))
    row = convert._report_row("m", matrix, "q4_k", data, report=True)
    assert row["rel_rms"] == pytest.approx(rms / norm, rel=1e-12)
    assert row["max_abs"] == np.abs(diff).max()


@pytest.mark.parametrize("target", ["f16", "bf16", "q8_0"])
def test_the_file_is_the_one_whole_tensor_encoding_writes(tmp_path, monkeypatch, target):
    from nanoasr.checkpoints.load import load_checkpoint

    checkpoint = load_checkpoint(fixture_dir(tmp_path))
    convert.write(tmp_path / "chunked.gguf", checkpoint, target, report=False)
    monkeypatch.setattr(convert, "encode", whole)
    convert.write(tmp_path / "whole.gguf", checkpoint, target, report=False)
    assert (tmp_path / "chunked.gguf").read_bytes() == (tmp_path / "whole.gguf").read_bytes()
