"""The int8 products' bits on one machine against another's: `save OUT.npz` writes, on the machine's own
int8 path (int8.dot.host_path), the decode products (1, 4 and 8 rows of x) and the GEMM's (9 and 42 rows) of
Q8_0, Q4_K and Q6_K weights, random but the same everywhere (numpy's PCG64 from fixed seeds); `check IN.npz
PATH...` computes them on each path named (int8.dot.PATHS) and exits 1 unless each is the saved array bit for
bit. tools/arm_check.sh saves them on x86 and checks the dotprod and i8mm paths under emulation: every path
sums the same integers and scales them in the same order (int8/gemm.py).

    python -m tools.lib.int8_bits save /tmp/bits.npz
    python -m tools.lib.int8_bits check /tmp/bits.npz dotprod i8mm
"""
from __future__ import annotations

import sys

import numpy as np

from nanoasr.kernels import stored
from nanoasr.kernels.int8.dot import KINDS, PATHS, host_path

SHAPES = {"q8_0": (37, 32 * 21), "q4_k": (37, 256 * 3), "q6_k": (33, 256 * 5)}
ROWS_OF_X = {"matvec": (1, 4, 8), "gemm": (9, 42)}
LAYOUT = {"q8_0": (32, 34, 0, 1), "q4_k": (256, 144, 0, 2), "q6_k": (256, 210, 208, 1)}  # size, bytes, f16s


def weights(rng, kind: str, rows: int, cols: int) -> np.ndarray:
    """Random bytes with finite f16 scales (Q4_K's d and dmin, Q6_K's d, Q8_0's per block)."""
    size, nbytes, at, fields = LAYOUT[kind]
    raw = rng.integers(0, 256, (rows, cols // size, nbytes), dtype=np.uint8)
    scales = rng.uniform(-0.05, 0.05, (rows, cols // size, fields)).astype(np.float16)
    raw[..., at:at + 2 * fields] = scales.view(np.uint8)
    return raw.reshape(rows, -1)


def products(path: str) -> dict[str, np.ndarray]:
    out = {}
    for kind in KINDS:
        rows, cols = SHAPES[kind]
        rng = np.random.default_rng(rows * cols)
        data = weights(rng, kind, rows, cols)
        for product, counts in ROWS_OF_X.items():
            call = stored.matvec_int8 if product == "matvec" else stored.gemm_int8
            for n in counts:
                x = rng.standard_normal((n, cols)).astype(np.float32)
                result = np.empty((n, rows), np.float32)
                out[f"{product}_{kind}_{n}"] = call(x, data, kind, rows, cols, result, path)
    return out


def main(argv: list[str]) -> int:
    usage = argv[:1] == ["save"] and len(argv) == 2 and host_path() is not None or (
        argv[:1] == ["check"] and len(argv) > 2 and set(argv[2:]) <= set(PATHS))
    if not usage:
        print(__doc__.rsplit("\n\n", 1)[1], file=sys.stderr)
        return 2
    if argv[0] == "save":
        np.savez(argv[1], path=host_path(), **products(host_path()))
        print(f"{argv[1]}: the products on {host_path()}")
        return 0
    saved = np.load(argv[1])
    failed = 0
    for path in argv[2:]:
        for name, got in products(path).items():
            same = np.array_equal(got, saved[name])
            failed += not same
            print(f"{path} {name}: {'the same bits' if same else 'DIFFERENT'} as {saved['path']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
