"""numba's njit for the CPU kernels, whose disk cache follows every kernel source, not only the function's
own.

numba files a cached function under the contents of the file that defines it, its bytecode and its closure:
a compiled driver carries the code of everything it calls (IR helpers, block decoders, njit functions of
other modules), and an edit to one of those would leave it stale. SOURCES, a digest of every .py under
nanoasr/kernels/ taken once at import, joins the key of every function compiled with cache=True here, so
that any edit to any kernel file compiles them again on their next call.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numba
from numba.core.caching import FunctionCache

KERNELS = Path(__file__).resolve().parent


def sources_digest(root: Path = KERNELS) -> str:
    """sha256 over the relative path and contents of every .py under root, in path order."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


SOURCES = sources_digest()


class SourcesCache(FunctionCache):
    """numba's disk cache of one function, its entries keyed on SOURCES as well (read when a key is made)."""

    def _index_key(self, sig, codegen):
        return super()._index_key(sig, codegen) + (SOURCES,)


def njit(**options):
    """numba.njit(**options); with cache=True the function is cached on disk by SourcesCache."""
    cache = options.pop("cache", False)

    def compile_lazily(function):
        dispatcher = numba.njit(**options)(function)
        if cache:
            dispatcher._cache = SourcesCache(function)  # as numba's enable_caching() does, with our key
        return dispatcher
    return compile_lazily
