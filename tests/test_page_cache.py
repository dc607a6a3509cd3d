"""Weight files' mappings and the page cache under them (nanoasr/formats/mapping.py): mappings are read-only
and ask for huge pages; files nanoasr writes or downloads are flushed and let go of the page cache; the share
of a file mapped in 2 MiB pages is read from smaps."""
import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from nanoasr import convert, hub
from nanoasr.backend import host as pages
from nanoasr.formats import gguf_write, mapping
from tests.test_gguf import random_checkpoint
from tests.test_huge_pages import smaps_entry
from tests.test_hub import fake_hub, hf_env  # noqa: F401 (fixtures)


def random_file(path: Path, nbytes: int = 50_000) -> bytes:
    data = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("offset,size", [(0, None), (4096, None), (1000, 3000), (49_999, 1)])
def test_a_mapping_holds_the_file_bytes_read_only(tmp_path, offset, size):
    data = random_file(tmp_path / "w.bin")
    mapped = mapping.map_read_only(tmp_path / "w.bin", offset, size)
    end = len(data) if size is None else offset + size
    assert mapped.tobytes() == data[offset:end]
    with pytest.raises(ValueError):
        mapped[0] = 1


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"),
                    reason="madvise(MADV_HUGEPAGE) and /proc/self/smaps are Linux's")
def test_a_mapping_asks_for_huge_pages(tmp_path):
    path = tmp_path / "w.bin"
    random_file(path)
    mapped = mapping.map_read_only(path)
    entry = smaps_entry(mapped.ctypes.data)
    assert entry and entry[0].rstrip().endswith(str(path))
    assert "hg" in next(line for line in entry if line.startswith("VmFlags")).split()  # VM_HUGEPAGE


def test_a_kernel_that_refuses_huge_pages_still_maps_the_file(tmp_path, monkeypatch):
    data = random_file(tmp_path / "w.bin")
    monkeypatch.setattr(mmap, "MADV_HUGEPAGE", 12345, raising=False)  # no such advice: EINVAL, as without THP
    assert mapping.map_read_only(tmp_path / "w.bin").tobytes() == data
    buf = pages.huge_page_buffer(4096)
    buf[:] = 7
    assert int(buf.sum()) == 7 * 4096


def test_leaving_the_page_cache_flushes_first_and_keeps_the_file(tmp_path, monkeypatch):
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise on this OS")
    path = tmp_path / "w.bin"
    data = random_file(path)
    calls = []
    real_fsync, real_fadvise = os.fsync, os.posix_fadvise
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, at, n, advice: (
        calls.append((at, n, advice)), real_fadvise(fd, at, n, advice))[1])
    mapping.leave_page_cache(path)
    assert calls == ["fsync", (0, 0, os.POSIX_FADV_DONTNEED)]
    assert path.read_bytes() == data


SMAPS = """\
7f0000000000-7f0000600000 r--s 00000000 fe:00 12 {path}
Size:               6144 kB
Rss:                6144 kB
FilePmdMapped:      4096 kB
VmFlags: rd mr me ms hg
7f0000800000-7f0000a00000 r--s 00600000 fe:00 12 {path}
Rss:                2048 kB
FilePmdMapped:         0 kB
7f0000c00000-7f0000e00000 r--s 00000000 fe:00 13 {other}
Rss:                2048 kB
FilePmdMapped:      2048 kB
7f0001000000-7f0001021000 rw-p 00000000 00:00 0                          [heap]
Rss:                 132 kB
FilePmdMapped:         0 kB
"""


def test_the_share_in_huge_pages_counts_every_mapping_of_the_files_and_nothing_else(tmp_path):
    path, other = tmp_path / "weights with spaces.gguf", tmp_path / "other.gguf"
    smaps = SMAPS.format(path=os.path.realpath(path), other=os.path.realpath(other))
    assert mapping.huge_page_share([path], smaps) == 4096 / (6144 + 2048)
    assert mapping.huge_page_share([path, other], smaps) == (4096 + 2048) / (6144 + 2048 + 2048)
    assert mapping.huge_page_share([tmp_path / "absent.gguf"], smaps) is None
    assert mapping.huge_page_share([], smaps) is None


def test_a_converted_file_leaves_the_page_cache_once_complete(tmp_path, monkeypatch):
    left = []
    monkeypatch.setattr(gguf_write, "leave_page_cache",
                        lambda p: left.append((Path(p), Path(p).is_file(), Path(p).stat().st_size)))
    out = tmp_path / "m.gguf"
    convert.write(out, random_checkpoint(), "q8_0", report=False)
    assert left == [(out, True, out.stat().st_size)]
    assert not list(tmp_path.glob("*.partial"))


def test_downloaded_files_leave_the_page_cache_and_cached_ones_stay(
        hf_env, fake_hub, monkeypatch):  # noqa: F811 (fixtures)
    left = []
    monkeypatch.setattr(hub, "leave_page_cache", lambda p: left.append(Path(p)))
    resolved = hub.resolve("q8", progress=False)
    assert left == [resolved.path]
    snapshot = hub.resolve("test/other", progress=False)  # a repo's snapshot: no list of files up front
    assert sorted(p.name for p in left[1:]) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert all(p.parent == snapshot.path for p in left[1:])
    left.clear()
    hub.resolve("q8", progress=False)
    hub.resolve("test/other", progress=False)
    assert left == []
