"""The CUDA kernels compiled for a real device (PTX, by NVVM; no GPU needed): float32 throughout, and widening
free of fused multiply-adds, so that a GPU rounds as the simulator and the numpy oracle do."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

COMPILE = textwrap.dedent("""
    import json, re, types
    import numpy as np
    import numba.cuda.dispatcher
    from numba import cuda
    from numba.cuda import types as t
    from nanoasr.kernels import cuda as gk
    from nanoasr.kernels.cuda import kernels

    # Compiled with no GPU: device functions ask the current device for its compute capability; answer 7.5.
    numba.cuda.dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(7, 5))
    f32 = t.float32[:, ::1]
    found = {}
    for kind, stored in gk.STORED.items():
        w = getattr(t, np.dtype(stored).name)[:, ::1]
        h = t.float16[:, ::1] if kind in gk.BLOCK_TYPES else w
        for name, sig in (("matvec", (f32, w, h, f32)), ("widen", (w, h, f32))):
            kernel = getattr(kernels, name.upper())[kind]
            ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(7, 5))
            opcodes = re.findall(r"^\\s*(?:@!?%p\\d+ )?([a-z][\\w.]*)", ptx, re.M)  # after any predicate
            found[f"{kind} {name}"] = sorted(set(opcodes))
    print(json.dumps(found))
""")


@pytest.fixture(scope="module")
def opcodes():
    """{"<type> <kernel>": sorted PTX opcodes} for every kernel, compiled outside the simulator."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_every_kernel_compiles_to_float32_code(opcodes):
    assert len(opcodes) == 12
    wide = {kernel: [op for op in ops if "f64" in op] for kernel, ops in opcodes.items()}
    assert not any(wide.values()), wide


def test_widening_rounds_each_product(opcodes):
    """ptxas may fuse a plain mul.f32 with a following add into an FMA (one rounding instead of two); mul.rn
    is never fused."""
    for kernel, ops in opcodes.items():
        if kernel.endswith("widen"):
            floats = [op for op in ops if op.startswith(("mul", "fma")) and "f32" in op]
            assert set(floats) <= {"mul.rn.f32"}, (kernel, floats)
    assert "mul.rn.f32" in opcodes["q4_k widen"]  # the one decoder that subtracts a product
