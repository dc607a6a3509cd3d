"""numba's njit for the CPU kernels: a disk cache that follows every kernel source, kept in a writable place,
and a log line when a kernel is compiled rather than loaded from it.

numba files a cached function under the contents of the file that defines it, its bytecode and its closure:
a compiled driver carries the code of everything it calls (IR helpers, block decoders, njit functions of
other modules), and an edit to one of those would leave it stale. SOURCES, a digest of every .py under
nanoasr/kernels/ taken once at import, joins the key of every function compiled with cache=True here, so
that any edit to any kernel file compiles them again on their next call.

Where the compiled kernels are kept (cache_place, decided once per process): under NUMBA_CACHE_DIR where the
user set it, else in __pycache__ beside the kernel sources (numba's own default) where those are writable,
else in the user's cache directory ($XDG_CACHE_HOME/nanoasr/numba or ~/.cache/nanoasr/numba), as for a package
installed where its user cannot write. The choice is made by this module's cache locator, which only
nanoasr's kernels use: no environment variable or numba setting changes, so other libraries' numba functions
keep numba's own rules. Where nothing is writable the kernels are not cached and compile in every process.

The first kernel a process compiles (a cache miss, not a load) logs COMPILING once at INFO on this module's
logger: the command line shows it, the library only logs it.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numba
from numba.core import config
from numba.core.caching import (CompileResultCacheImpl, FunctionCache, _CacheLocator,
                                _SourceFileBackedLocatorMixin)

KERNELS = Path(__file__).resolve().parent
COMPILING = "compiling kernels for this CPU (first run only, about %d s; cached in %s)"
# a first run's extra s on 2 cores: 10-13 on a Zen 4 (docs/reports/first_run.md); in one process that compiles
# everything, 19 there and 35 on an AVX2 Zen 3 (docs/speed.md, docs/reports/speed-zen3.md)
COMPILE_S = 30
log = logging.getLogger(__name__)
_compiled = False  # whether this process has compiled a cached kernel (and said so)


def sources_digest(root: Path = KERNELS) -> str:
    """sha256 over the relative path and contents of every .py under root, in path order."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


SOURCES = sources_digest()


@dataclass(frozen=True)
class CachePlace:
    where: str  # "NUMBA_CACHE_DIR", "beside the sources" or "the user's cache"
    root: Path  # the directory under which every kernel source directory has its cache directory

    def directory(self, source_dir: Path) -> Path:
        """The cache directory of the functions defined in source_dir (numba's naming under a cache root)."""
        if self.where == "beside the sources":
            return source_dir / "__pycache__"
        return self.root / _CacheLocator.get_suitable_cache_subpath(str(source_dir / "_.py"))

    def directories(self) -> list[Path]:
        """The cache directory of each directory holding kernel sources."""
        return [self.directory(d) for d in sorted({p.parent for p in KERNELS.rglob("*.py")})]


def user_cache_root() -> Path:
    """$XDG_CACHE_HOME/nanoasr/numba where that variable holds an absolute path, else
    ~/.cache/nanoasr/numba."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "nanoasr" / "numba"


def writable(directory: Path) -> bool:
    """Whether directory exists or can be made, and takes a new file (numba's own test of a cache place)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
    except OSError:
        return False
    return True


@cache
def cache_place() -> CachePlace | None:
    """Where this process keeps the compiled kernels: the first writable of NUMBA_CACHE_DIR (when set),
    __pycache__ beside the sources, the user's cache; None when none is writable."""
    candidates = [CachePlace("beside the sources", KERNELS),
                  CachePlace("the user's cache", user_cache_root())]
    if config.CACHE_DIR:
        candidates.insert(0, CachePlace("NUMBA_CACHE_DIR", Path(config.CACHE_DIR)))
    return next((p for p in candidates if all(writable(d) for d in p.directories())), None)


class KernelCacheLocator(_SourceFileBackedLocatorMixin, _CacheLocator):
    """numba's cache locator for nanoasr's kernels: the directory cache_place() gives their source file."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(cache_place().directory(Path(py_file).resolve().parent))

    def get_cache_path(self):
        return self._cache_path

    @classmethod
    def from_function(cls, py_func, py_file):
        return super().from_function(py_func, py_file) if cache_place() is not None else None


class KernelCacheImpl(CompileResultCacheImpl):
    _locator_classes = [KernelCacheLocator]


class SourcesCache(FunctionCache):
    """numba's disk cache of one function, its entries keyed on SOURCES as well (read when a key is made),
    kept where cache_place() says; a miss (the function is about to compile) is logged once per process."""

    _impl_class = KernelCacheImpl

    def _index_key(self, sig, codegen):
        return super()._index_key(sig, codegen) + (SOURCES,)

    def load_overload(self, sig, target_context):
        loaded = super().load_overload(sig, target_context)
        if loaded is None:
            compiling()
        return loaded


def on_disk(dispatcher) -> bool:
    """Whether `dispatcher` (made by njit here) is kept in the disk cache."""
    return isinstance(dispatcher._cache, SourcesCache)


def is_cached(dispatcher, types: tuple) -> bool:
    """Whether the disk cache holds `dispatcher` (on_disk) compiled for argument `types` on this CPU, from
    these sources."""
    cache = dispatcher._cache
    key = cache._index_key(types, dispatcher.targetctx.codegen())
    return key in cache._cache_file._load_index()


def compiling() -> None:
    """Log COMPILING, the first time this process compiles a cached kernel."""
    global _compiled
    if not _compiled:
        _compiled = True
        log.info(COMPILING, COMPILE_S, cache_place().root)


def njit(**options):
    """numba.njit(**options); with cache=True the function is cached on disk by SourcesCache (or compiled in
    every process, with a warning, where no cache place is writable)."""
    cached = options.pop("cache", False)

    def compile_lazily(function):
        dispatcher = numba.njit(**options)(function)
        if cached and cache_place() is not None:
            dispatcher._cache = SourcesCache(function)  # as numba's enable_caching() does, with our key
        elif cached:
            uncached()
        return dispatcher
    return compile_lazily


@cache
def uncached() -> None:
    """Warn, once, that the kernels compile in every process."""
    log.warning("no writable directory for the compiled kernels (NUMBA_CACHE_DIR, %s, %s): they compile "
                "again in every process; set NUMBA_CACHE_DIR to a writable directory", KERNELS,
                user_cache_root())
