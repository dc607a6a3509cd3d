"""Weights read into huge pages (Model.load(huge_pages=True), backend/host.py): the same values, read from
the checkpoint's file where it maps them, one aligned read-only buffer, and the same transcription."""
import sys

import numpy as np
import pytest

from nanoasr import convert
from nanoasr.api import Model
from nanoasr.backend import CPU, with_activations
from nanoasr.backend import host as pages
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.errors import OptionError
from nanoasr.tensor import StoredTensor
from tools.lib.synth import speech_like


def mapped_file(tmp_path, nbytes=10_000, offset=100):
    path = tmp_path / "weights.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8).tobytes())
    return path, np.memmap(path, dtype=np.uint8, mode="r", offset=offset)


def test_file_span_finds_where_a_view_of_a_mapping_starts(tmp_path):
    path, mapped = mapped_file(tmp_path)
    rows = mapped[1000:1000 + 64 * 30].view(np.uint16).reshape(30, 32)
    assert pages.file_span(rows) == (str(path), 100 + 1000)
    assert pages.file_span(rows[:, ::2]) is None  # not contiguous: copied through memory instead
    assert pages.file_span(np.array(rows)) is None


def test_arrays_keep_their_values_in_one_aligned_read_only_buffer(tmp_path, monkeypatch):
    path, mapped = mapped_file(tmp_path)
    arrays = [mapped[7:7 + 3 * 34].reshape(3, 34),  # a mapped view at an odd offset: read from the file
              np.arange(15, dtype=np.float32).reshape(5, 3),
              np.arange(12, dtype=np.uint16).reshape(3, 4).T,  # strided: copied
              mapped[2000:2000 + 4096].view(np.float16)]
    reads = []
    real = pages._read_into

    def reading(f, offset, dest):
        reads.append(offset)
        real(f, offset, dest)
    monkeypatch.setattr(pages, "_read_into", reading)
    copies = pages.in_huge_pages(arrays)
    assert reads == [107, 2100]
    for a, c in zip(arrays, copies):
        assert c.dtype == a.dtype and c.shape == a.shape and c.flags.c_contiguous and not c.flags.writeable
        assert np.array_equal(c.view(np.uint8), np.ascontiguousarray(a).view(np.uint8))
        assert c.ctypes.data % pages.LINE == 0
    starts = [c.ctypes.data for c in copies]
    assert starts[0] % pages.HUGE_PAGE == 0 and starts == sorted(starts)
    assert starts[-1] + copies[-1].nbytes - starts[0] <= sum(-(-c.nbytes // 64) * 64 for c in copies)


def smaps_entry(address: int) -> list[str]:
    """The lines of /proc/self/smaps that describe the mapping holding `address`."""
    entry, inside = [], False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's first line: start-end perms ...
            start, end = (int(v, 16) for v in head.split("-"))
            inside = start <= address < end
        if inside:
            entry.append(line)
    return entry


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps is Linux's")
def test_the_buffer_is_private_memory_that_asks_for_huge_pages():
    """Private: shared anonymous memory would be shmem, which gets huge pages only by another setting;
    "hg" is the kernel's mark of madvise(MADV_HUGEPAGE). Whether it grants them depends on the machine."""
    buf = pages.huge_page_buffer(3 * pages.HUGE_PAGE)
    entry = smaps_entry(buf.ctypes.data)
    assert entry and entry[0].split()[1].endswith("p")
    assert "hg" in next(line for line in entry if line.startswith("VmFlags")).split()


def rss_file_kb() -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssFile:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status is Linux's")
def test_the_file_pages_under_a_copied_array_are_let_go(tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(np.arange(48 << 20, dtype=np.uint32).astype(np.uint8).tobytes())
    mapped = np.memmap(path, dtype=np.uint8, mode="r", offset=1000)
    view = mapped[5000:5000 + (40 << 20)]
    assert int(view[::4096].sum()) >= 0  # pages in, as the load's checks read them
    before = rss_file_kb()
    copy, = pages.in_huge_pages([view])
    assert before - rss_file_kb() > (40 << 10) - 64  # KiB: all but the two edge pages
    assert np.array_equal(copy, view) and int(view[12345]) == int(copy[12345])  # the mapping still reads


def test_a_file_shorter_than_its_mapping_says_is_an_error(tmp_path):
    path, mapped = mapped_file(tmp_path)
    view = mapped[5000:6000]
    with open(path, "r+b") as f:
        f.truncate(5500)  # the view's bytes past 5500 are gone (the mapping is not read)
    with pytest.raises(OSError, match=r"weights.bin ended at byte 5500 inside a tensor that should end at "
                                      r"byte 6100"):
        pages.in_huge_pages([view])


def test_placement_copies_the_matrices_and_the_mapped_vectors_only_when_asked(tiny_dir, tmp_path):
    """float32 vectors (a GGUF's norms) widen to views of the file: with huge pages they are copied too, so
    that nothing reads the file's mapping after the load."""
    convert.write(tmp_path / "tiny.gguf", load_checkpoint(tiny_dir), "q8_0", report=False)
    tensors = load_checkpoint(tmp_path / "tiny.gguf").tensors
    vectors = {n for n, t in tensors.items() if len(t.shape) == 1}
    mapped = with_activations(CPU, "exact").place(tensors, vectors)
    huge = with_activations(CPU, "exact", huge_pages=True).place(tensors, vectors)
    assert mapped.keys() == huge.keys()
    for name, t in huge.items():
        if isinstance(t, StoredTensor):
            assert mapped[name].data is tensors[name].data
            assert not np.shares_memory(t.data, tensors[name].data)
            assert np.array_equal(t.data, tensors[name].data) and (t.dtype, t.shape) == (mapped[name].dtype,
                                                                                         mapped[name].shape)
        else:
            assert np.array_equal(t, mapped[name]) and pages.file_span(t) is None
    assert any(pages.file_span(t) is not None for name, t in mapped.items() if name in vectors)


def test_a_model_in_huge_pages_transcribes_the_same(tiny_dir, tiny_model):
    model = Model.load(str(tiny_dir), huge_pages=True)
    assert model.backend.huge_pages and not tiny_model.backend.huge_pages
    wave = speech_like(2.0, 3)
    got = model.transcribe(wave, sample_rate=16000, max_new_tokens=6, ignore_stop=True)
    expected = tiny_model.transcribe(wave, sample_rate=16000, max_new_tokens=6, ignore_stop=True)
    assert [s.token_ids for s in got.segments] == [s.token_ids for s in expected.segments]


def test_huge_pages_option_is_checked():
    with pytest.raises(OptionError, match="huge_pages must be True or False; got 'yes'"):
        with_activations(CPU, "exact", huge_pages="yes")
