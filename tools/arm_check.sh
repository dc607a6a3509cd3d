#!/usr/bin/env bash
# nanoasr on AArch64 under emulation, run by hand on an x86-64 Debian or Ubuntu machine as root (slow: not in
# CI, which keeps tests/test_arm_targets.py's cross-compilation): an arm64 Debian root (debootstrap's first
# stage and its packages unpacked, nothing configured: its python3.11 is all that runs), nanoasr's
# dependencies from PyPI's aarch64 wheels, numba's disk cache of the AArch64 int8 products compiled here for
# aarch64 (LLVM under emulation takes many minutes a product), then under qemu-user with `-cpu max` (dotprod
# and i8mm among its features): the int8 products bit for bit against this machine's x86 path
# (tools/lib/int8_bits.py), the int8 kernel tests on the dotprod and i8mm paths against the numpy twin, and
# the tiny model's greedy ids against the pinned Transformers references. Speed is not measured: the CPU is
# emulated.
#
#   tools/arm_check.sh [pytest arguments]   # default: the tests named in TESTS below
#
# PYTHON (default python3) is an x86 Python with pip and nanoasr's dependencies, for the wheels' download and
# the x86 side of the comparison. WORK (default /tmp/nanoasr-arm) keeps the root, the wheels and numba's
# cache, so that a second run compiles nothing again; each step is skipped when its output is there.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
WORK=${WORK:-/tmp/nanoasr-arm}
ROOTFS=$WORK/rootfs
SITE=$WORK/site
TESTS=(tests/test_int8_kernel.py tests/test_int8_activations.py
       "tests/test_engine.py::test_stages_logits_and_greedy_ids_match_transformers"
       "tests/test_engine.py::test_transcribe_returns_the_reference_ids")
FEATURES=+neon,+dotprod,+i8mm
mkdir -p "$WORK"
stage() { echo "== $(date -u +%H:%M:%S) (+${SECONDS}s) $*"; }

if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
    stage "qemu-user-static and debootstrap"
    apt-get install -y -q qemu-user-static debootstrap
fi
if [[ ! -x "$ROOTFS/usr/bin/python3.11" ]]; then
    stage "an arm64 Debian bookworm root in $ROOTFS"
    debootstrap --arch=arm64 --foreign --variant=minbase --include=python3.11,libpython3.11-stdlib \
        bookworm "$ROOTFS" http://deb.debian.org/debian
    # the first stage unpacks the essential packages only: the rest, python3.11 among them, as they are
    for deb in "$ROOTFS"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$ROOTFS"; done
fi
if [[ ! -d "$SITE/numba" ]]; then
    stage "nanoasr's dependencies for aarch64 from PyPI into $SITE"
    "$PYTHON" -m pip wheel --no-deps --quiet --wheel-dir "$WORK/wheel" "$ROOT"
    "$PYTHON" -m pip install --quiet --target "$SITE" --only-binary=:all: --python-version 3.11 \
        --implementation cp --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 \
        --platform manylinux2014_aarch64 "$WORK"/wheel/nanoasr-*.whl pytest hypothesis
    rm -rf "$SITE/nanoasr"  # the tests import the working tree's (tests/conftest.py puts it first)
fi

cd "$ROOT"
export NUMBA_CPU_NAME=generic NUMBA_CPU_FEATURES=$FEATURES NUMBA_CACHE_DIR=$WORK/numba-cache
stage "numba's disk cache: the AArch64 int8 products compiled here for aarch64 (tools/lib/emulated_arm.py)"
PYTHONPATH=$ROOT "$PYTHON" -m tools.lib.emulated_arm
stage "the x86 path's int8 products"
env -u NUMBA_CPU_NAME -u NUMBA_CPU_FEATURES -u NUMBA_CACHE_DIR PYTHONPATH="$ROOT" \
    "$PYTHON" -m tools.lib.int8_bits save "$WORK/bits.npz"
# qemu-user runs the arm64 python with the root's files first (-L); numba compiles for the features qemu's
# CPU has (LLVM's host query sees none there: tools/lib/emulated_arm.py)
arm() {
    PYTHONPATH=$ROOT:$SITE qemu-aarch64-static -L "$ROOTFS" -cpu max "$ROOTFS/usr/bin/python3.11" "$@"
}
stage "aarch64: the same products on the dotprod and i8mm paths"
arm -m tools.lib.int8_bits check "$WORK/bits.npz" dotprod i8mm
stage "aarch64: pytest ${*:-${TESTS[*]}}"
arm -m pytest -p tools.lib.emulated_arm -p no:cacheprovider -q "${@:-${TESTS[@]}}"
stage "done"
