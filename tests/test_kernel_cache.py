"""numba's disk cache of the CPU kernels follows every kernel source (nanoasr/kernels/jit.py): the digest
changes with any file under nanoasr/kernels/, a changed digest compiles a cached function again, and every
cached kernel is keyed on it. The cache is kept in the first writable of NUMBA_CACHE_DIR, the sources'
__pycache__ and the user's cache (or nowhere, with a warning), and a process that compiles logs it once."""
import importlib
import json
import logging
import os
import subprocess
import sys
import textwrap

from numba.core.caching import NullCache
from numba.core.dispatcher import Dispatcher

from nanoasr.kernels import jit

CACHED = textwrap.dedent("""
    import json
    import logging
    import sys

    from nanoasr.kernels import jit

    notices = []
    jit.log.addHandler(logging.Handler())
    jit.log.handlers[-1].emit = lambda record: notices.append(record.getMessage())
    jit.log.setLevel(logging.INFO)
    jit.SOURCES = sys.argv[1]


    @jit.njit(cache=True)
    def plus_one(x):
        return x + 1


    @jit.njit(cache=True)
    def plus_two(x):
        return x + 2


    plus_one(1), plus_two(1)
    stats = [plus_one.stats, plus_two.stats]
    print(json.dumps([sum(sum(s.cache_hits.values()) for s in stats),
                      sum(sum(s.cache_misses.values()) for s in stats), notices]))
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


def test_a_changed_digest_compiles_again_and_says_so_once(tmp_path):
    """The same two functions, cached on disk under NUMBA_CACHE_DIR: loaded while the digest stays, compiled
    again once it changes; a process that compiles logs it once, one that loads them says nothing."""
    script = tmp_path / "cached.py"
    script.write_text(CACHED)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run(digest):  # -> [cache hits, cache misses, notices]
        done = subprocess.run([sys.executable, str(script), digest], env=env, capture_output=True, text=True,
                              check=True)
        return json.loads(done.stdout)
    notice = [jit.COMPILING % (jit.COMPILE_S, tmp_path / "cache")]
    cold, warm = [0, 2, notice], [2, 0, []]
    assert [run("a"), run("a"), run("b"), run("b")] == [cold, warm, cold, warm]
    assert len(list((tmp_path / "cache").rglob("cached.plus_one-*.nbi"))) == 1


def test_the_cache_falls_back_to_the_users_cache_then_to_none(tmp_path, monkeypatch, caplog):
    """Where the sources' directories take no file (an installed package), the user's cache; where that
    takes none either, no cache place, and kernels defined then compile in every process, with one warning."""
    refused = [jit.KERNELS]
    writable = jit.writable
    monkeypatch.setattr(jit, "writable",
                        lambda d: not any(d.is_relative_to(r) for r in refused) and writable(d))
    monkeypatch.setattr(jit.config, "CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    jit.cache_place.cache_clear()
    try:
        place = jit.cache_place()
        assert (place.where, place.root) == ("the user's cache", tmp_path / "xdg" / "nanoasr" / "numba")
        assert all(d.is_relative_to(place.root) and d.is_dir() for d in place.directories())
        refused.append(tmp_path / "xdg")
        jit.cache_place.cache_clear()
        jit.uncached.cache_clear()
        assert jit.cache_place() is None
        with caplog.at_level(logging.WARNING, logger=jit.log.name):
            kernels = [jit.njit(cache=True)(lambda x: x + n) for n in range(2)]
        assert all(isinstance(k._cache, NullCache) for k in kernels) and kernels[1](1) == 2
        (warning,) = caplog.records
        assert "no writable directory for the compiled kernels" in warning.getMessage()
    finally:
        jit.cache_place.cache_clear()
        jit.uncached.cache_clear()


def cached_dispatchers(module) -> list:
    """The numba functions a kernel module defines with a disk cache (its driver tables' too)."""
    found = []
    for value in vars(module).values():
        for item in value.values() if isinstance(value, dict) else [value]:
            if (isinstance(item, Dispatcher) and item.py_func.__module__ == module.__name__
                    and not isinstance(item._cache, NullCache)):
                found.append(item)
    return found


def test_every_cached_kernels_closure_pickles_the_same_in_every_process():
    """numba keys a cached function by its closure's pickled contents: plain values pickle alike in every
    process, a dispatcher (or another object) need not, and would compile the function again in each."""
    plain = (str, int, float, bool, type(None), tuple)
    closures = {f"{d.py_func.__module__}.{d.py_func.__qualname__}": [type(c.cell_contents).__name__
                                                                     for c in d.py_func.__closure__ or ()]
                for name in KERNEL_MODULES for d in cached_dispatchers(importlib.import_module(
                    f"nanoasr.kernels.{name}"))}
    assert {k: v for k, v in closures.items() if set(v) - {t.__name__ for t in plain}} == {}


def test_every_cached_kernel_is_keyed_on_the_sources():
    dispatchers = [d for name in KERNEL_MODULES
                   for d in cached_dispatchers(importlib.import_module(f"nanoasr.kernels.{name}"))]
    assert len(dispatchers) > 30
    assert all(isinstance(d._cache, jit.SourcesCache) for d in dispatchers)
