"""numba's disk cache of the CPU kernels follows every kernel source (nanoasr/kernels/jit.py): the digest
changes with any file under nanoasr/kernels/, a changed digest compiles a cached function again, and every
cached kernel is keyed on it."""
import importlib
import json
import os
import subprocess
import sys
import textwrap

from numba.core.caching import NullCache
from numba.core.dispatcher import Dispatcher

from nanoasr.kernels import jit

CACHED = textwrap.dedent("""
    import json
    import sys

    from nanoasr.kernels import jit

    jit.SOURCES = sys.argv[1]


    @jit.njit(cache=True)
    def plus_one(x):
        return x + 1


    plus_one(1)
    stats = plus_one.stats
    print(json.dumps([sum(stats.cache_hits.values()), sum(stats.cache_misses.values())]))
""")
KERNEL_MODULES = ["attention", "blas_split", "decode_layer", "elementwise", "softmax", "bf16.amx",
                  "bf16.avx512", "int8.dot", "int8.gemm", "stored.float_rows", "stored.widening"]


def test_the_digest_follows_every_source_file(tmp_path):
    (tmp_path / "ir").mkdir()
    (tmp_path / "driver.py").write_text("def driver(): pass\n")
    (tmp_path / "ir" / "helper.py").write_text("LANES = 16\n")
    (tmp_path / "notes.txt").write_text("not a source\n")
    before = jit.sources_digest(tmp_path)
    (tmp_path / "notes.txt").write_text("still not a source\n")
    assert jit.sources_digest(tmp_path) == before
    (tmp_path / "ir" / "helper.py").write_text("LANES = 8\n")
    assert jit.sources_digest(tmp_path) != before


def test_a_changed_digest_compiles_again(tmp_path):
    """The same function, cached on disk: loaded while the digest stays, compiled again once it changes."""
    script = tmp_path / "cached.py"
    script.write_text(CACHED)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run(digest):  # -> [cache hits, cache misses]
        done = subprocess.run([sys.executable, str(script), digest], env=env, capture_output=True, text=True,
                              check=True)
        return json.loads(done.stdout)
    assert [run("a"), run("a"), run("b"), run("b")] == [[0, 1], [1, 0], [0, 1], [1, 0]]


def cached_dispatchers(module) -> list:
    """The numba functions a kernel module defines with a disk cache (its driver tables' too)."""
    found = []
    for value in vars(module).values():
        for item in value.values() if isinstance(value, dict) else [value]:
            if (isinstance(item, Dispatcher) and item.py_func.__module__ == module.__name__
                    and not isinstance(item._cache, NullCache)):
                found.append(item)
    return found


def test_every_cached_kernel_is_keyed_on_the_sources():
    dispatchers = [d for name in KERNEL_MODULES
                   for d in cached_dispatchers(importlib.import_module(f"nanoasr.kernels.{name}"))]
    assert len(dispatchers) > 30
    assert all(isinstance(d._cache, jit.SourcesCache) for d in dispatchers)
