"""The host's policy: how many threads numba's kernels and BLAS run (threads), and the CPU's copy of the
weight matrices in huge pages (in_huge_pages).

Threads: nothing is set process-wide; a block runs inside threads(n) and the pools are as they were after it.
numba's pool is started by start_numba_threads, its idle workers spinning only briefly before they sleep
(numba's default OpenMP layer loads libgomp, whose idle workers spin for milliseconds: on a machine shared
with other work, or with a second transcription, they took the cores the working threads needed). Where
the `tbb` package is installed (a dependency on x86-64 Linux), numba runs its TBB layer instead, which shares
a busy machine better still: two transcriptions at once took 1.5x one alone's time against OpenMP's 2.0x
(docs/reports/contention.md).

Pages: the copy is one anonymous buffer that asks the OS for 2 MiB pages. Every decode step streams all of the
decoder's matrices. Read through the checkpoint's file mapping where the page cache holds the file in 4 KiB
pages (nanoasr/formats/mapping.py says when) they stream measurably slower than from 2 MiB pages
(`tools/bench/bench.py --huge-pages both`; the likely causes: a page walk every 4 KiB, and hardware
prefetch stopping at page edges). Matrices that view a file mapping are read from the file
into the buffer, not copied through the mapping, and the mapping's pages under them are let go, so that the
process does not hold both. Linux gives huge pages to memory that asks for them (madvise) when transparent
huge pages are "always" or "madvise"; elsewhere the buffer is ordinary memory.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import sys
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from functools import cache
from typing import NamedTuple

import numpy as np

from nanoasr.formats.mapping import ask_for_huge_pages

HUGE_PAGE = 2 << 20
LINE = 64  # each array starts on a cache line


def huge_page_buffer(nbytes: int) -> np.ndarray:
    """uint8 [nbytes] of fresh anonymous memory, starting on a 2 MiB boundary, in huge pages where the OS
    gives them."""
    if hasattr(mmap, "MAP_PRIVATE"):  # private: shared anonymous memory is shmem, whose huge pages follow
        # another setting (usually off)
        region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    else:  # Windows
        region = mmap.mmap(-1, nbytes + HUGE_PAGE)
    ask_for_huge_pages(region)
    whole = np.frombuffer(region, np.uint8)  # keeps the region open while any view lives
    start = -whole.ctypes.data % HUGE_PAGE
    return whole[start:start + nbytes]


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def file_span(a: np.ndarray) -> tuple[str, int] | None:
    """(file, byte offset) where a C-contiguous array that views a np.memmap starts in its file, else None."""
    root = _root(a)
    if not (isinstance(root, np.memmap) and root.filename and a.flags.c_contiguous):
        return None
    return str(root.filename), root.offset + a.ctypes.data - root.ctypes.data


def release(a: np.ndarray) -> None:
    """Let go of the file pages under an array that views a read-only np.memmap (the page cache keeps them; a
    later read maps them again): the load's checks have read them, and the copy need not sit beside them in
    the process's memory. Without numpy's handle on the mapping (`_mmap`, not public) they stay."""
    root = _root(a)
    mapping = getattr(root, "_mmap", None)
    if mapping is None or getattr(root, "mode", None) != "r" or not hasattr(mmap, "MADV_DONTNEED"):
        return
    at = a.ctypes.data - root.ctypes.data + root.offset % mmap.ALLOCATIONGRANULARITY  # where in the mapping
    first = -(-at // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages only: a neighbour's may share the edges
    end = (at + a.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > first:
        mapping.madvise(mmap.MADV_DONTNEED, first, end - first)


def in_huge_pages(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The arrays' values in one huge-page buffer, each C-contiguous, read-only, on its own cache line."""
    sizes = [-(-a.nbytes // LINE) * LINE for a in arrays]
    buf = huge_page_buffer(sum(sizes))
    files = {}
    copies, at = [], 0
    try:
        for a, size in zip(arrays, sizes):
            dest = buf[at:at + a.nbytes]
            span = file_span(a)
            if span is None:
                dest[:] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            else:
                name, offset = span
                if name not in files:
                    files[name] = open(name, "rb", buffering=0)
                _read_into(files[name], offset, dest)
                release(a)
            copy = dest.view(a.dtype).reshape(a.shape)
            copy.flags.writeable = False
            copies.append(copy)
            at += size
    finally:
        for f in files.values():
            f.close()
    return copies


def _read_into(f, offset: int, dest: np.ndarray) -> None:
    view, done = memoryview(dest), 0
    f.seek(offset)
    while done < len(view):
        got = f.readinto(view[done:])
        if not got:
            raise OSError(f"{f.name} ended at byte {offset + done} inside a tensor that should end at byte "
                          f"{offset + len(view)}")
        done += got


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the system tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# True inside threads(..., numba_products=True): numba's threads, awake for the products, also share out the
# rows of the CPU table's elementwise kernels (serial otherwise: between BLAS products, waking numba's threads
# costs more than it saves).
NUMBA_PRODUCTS: ContextVar[bool] = ContextVar("NUMBA_PRODUCTS", default=False)


@contextmanager
def threads(n: int | None, numba_products: bool = False):
    """At most n threads in numba's kernels and in BLAS inside the block (the host's pools; None: as they
    are). With numba_products (Backend.numba_products), BLAS is kept to the calling thread, since its own
    threads spin for a while after each call on the cores numba's threads need, and NUMBA_PRODUCTS is set."""
    if n is None and not numba_products:
        yield
        return
    import numba  # here, not at the top: importing nanoasr does not load numba
    from threadpoolctl import threadpool_limits

    start_numba_threads()

    previous = numba.get_num_threads()
    if n is not None:
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    token = NUMBA_PRODUCTS.set(numba_products)
    try:  # each threadpool_limits reads the loaded libraries: only the limits asked for
        with threadpool_limits(limits=n) if n is not None else nullcontext(), \
                threadpool_limits(limits=1, user_api="blas") if numba_products else nullcontext():
            yield
    finally:
        NUMBA_PRODUCTS.reset(token)
        numba.set_num_threads(previous)


# How long an idle OpenMP worker of numba's spins before it sleeps, where the user has not said: tens of
# microseconds (GOMP_SPINCOUNT counts pause instructions, 10^3 of them 30-60 us; KMP_BLOCKTIME, for LLVM's
# and Intel's runtimes, milliseconds, 1 the least above none). A worker that spins while the thread it waits
# for has no core holds that core from it: two transcriptions at once on 2 cores took 3.9x one alone's time
# with 10^4 and 1.8x with 10^3, and one alone the same time (docs/reports/contention.md); libgomp's own
# 3 * 10^5 spins for milliseconds.
OMP_SPIN = {"GOMP_SPINCOUNT": "1000", "KMP_BLOCKTIME": "1"}
WAIT_SETTINGS = ("OMP_WAIT_POLICY", *OMP_SPIN)


class ThreadPolicy(NamedTuple):
    layer: str  # numba's threading layer: "tbb", "omp" or "workqueue"
    wait: str  # how its idle workers wait


@cache
def start_numba_threads() -> ThreadPolicy:
    """Start numba's thread pool, once, with idle workers that do not outlive the work: numba's choice of
    layer (NUMBA_THREADING_LAYER where set; else TBB where installed, its runtime loaded from the `tbb`
    wheel by _load_tbb, else OpenMP),
    and for OpenMP the bounded spin OMP_SPIN where neither it nor OMP_WAIT_POLICY is set. The runtime reads
    these as it loads, so they are in the environment only while numba loads it; an OpenMP runtime that
    another library loaded first keeps its own."""
    import numba
    from numba.np.ufunc import parallel

    if not parallel._is_initialized and numba.config.THREADING_LAYER not in ("omp", "workqueue"):
        _load_tbb()
    if parallel._is_initialized or any(name in os.environ for name in WAIT_SETTINGS):
        numba.get_num_threads()
        layer = numba.threading_layer()
        return ThreadPolicy(layer, _wait_described() if layer == "omp" else _own_wait(layer))
    loaded_before = _libgomp_loaded()
    os.environ.update(OMP_SPIN)
    try:
        numba.get_num_threads()  # loads the threading layer, and with it the OpenMP runtime
    finally:
        for name in OMP_SPIN:
            del os.environ[name]
    layer = numba.threading_layer()
    if layer != "omp":
        return ThreadPolicy(layer, _own_wait(layer))
    if loaded_before:
        return ThreadPolicy(layer, "the OpenMP runtime's own (loaded before nanoasr)")
    return ThreadPolicy(layer, "spin then sleep: " + ", ".join(f"{k}={v}" for k, v in OMP_SPIN.items()))


def _own_wait(layer: str) -> str:  # how the workers of a layer that reads no OpenMP setting wait
    return "its own (sleeps when idle)" if layer == "workqueue" else "its own"


def _wait_described() -> str:
    chosen = [f"{name}={os.environ[name]}" for name in WAIT_SETTINGS if name in os.environ]
    return "as set: " + ", ".join(chosen) if chosen else "as numba's pool was started"


def _load_tbb() -> None:
    """Load the TBB runtime of the `tbb` wheel, where it is installed, so that numba's TBB layer finds it:
    pip puts libtbb.so.12 in the environment's lib/, where the loader does not look, and numba would fall
    back to OpenMP without a word."""
    from importlib import metadata

    if not sys.platform.startswith("linux"):
        return
    try:
        library = tbb_library(metadata.distribution("tbb"))
    except metadata.PackageNotFoundError:
        return
    if library is not None:
        try:
            ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
        except OSError:  # a broken install: numba runs its OpenMP layer, as without the package
            return


def tbb_library(distribution) -> os.PathLike | None:
    """The path of libtbb.so.12 among an installed distribution's files, or None."""
    for file in distribution.files or ():
        if file.name == "libtbb.so.12":
            return distribution.locate_file(file)
    return None


def _libgomp_loaded() -> bool:
    """Whether GNU OpenMP is in this process already (where the loader can say without loading it)."""
    if not hasattr(os, "RTLD_NOLOAD"):
        return False
    try:
        ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return False
    return True
