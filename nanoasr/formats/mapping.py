"""Weight files as read-only memory maps, and the size of the pages under them.

Every decode step streams all of the decoder's matrices from the checkpoint's mapping. How fast depends on
the page cache: where it holds the file in 2 MiB folios the kernel maps them with 2 MiB pages, and a step
reads measurably faster than through 4 KiB pages (`tools/bench/bench.py` reports the share of
the weights so mapped). Where the file system keeps large folios in the page cache (ext4 on
Linux 6.18 here), reading a file from disk fills the cache with large folios, but writing one leaves it in
4 KiB folios until they are evicted. So the files nanoasr writes or downloads are flushed and let go of
the page cache (`leave_page_cache`): their first load reads them from disk, in large folios. The mappings
ask for huge pages (MADV_HUGEPAGE), which makes a page fault read the file in whole 2 MiB folios.
"""
from __future__ import annotations

import mmap
import os
import re
from pathlib import Path

import numpy as np


def map_read_only(path: str | Path, offset: int = 0, size: int | None = None) -> np.memmap:
    """uint8 view of `size` bytes of the file from `offset` (to its end when None), read-only, asking the
    OS for huge pages."""
    mapped = np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=size)
    mapping = getattr(mapped, "_mmap", None)  # numpy's handle on the mapping: not public, so optional
    if mapping is not None:
        ask_for_huge_pages(mapping)
    return mapped


def ask_for_huge_pages(region: mmap.mmap) -> None:
    """madvise(MADV_HUGEPAGE) where the OS has it; a kernel built without transparent huge pages refuses it
    (EINVAL), and the memory stays in small pages."""
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            region.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass


def release_pages(array: np.ndarray) -> None:
    """Drop the pages of a view of a file mapping from this process's resident set (MADV_DONTNEED; the page
    cache keeps them, so a later read costs a page fault, not a disk read). Pages it shares with a
    neighbouring view go too and come back on use. Arrays not over a mapping, or not one contiguous range
    of it, are left alone."""
    mapping = getattr(array, "_mmap", None)  # numpy's handle on the mapping, as in map_read_only
    if mapping is None or not (array.flags.contiguous and array.nbytes and hasattr(mmap, "MADV_DONTNEED")):
        return
    offset = array.ctypes.data - np.frombuffer(mapping, np.uint8).ctypes.data
    start = offset - offset % mmap.PAGESIZE
    mapping.madvise(mmap.MADV_DONTNEED, start, offset + array.nbytes - start)


def leave_page_cache(path: str | Path) -> None:
    """Write a file's dirty pages to disk and drop its pages from the page cache (where the OS can), so that
    its next reader reads it from disk in large folios. Pages another process has mapped stay."""
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # the cache keeps dirty pages: write them first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


SMAPS_ENTRY = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+ +(?P<path>.*)$")


def huge_page_share(paths: list[str | Path], smaps: str | None = None) -> float | None:
    """The share of this process's resident pages of the files that are mapped in 2 MiB pages (FilePmdMapped
    over Rss in /proc/self/smaps, or the `smaps` text given); None where there is no such file or none of
    them is resident."""
    if smaps is None:
        try:
            smaps = Path("/proc/self/smaps").read_text()
        except OSError:
            return None
    wanted, counts, inside = {os.path.realpath(p) for p in paths}, {"Rss": 0, "FilePmdMapped": 0}, False
    for line in smaps.splitlines():
        entry = SMAPS_ENTRY.match(line)
        if entry:
            inside = entry["path"] in wanted
        elif inside and line.split(":")[0] in counts:
            counts[line.split(":")[0]] += int(line.split()[1])
    return counts["FilePmdMapped"] / counts["Rss"] if counts["Rss"] else None
