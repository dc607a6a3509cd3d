"""tools/arm_check.sh's help for a CPU that qemu-user emulates.

As a pytest plugin (`-p tools.lib.emulated_arm`, in the aarch64 process): qemu-user emulates the CPU that -cpu
names (max: dotprod and i8mm among its features) but shows the host's /proc/cpuinfo, where LLVM's query of
the host finds no AArch64 feature; the kernels' features (kernels/target.py) become those NUMBA_CPU_FEATURES
turns on ("+neon,+dotprod,+i8mm"), which numba compiles for.

As a script (`python -m tools.lib.emulated_arm`, on the x86 machine, with the same NUMBA_CPU_NAME,
NUMBA_CPU_FEATURES and NUMBA_CACHE_DIR): numba compiles the int8 products of the AArch64 paths for an aarch64
target into its disk cache, where the aarch64 process finds them, as LLVM run under emulation takes many
minutes a product. The code is the same: numba, llvmlite and the target (triple, CPU name, features, which
key the cache) are the aarch64 process's.
"""
import os

import llvmlite.binding as llvm

AARCH64 = "aarch64-unknown-linux-gnu"


def emulated_features() -> dict[str, bool]:
    flags = os.environ.get("NUMBA_CPU_FEATURES", "").split(",")
    return {flag.strip()[1:]: True for flag in flags if flag.strip().startswith("+")}


def pytest_configure(config):
    from nanoasr.kernels import target

    if target.architecture() != "aarch64":
        raise SystemExit("tools.lib.emulated_arm: a plugin for an aarch64 process (tools/arm_check.sh)")
    target.features = emulated_features


def compile_int8_products() -> list[str]:
    """The int8 drivers of the AArch64 paths compiled for an aarch64 target (numba's code generation is
    told the process is one before it starts) with the arguments the products pass them."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.get_process_triple = lambda: AARCH64
    from numba import types

    from nanoasr.kernels import target

    target.features = emulated_features
    from nanoasr.kernels.int8.dot import ARM_PATHS, KINDS, MATVEC_INT8
    from nanoasr.kernels.int8.gemm import GEMM_INT8

    matrix = types.Array(types.float32, 2, "C")
    signature = (matrix, types.Array(types.uint8, 2, "C"), types.int64, matrix)
    done = []
    for path in ARM_PATHS:
        for kind in KINDS:
            for drivers in (MATVEC_INT8, GEMM_INT8):
                drivers[kind, path].compile(signature)
                done.append(drivers[kind, path].__name__)
    return done


if __name__ == "__main__":
    if not os.environ.get("NUMBA_CPU_FEATURES") or not os.environ.get("NUMBA_CACHE_DIR"):
        raise SystemExit("set NUMBA_CPU_NAME, NUMBA_CPU_FEATURES and NUMBA_CACHE_DIR as the aarch64 run does")
    print("compiled for aarch64:", " ".join(compile_int8_products()))
