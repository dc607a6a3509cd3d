"""The int8-activation products over Q8_0, Q4_K and Q6_K weights (nanoasr/kernels/int8/dot.py, and the GEMM
for many rows in int8/gemm.py) against their numpy twin in nanoasr.ops, on every path this CPU can run (AVX2
forced where VNNI is present too, dotprod where i8mm is: on AArch64 these run under emulation,
tools/arm_check.sh)."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from nanoasr.backend import xp
from nanoasr.kernels import stored
from nanoasr.kernels.int8.dot import KINDS, PATHS, host_path
from nanoasr.tensor import StoredTensor

# "gemm_vnni", "gemm_avx2": stored.gemm_int8, the many-row product, on each path
RUNNABLE = {"vnni": ["vnni", "avx2", "gemm_vnni", "gemm_avx2"], "avx2": ["avx2", "gemm_avx2"],
            "i8mm": ["dotprod", "i8mm", "gemm_dotprod", "gemm_i8mm"], "dotprod": ["dotprod", "gemm_dotprod"],
            None: []}[host_path()]
GEMMS = tuple(f"gemm_{p}" for p in PATHS)
paths = pytest.mark.parametrize("path", [pytest.param(p, marks=[pytest.mark.cpu_path, pytest.mark.skipif(
    p not in RUNNABLE, reason=f"this CPU cannot run the {p} path")]) for p in PATHS + GEMMS])


def q8_0(scales: np.ndarray, quants: np.ndarray) -> np.ndarray:
    """Q8_0 rows [rows, k*34] from f16-representable scales [rows, k] and int8 quants [rows, k, 32]."""
    blocks = np.zeros(quants.shape[:2] + (34,), np.uint8)
    blocks[..., :2] = scales.astype(np.float16)[..., None].view(np.uint8)
    blocks[..., 2:] = quants.astype(np.int8).view(np.uint8)
    return blocks.reshape(len(quants), -1)


def random_weights(rng, kind, rows, cols):
    """Q8_0: random quants and scales; Q4_K: random bytes (every quant and packed scale pattern) with finite
    f16 d and dmin."""
    if kind in ("q4_k", "q6_k"):
        nbytes, at = (144, 0) if kind == "q4_k" else (210, 208)  # f16 d (and dmin) at byte `at`
        raw = rng.integers(0, 256, (rows, cols // 256, nbytes), dtype=np.uint8)
        fields = 2 if kind == "q4_k" else 1
        scales = rng.uniform(-0.05, 0.05, (rows, cols // 256, fields)).astype(np.float16)
        raw[..., at:at + 2 * fields] = scales.view(np.uint8)
        return raw.reshape(rows, -1)
    scales = rng.uniform(1e-3, 1e-2, (rows, cols // 32))
    return q8_0(scales, rng.integers(-128, 128, (rows, cols // 32, 32)))


def product(x, data, kind, rows, path):
    out = np.full((len(x), rows), np.nan, np.float32)
    if path in GEMMS:
        return stored.gemm_int8(x, data, kind, rows, x.shape[1], out, path.removeprefix("gemm_"))
    return stored.matvec_int8(x, data, kind, rows, x.shape[1], out, path)


@paths
@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 11, 42])
@pytest.mark.parametrize("kind, rows, cols", [  # odd row counts; an odd block count; two passes over columns
    ("q8_0", 37, 32 * 7), ("q8_0", 33, 32 * 130), ("q4_k", 37, 256 * 3), ("q4_k", 33, 256 * 17),
    ("q6_k", 37, 256 * 3), ("q6_k", 33, 256 * 17)])
def test_int8_product_matches_twin(path, n, kind, rows, cols):
    """Within float32 rounding of the twin's float64 sum of (int32 block sum) * float32(scale * dx), less the
    mins times the row's block sums."""
    rng = np.random.default_rng(n * cols + rows)
    data = random_weights(rng, kind, rows, cols)
    x = rng.standard_normal((n, cols)).astype(np.float32) * rng.uniform(0.1, 10, (n, 1)).astype(np.float32)
    w = StoredTensor(data, kind, (rows, cols))
    got = product(x, data, kind, rows, path)
    want = xp.int8_matmul_xp(x, w)
    _, scales, mins, dx, xs = xp.int8_block_sums_xp(x, w)
    q, _ = xp.quantize_rows_xp(x)
    wq, _, _ = xp.int8_weight_blocks_xp(w)
    magnitude = (np.einsum("nkc,okc->nok", np.abs(q.astype(np.int64)).reshape(n, -1, 16), np.abs(wq))
                 * np.abs(scales[None] * np.repeat(dx, 2, axis=1)[:, None])).sum(axis=-1)
    bound = (cols // 32 + 32) * 2.0 ** -24 * (magnitude + np.abs(mins[None] * xs[:, None]).sum(axis=-1))
    assert np.all(np.abs(got - want) <= bound)
    exact = stored.matvec(x, data, kind, rows, cols, np.empty((n, rows), np.float32))
    assert not np.all(np.abs(exact - want) <= bound)  # the bound tells int8 activations from float ones


@paths
@pytest.mark.parametrize("n", [1, 4, 7, 8, 13])
def test_int8_block_sums_are_exact(path, n):
    """Weight scale 1 and rows of integers reaching 127 in every block: scale 1, so the product is the exact
    integer dot product (weights include -128, rows -127)."""
    rng = np.random.default_rng(n)
    rows, cols = 35, 32 * 9
    wq = rng.integers(-128, 128, (rows, cols // 32, 32))
    wq[:, :, 0] = -128
    x = rng.integers(-127, 128, (n, cols))
    x[:, ::32] = 127
    x[:, 5::32] = -127
    data = q8_0(np.ones((rows, cols // 32)), wq)
    got = product(x.astype(np.float32), data, "q8_0", rows, path)
    assert np.array_equal(got, (x.astype(np.int64) @ wq.reshape(rows, cols).T).astype(np.float32))


@paths
@pytest.mark.parametrize("n", [1, 4, 7, 8, 13])
def test_int8_q4_k_sums_are_exact(path, n):
    """Q4_K with d = dmin = 1 and every 6-bit scale and min 1 (value = quant - 1), rows of integers reaching
    127 in every block: the product is the exact integer dot product, the mins' term included."""
    rng = np.random.default_rng(10 + n)
    rows, cols = 34, 256 * 2
    blocks = np.zeros((rows, cols // 256, 144), np.uint8)
    blocks[..., 0:4] = np.array([1.0, 1.0], np.float16).view(np.uint8)
    blocks[..., 4:12] = 1  # scales 0-3, mins 0-3
    blocks[..., 12:16] = 0x11  # scales and mins 4-7
    blocks[..., 16:] = rng.integers(0, 256, (rows, cols // 256, 128))
    qs = blocks[..., 16:].reshape(rows, -1, 4, 1, 32)
    values = np.concatenate([qs & 15, qs >> 4], axis=3).reshape(rows, cols).astype(np.int64) - 1
    x = rng.integers(-127, 128, (n, cols))
    x[:, ::32] = 127
    got = product(x.astype(np.float32), blocks.reshape(rows, -1), "q4_k", rows, path)
    assert np.array_equal(got, (x.astype(np.int64) @ values.T).astype(np.float32))


@pytest.mark.parametrize("kind", ["q8_0", "q4_k", "q6_k"])
def test_twin_weight_blocks_are_the_stored_values(kind):
    """quants * scales - mins is what the gguf package dequantizes, exactly."""
    rng = np.random.default_rng(7)
    data = random_weights(rng, kind, 5, 512)
    quants, scales, mins = xp.int8_weight_blocks_xp(StoredTensor(data, kind, (5, 512)))
    values = (quants.astype(np.float32) * scales[..., None]).reshape(5, -1, 32) - mins[..., None]
    values = values.reshape(5, 512)
    assert np.array_equal(values, dequantize(data, GGMLQuantizationType[kind.upper()]))


@paths
@pytest.mark.parametrize("n", [1, 4, 7, 8, 13])
def test_int8_q6_k_sums_are_exact(path, n):
    """Q6_K with d = 1 and every scale 1 (value = stored quant - 32, as the gguf package dequantizes it), rows
    of integers reaching 127 in every block: the product is the exact integer dot product."""
    rng = np.random.default_rng(20 + n)
    rows, cols = 34, 256 * 2
    blocks = rng.integers(0, 256, (rows, cols // 256, 210), dtype=np.uint8)
    blocks[..., 192:208] = 1
    blocks[..., 208:210] = np.array([1.0], np.float16).view(np.uint8)
    data = blocks.reshape(rows, -1)
    values = dequantize(data, GGMLQuantizationType.Q6_K).astype(np.int64)
    x = rng.integers(-127, 128, (n, cols))
    x[:, ::32] = -127
    got = product(x.astype(np.float32), data, "q6_k", rows, path)
    assert np.array_equal(got, (x.astype(np.int64) @ values.T).astype(np.float32))


def test_quantized_rows_round_to_the_block_scale():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 96)).astype(np.float32)
    x[1, 32:64] = 0
    q, scales = xp.quantize_rows_xp(x)
    blocks = x.reshape(3, 3, 32)
    assert np.array_equal(scales, np.abs(blocks).max(-1) / np.float32(127))
    assert np.array_equal(np.abs(q).max(-1), np.where(scales > 0, 127, 0))
    assert np.all(np.abs(blocks - q * scales[..., None]) <= scales[..., None] * 0.5001)


def test_kernel_quantization_matches_the_twin_bit_for_bit():
    """The vector quantizer (int8_dot.quantize_block) in both layouts, the decode kernels' and the GEMM's
    (serial and parallel), against xp.quantize_rows_xp: scales, int8 and the sums the kernels derive, on
    blocks of every magnitude, an all-zero block, negative zeros and exact ties (ties to even)."""
    from nanoasr.kernels.int8.dot import quantized
    from nanoasr.kernels.int8.gemm import quantized_rows, quantized_rows_parallel

    rng = np.random.default_rng(5)
    n, nb = 11, 6
    x = rng.standard_normal((n, 32 * nb)).astype(np.float32) * np.float32(10.0) ** rng.integers(
        -30, 30, (n, nb)).repeat(32, axis=1).astype(np.float32)
    x[0, :32] = 0
    x[1, 32:64] = -0.0
    x[2, 64:96] = np.concatenate([[127.0], np.arange(-16, 15) + 0.5])  # scale 1: every other value a tie
    want_q, want_d = xp.quantize_rows_xp(x)
    assert np.array_equal(np.rint(x[2, 65:96]), want_q[2, 2, 1:])  # the twin rounds the ties to even
    for quantize in (quantized_rows, quantized_rows_parallel):
        q, d, sums = quantize(x, nb)
        assert np.array_equal(q[:n].reshape(n, nb, 32), want_q) and np.array_equal(d[:n], want_d)
        assert np.array_equal(sums[:n], want_q.reshape(n, 2 * nb, 16).sum(-1, dtype=np.int32))
        assert not q[n:].any() and not d[n:].any()  # the padding rows
    for rows in (1, 4, 8):
        q, d, bias, block_sums = quantized(x[:rows], nb)  # [pairs, nx, 64], [pairs, nx, 2], ...
        got_q = q[:, :rows].reshape(nb // 2, rows, 2, 32).transpose(1, 0, 2, 3).reshape(rows, nb, 32)
        got_d = d[:, :rows].transpose(1, 0, 2).reshape(rows, nb)
        assert np.array_equal(got_q, want_q[:rows]) and np.array_equal(got_d, want_d[:rows])
        fours = want_q[:rows].reshape(rows, nb // 2, 16, 4).sum(-1, dtype=np.int32).transpose(1, 0, 2)
        assert np.array_equal(bias[:, :rows], -128 * fours)
        totals = want_q[:rows].sum(-1, dtype=np.int64).astype(np.float32) * want_d[:rows]
        assert np.array_equal(block_sums[:, :rows].transpose(1, 0, 2).reshape(rows, nb), totals)


def test_int8_product_refuses_wrong_arguments():
    with pytest.raises(ValueError, match="q8_0 data"):
        stored.matvec_int8(np.zeros((1, 64), np.float32), np.zeros((4, 64), np.uint8), "q8_0", 4, 64,
                           np.zeros((1, 4), np.float32), "avx2")
    with pytest.raises(ValueError, match="out must have"):
        stored.matvec_int8(np.zeros((2, 64), np.float32), np.zeros((4, 68), np.uint8), "q8_0", 4, 64,
                           np.zeros((1, 4), np.float32), "avx2")
    with pytest.raises(ValueError, match="int8 activations need q8_0, q4_k or q6_k weights; got 'bf16'"):
        stored.matvec_int8(np.zeros((1, 256), np.float32), np.zeros((4, 256), np.uint16), "bf16", 4, 256,
                           np.zeros((1, 4), np.float32), "avx2")
    with pytest.raises(ValueError, match="int8 activations need q8_0, q4_k or q6_k weights; got 'f16'"):
        stored.gemm_int8(np.zeros((9, 256), np.float32), np.zeros((4, 256), np.uint16), "f16", 4, 256,
                         np.zeros((9, 4), np.float32), "vnni")
    with pytest.raises(ValueError, match="out must have"):
        stored.gemm_int8(np.zeros((9, 64), np.float32), np.zeros((4, 68), np.uint8), "q8_0", 4, 64,
                         np.zeros((8, 4), np.float32), "vnni")


@paths
@pytest.mark.parametrize("kind, nbytes", [("q8_0", 34), ("q4_k", 144), ("q6_k", 210)])
def test_int8_product_uses_the_integer_instructions(path, kind, nbytes):
    """Compiled afresh: a driver loaded from numba's disk cache has no assembly text to show."""
    from numba import njit

    from nanoasr.kernels.int8.dot import MATVEC_INT8
    from nanoasr.kernels.int8.gemm import GEMM_INT8

    on = path.removeprefix("gemm_")
    fresh = njit(parallel=True)((GEMM_INT8 if path in GEMMS else MATVEC_INT8)[kind, on].py_func)
    per = 32 if kind == "q8_0" else 256
    fresh(np.ones((1, 2 * per), np.float32), np.zeros((4, 2 * nbytes), np.uint8), 2,
          np.empty((1, 4), np.float32))
    asm = "".join(fresh.inspect_asm().values())
    widened = "\tvpmaddwd\t" in asm or "\tvpdpwssd\t" in asm  # where VNNI is present LLVM fuses vpmaddwd
    # with the add after it into vpdpwssd
    if path == "gemm_i8mm":
        assert "\tsmmla\t" in asm
    elif on in ("dotprod", "i8mm"):
        assert "\tsdot\t" in asm and "\tsmmla\t" not in asm
    elif on == "vnni":
        assert "\tvpdpbusd\t" in asm
    elif path == "gemm_avx2" and kind == "q8_0":  # int16 pairs of signed quants
        assert widened and "\tvpmaddubsw\t" not in asm
    else:
        assert "\tvpmaddubsw\t" in asm and widened


@pytest.mark.parametrize("path", [pytest.param(p, marks=[pytest.mark.cpu_path, pytest.mark.skipif(
    p not in RUNNABLE, reason=f"this CPU cannot run the {p} path")]) for p in GEMMS])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sign", [1, -1])
def test_int8_gemm_int16_sums_do_not_saturate(path, kind, sign):
    """Every quant at its extreme (Q4_K 15, Q6_K 63: the AVX2 path adds their int16 pair sums over a run of
    fours before widening them; Q8_0 -128) against x of +-127: the exact integer dot product, on both
    paths."""
    rows, cols, n = 32, 512, 9
    if kind == "q8_0":
        data = q8_0(np.ones((rows, cols // 32)), np.full((rows, cols // 32, 32), -128))
    elif kind == "q4_k":
        blocks = np.zeros((rows, cols // 256, 144), np.uint8)
        blocks[..., 0:4] = np.array([1.0, 0.0], np.float16).view(np.uint8)  # d = 1, dmin = 0
        blocks[..., 4:16] = [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]  # every scale 1, every min 0
        blocks[..., 16:] = 0xFF
        data = blocks.reshape(rows, -1)
    else:
        blocks = np.full((rows, cols // 256, 210), 0xFF, np.uint8)  # quants 63: values 31
        blocks[..., 192:208] = 1
        blocks[..., 208:210] = np.array([1.0], np.float16).view(np.uint8)
        data = blocks.reshape(rows, -1)
    values = dequantize(data, GGMLQuantizationType[kind.upper()]).astype(np.int64)
    assert values.max() == values.min() == {"q8_0": -128, "q4_k": 15, "q6_k": 31}[kind]
    x = np.full((n, cols), 127 * sign, np.int64)
    got = product(x.astype(np.float32), data, kind, rows, path)
    assert np.array_equal(got, (x @ values.T).astype(np.float32))


@pytest.mark.cpu_path
@pytest.mark.skipif(host_path() not in ("vnni", "i8mm"), reason="this CPU cannot run two GEMM paths")
@pytest.mark.parametrize("kind, rows, cols", [("q8_0", 35, 32 * 21), ("q4_k", 37, 256 * 3),
                                              ("q6_k", 33, 256 * 5)])
@pytest.mark.parametrize("n", [9, 13, 42])
def test_int8_gemm_paths_give_the_same_bits(kind, rows, cols, n):
    """The same integer sums, scaled and added in the same order: a model gives the same numbers with AVX2
    as with VNNI, and with sdot as with smmla."""
    rng = np.random.default_rng(n + rows)
    data = random_weights(rng, kind, rows, cols)
    x = rng.standard_normal((n, cols)).astype(np.float32) * rng.uniform(0.1, 10, (n, 1)).astype(np.float32)
    first, second = (product(x, data, kind, rows, path) for path in GEMMS if path in RUNNABLE)
    assert np.array_equal(first, second)
