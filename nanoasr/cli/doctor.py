"""nanoasr doctor: what this machine offers nanoasr, for bug reports and "why is it slow" questions.

Versions, backends (CPU, CUDA/CuPy), BLAS and numba threads, CPU features, the compiled kernels' cache, and
the model that `--model` resolves to from local files (the doctor never downloads). Exits 0 (2 for a usage
error).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform

from nanoasr.cli import EXIT_OK

DISTRIBUTIONS = ("numpy", "numba", "llvmlite", "gguf", "safetensors", "tokenizers", "huggingface_hub",
                 "soundfile", "soxr", "threadpoolctl", "cupy-cuda12x", "cupy")
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vnni", "avx512bf16", "amx-tile")
PROC_FLAGS = {"avx512bf16": "avx512_bf16", "avx512vnni": "avx512_vnni", "amx-tile": "amx_tile"}
# on aarch64: LLVM's names, and /proc/cpuinfo's where they differ
ARM_CPU_FLAGS = ("neon", "dotprod", "i8mm", "sve", "bf16")
ARM_PROC_FLAGS = {"neon": "asimd", "dotprod": "asimddp"}
ENVIRONMENT = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_NUM_THREADS",
               "OPENBLAS_THREAD_TIMEOUT", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER",
               "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_CACHE_DIR", "XDG_CACHE_HOME", "HF_HOME",
               "HF_HUB_CACHE", "HF_ENDPOINT", "HF_HUB_OFFLINE")
STORED_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_k", "q6_k")
SECRETS = ("HF_TOKEN",)  # reported as set or not, never shown


def versions() -> dict:
    import nanoasr

    out = {"python": platform.python_version(), "nanoasr": nanoasr.__version__}
    for name in DISTRIBUTIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            if not name.startswith("cupy"):
                out[name] = None
    return out


def system() -> dict:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"platform": platform.platform(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "cpus_usable": affinity, "implementation": platform.python_implementation(),
            "transparent_huge_pages": transparent_huge_pages()}


def transparent_huge_pages(path: str = "/sys/kernel/mm/transparent_hugepage/enabled") -> str | None:
    """Linux's transparent huge pages setting (always, madvise or never: the bracketed choice), which decides
    whether Model.load(huge_pages=True) gets them; None where there is no such setting."""
    try:
        with open(path, encoding="ascii") as fh:
            words = fh.read().split()
    except OSError:
        return None
    return next((w.strip("[]") for w in words if w.startswith("[")), None)


def backends() -> dict:
    from nanoasr.backend import cuda_status

    usable, reason = cuda_status()
    return {"cpu": True, "cuda": usable, "cuda_status": reason}


def blas() -> list[dict]:
    import numpy  # noqa: F401  (loads the BLAS threadpoolctl reports)
    from threadpoolctl import threadpool_info

    keys = ("user_api", "internal_api", "version", "num_threads", "threading_layer", "architecture",
            "filepath")
    return [{k: pool.get(k) for k in keys if k in pool} for pool in threadpool_info()]


def numba_info() -> dict:
    try:
        import numba
    except ImportError as exc:
        return {"error": f"numba does not import: {exc}"}
    from nanoasr.backend import host

    out = {"threading_layer_requested": numba.config.THREADING_LAYER}
    try:  # the pool as nanoasr starts it
        out["threading_layer"], out["idle_threads"] = host.start_numba_threads()
    except Exception as exc:  # numba raises several kinds when no threading layer loads
        out["threading_layer"] = f"unavailable ({type(exc).__name__}: {exc})"
        return out
    return {**out, "threads": numba.get_num_threads(), "max_threads": numba.config.NUMBA_NUM_THREADS}


def on_arm() -> bool:
    return platform.machine().lower() in ("aarch64", "arm64")


def cpu() -> dict:
    """The CPU's name and the features the kernels ask for (x86's, or on aarch64 ARM's)."""
    try:
        import llvmlite.binding as llvm

        features = llvm.get_host_cpu_features()
        wanted = ARM_CPU_FLAGS if on_arm() else CPU_FLAGS
        return {"name": llvm.get_host_cpu_name(), "source": "llvmlite",
                "features": {f: bool(features.get(f, False)) for f in wanted}}
    except Exception:  # llvmlite missing or unable to query the host: fall back to the kernel's view
        return {"name": platform.processor() or None, "source": "/proc/cpuinfo", "features": _proc_flags()}


def kernels() -> dict:
    """The product paths this CPU runs for each `activations` choice that depends on its features (those of
    numba's target, which NUMBA_CPU_NAME / NUMBA_CPU_FEATURES may set: kernels/target.py), the activations
    "auto" takes for each stored type, and how the decode products prefetch their weights on this host."""
    from nanoasr.backend.cpu import resolved_activations
    from nanoasr.kernels import target
    from nanoasr.kernels.bf16 import amx, avx512
    from nanoasr.kernels.int8.dot import host_path

    path = host_path()
    prefetch = target.weight_prefetch()
    auto = ", ".join(f"{kind} {resolved_activations(kind, 'auto')}" for kind in STORED_TYPES)
    lacking = "dotprod" if on_arm() else "AVX2"
    return {"int8_decode": f"int8 ({path})" if path else f"float32 (no {lacking})",
            "int8_many_rows": f"int8 GEMM ({path})" if path else "float32 (widening + BLAS)",
            "bf16_many_rows": ("AMX tiles" if amx.available() else "bf16 GEMM (avx512bf16)"
                               if avx512.available() else "BLAS on bf16-rounded rows"),
            "weight_prefetch": f"into {prefetch.cache}, {prefetch.rows_ahead} rows ahead",
            "auto_activations": auto}


def kernel_cache() -> dict:
    """Where the compiled kernels are kept (nanoasr/kernels/jit.py: NUMBA_CACHE_DIR, else beside the kernel
    sources, else the user's cache), whether the default place beside the sources is writable, and what the
    cache holds: its compiled entries (one a kernel, stored type and activations; those of earlier kernel
    sources too) and their size."""
    from nanoasr.kernels import jit

    place = jit.cache_place()
    default = "yes" if all(jit.writable(d) for d in jit.CachePlace("beside the sources", jit.KERNELS)
                           .directories()) else "no"
    if place is None:
        return {"directory": None, "where": "none writable: the kernels compile in every process",
                "sources_writable": default}
    files = [f for d in place.directories() if d.is_dir() for f in d.iterdir()
             if f.suffix in (".nbi", ".nbc")]
    return {"directory": str(place.root), "where": place.where, "sources_writable": default,
            "compiled": sum(f.suffix == ".nbc" for f in files),
            "size_mb": round(sum(f.stat().st_size for f in files) / 2**20, 1)}


def _proc_flags(path: str = "/proc/cpuinfo") -> dict:
    field, names, wanted = ("Features", ARM_PROC_FLAGS, ARM_CPU_FLAGS) if on_arm() else (
        "flags", PROC_FLAGS, CPU_FLAGS)
    try:
        with open(path, encoding="utf-8") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith(field)), [])
    except OSError:
        return {}
    return {f: names.get(f, f) in flags for f in wanted}


def environment() -> dict:
    out = {name: os.environ.get(name) for name in ENVIRONMENT}
    out.update({name: "set" if os.environ.get(name) else None for name in SECRETS})
    return out


def model(value: str | None) -> dict:
    """What `--model value` resolves to from local files alone."""
    from nanoasr import hub
    from nanoasr.errors import NanoasrError

    try:
        resolved = hub.resolve(value, offline=True, progress=False)
    except NanoasrError as exc:
        return {"requested": value, "resolved": False, "error": str(exc)}
    package = resolved.package
    license, quant = (package.license, package.quant) if package else (None, None)
    if resolved.format == "gguf" and (license is None or quant is None):
        license, quant = _gguf_license_and_quant(resolved.path, license, quant)
    return {"requested": value, "resolved": True, "path": str(resolved.path), "repo": resolved.repo,
            "revision": resolved.revision, "format": resolved.format,
            "package": package.name if package else None, "license": license, "quant": quant}


def _gguf_license_and_quant(path, license, quant) -> tuple:
    """What a GGUF file's own keys say (general.license, general.file_type) where no package says it."""
    from gguf import LlamaFileType

    from nanoasr.errors import NanoasrError
    from nanoasr.formats.gguf_read import read_header

    try:
        values = read_header(path).values
    except (NanoasrError, OSError):  # the model section's other fields still tell what was found
        return license, quant
    file_type = values.get("general.file_type")
    if quant is None and file_type in LlamaFileType._value2member_map_:
        quant = LlamaFileType(file_type).name.lower().removeprefix("mostly_").removeprefix("all_")
    return license or values.get("general.license"), quant


def report(model_value: str | None) -> dict:
    found = model(model_value)
    return {"versions": versions(), "system": system(), "backends": backends(), "blas": blas(),
            "numba": numba_info(), "cpu": cpu(), "kernels": kernels(), "kernel_cache": kernel_cache(),
            "environment": environment(),
            "model": found, **({"plan": plan(model_value)} if found["resolved"] else {})}


def plan(value: str | None) -> dict:
    """The Plan of the model `--model value` loads, with the default options, from local files alone."""
    from nanoasr.api import Model
    from nanoasr.errors import NanoasrError

    try:
        loaded = Model.load(value, offline=True, progress=False)
    except NanoasrError as exc:
        return {"error": str(exc)}
    rows = ", ".join(f"{kind} {rows}" for kind, rows in loaded.plan.activations)
    return {**dataclasses.asdict(loaded.plan), "activations": rows}


def format_text(data: dict) -> str:
    lines = []
    for section, body in data.items():
        lines.append(f"[{section}]")
        if section == "blas":
            body = {f"{pool.get('internal_api')} {i}":
                    ", ".join(f"{k}={v}" for k, v in pool.items() if k != "internal_api")
                    for i, pool in enumerate(body)} or {"none": "threadpoolctl found no BLAS or OpenMP pool"}
        if section == "cpu":
            body = dict(body, features=" ".join(f if on else f"-{f}" for f, on in body["features"].items()))
        width = max(len(k) for k in body) + 1
        lines += [f"  {k + ':':<{width}} {'-' if v is None else v}" for k, v in body.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nanoasr doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None,
                        help="model to look for (default: $NANOASR_MODEL or the config file's model, "
                             "else the default package)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    data = report(args.model)
    print(json.dumps(data, indent=1, ensure_ascii=False) if args.json else format_text(data))
    return EXIT_OK
