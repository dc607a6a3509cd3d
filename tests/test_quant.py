"""nanoasr.quant: dequantizers and Q8_0 held bit-exact to the gguf package; Q4_K/Q6_K quantizers held to a
per-block loop written from llama.cpp's algorithm statement, to error bounds, and to properties; the
Q4_K_M storage mix held to llama.cpp's layer rule."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nanoasr.quant.quantize import error_report, quantize, storage_type
from nanoasr.quant.reference import dequantize
from nanoasr.storage import BLOCK_TYPES

F32 = np.float32
SCALE_FIELDS = {"q8_0": (0,), "q4_k": (0, 2), "q6_k": (208,)}  # byte offsets of each block's f16 scales


def gguf_restore(blocks: np.ndarray, dtype: str) -> np.ndarray:
    return gguf_dequantize(blocks, GGMLQuantizationType[dtype.upper()])


def random_blocks(rng, dtype: str, rows: int, cols: int) -> np.ndarray:
    """Random bytes whose f16 scale fields hold finite values of either sign over many magnitudes."""
    block, block_bytes = BLOCK_TYPES[dtype]
    data = rng.integers(0, 256, (rows, cols // block * block_bytes), dtype=np.uint8)
    blocks = data.reshape(-1, block_bytes)
    for at in SCALE_FIELDS[dtype]:
        scale = rng.normal(size=len(blocks)) * 10.0 ** rng.integers(-6, 3, len(blocks))
        blocks[:, at:at + 2] = scale.astype("<f2").view(np.uint8).reshape(-1, 2)
    return data


def rel_rms(x: np.ndarray, restored: np.ndarray) -> float:
    x = x.astype(np.float64)
    return float(np.sqrt(np.mean((restored - x) ** 2) / np.mean(x ** 2)))


def f16_scales(q: np.ndarray, dtype: str) -> np.ndarray:
    blocks = q.reshape(-1, BLOCK_TYPES[dtype][1])
    return np.stack([blocks[:, at:at + 2].copy().view("<f2")[:, 0] for at in SCALE_FIELDS[dtype]])


# --- dequantize -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(BLOCK_TYPES))
@pytest.mark.parametrize("rows, blocks_per_row", [(1, 1), (3, 2), (7, 5), (64, 4), (1, 40)])
def test_dequantize_matches_gguf_bit_for_bit(dtype, rows, blocks_per_row):
    rng = np.random.default_rng(rows * 100 + blocks_per_row)
    cols = blocks_per_row * BLOCK_TYPES[dtype][0]
    data = random_blocks(rng, dtype, rows, cols)
    got = dequantize(data, dtype, (rows, cols))
    assert got.dtype == np.float32 and got.shape == (rows, cols)
    np.testing.assert_array_equal(got, gguf_restore(data, dtype))


def test_dequantize_reads_a_non_contiguous_view():
    data = random_blocks(np.random.default_rng(0), "q6_k", 8, 512)
    np.testing.assert_array_equal(dequantize(data[::2], "q6_k", (4, 512)), gguf_restore(data[::2], "q6_k"))


def test_dense_types_widen_exactly():
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(6, 10)) * 100).astype(np.float32)
    half = x.astype(np.float16)
    np.testing.assert_array_equal(dequantize(half, "f16", (6, 10)), half.astype(np.float32))
    bits = gguf_quantize(x, GGMLQuantizationType.BF16).view(np.uint16)
    np.testing.assert_array_equal(dequantize(bits, "bf16", (6, 10)),
                                  gguf_restore(bits.view(np.uint8), "bf16").reshape(6, 10))
    np.testing.assert_array_equal(dequantize(x, "f32", (60,)), x.reshape(60))


def test_dequantize_refuses_wrong_sizes_and_types():
    with pytest.raises(ValueError, match="q4_k data of 144 bytes does not hold shape \\[2, 256\\]"):
        dequantize(np.zeros((1, 144), np.uint8), "q4_k", (2, 256))
    with pytest.raises(ValueError, match="whole 32-element blocks"):
        dequantize(np.zeros((1, 34), np.uint8), "q8_0", (1, 31))
    with pytest.raises(ValueError, match="'q5_k'"):
        dequantize(np.zeros((1, 176), np.uint8), "q5_k", (1, 256))


# --- Q8_0 -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["gaussian", "outliers", "halves", "zeros", "mixed"])
def test_q8_0_quantize_matches_gguf_bit_for_bit(kind):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(16, 256)).astype(np.float32)
    if kind == "outliers":
        x[rng.random(x.shape) < 0.02] *= 50
    elif kind == "halves":  # q = x / d lands exactly on .5: roundf goes away from zero, rint would not
        x = (rng.integers(-254, 255, x.shape) / 2).astype(np.float32)
        x[:, ::32] = 127
    elif kind == "zeros":
        x[:] = 0
    elif kind == "mixed":
        x *= 10.0 ** rng.integers(-20, 6, (16, 8)).repeat(32, axis=1)
        x[3] = 0
    got = quantize(x, "q8_0")
    assert got.dtype == np.uint8 and got.shape == (16, 256 // 32 * 34)
    np.testing.assert_array_equal(got, gguf_quantize(x, GGMLQuantizationType.Q8_0))


# --- per-block loop oracle: llama.cpp's k-quant search, one block at a time in float32 ----------------------

def loop_fit_scale_min(x, w):
    """make_qkx2_quants(32, 15, x, w, ..., rmin=-1, rdelta=0.1, nstep=20, use_mad=false): (scale, -min)."""
    lo, hi = min(x.min(), F32(0)), x.max()
    if hi == lo:
        return F32(0), -lo
    iscale = F32(15) / (hi - lo)
    scale, mn = F32(1) / iscale, lo
    levels = np.clip(np.rint(iscale * (x - lo)), 0, 15)
    best = (w * (scale * levels + mn - x) ** 2).sum()
    sum_w, sum_x = w.sum(), (w * x).sum()
    for step in range(21):
        iscale = (F32(-1) + F32(0.1) * step + F32(15)) / (hi - lo)
        levels = np.clip(np.rint(iscale * (x - lo)), 0, 15)
        sl, sl2, sxl = (w * levels).sum(), (w * levels * levels).sum(), (w * levels * x).sum()
        det = sum_w * sl2 - sl * sl
        if det > 0:
            s, m = (sum_w * sxl - sum_x * sl) / det, (sl2 * sum_x - sl * sxl) / det
            if m > 0:
                s, m = sxl / sl2, F32(0)
            err = (w * (s * levels + m - x) ** 2).sum()
            if err < best:
                best, scale, mn = err, s, m
    return scale, -mn


def loop_q4_k_block(x):
    """quantize_row_q4_K_ref for one 256-value block, packed byte by byte as block_q4_K."""
    scales, mins = np.zeros(8, F32), np.zeros(8, F32)
    for j in range(8):
        sub = x[32 * j:32 * j + 32]
        w = np.sqrt((sub * sub).sum() / F32(32)) + np.abs(sub)
        scales[j], mins[j] = loop_fit_scale_min(sub, w)
    max_scale, max_min = max(F32(0), scales.max()), max(F32(0), mins.max())
    inv_scale = F32(63) / max_scale if max_scale > 0 else F32(0)
    inv_min = F32(63) / max_min if max_min > 0 else F32(0)
    ls = [min(63, int(np.rint(inv_scale * scales[j]))) for j in range(8)]
    lm = [min(63, int(np.rint(inv_min * mins[j]))) for j in range(8)]
    packed = [0] * 12
    for j in range(8):
        if j < 4:
            packed[j], packed[j + 4] = ls[j], lm[j]
        else:
            packed[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4)
            packed[j - 4] |= (ls[j] >> 4) << 6
            packed[j] |= (lm[j] >> 4) << 6
    d, dmin = np.float16(max_scale / F32(63)), np.float16(max_min / F32(63))
    levels = [0] * 256
    for j in range(8):
        dj = F32(d) * F32(ls[j])
        if dj == 0:
            continue
        mj = F32(dmin) * F32(lm[j])
        for i in range(32):
            levels[32 * j + i] = max(0, min(15, int(np.rint((x[32 * j + i] + mj) / dj))))
    qs = [levels[g + i] | (levels[g + i + 32] << 4) for g in range(0, 256, 64) for i in range(32)]
    return np.concatenate([np.array([d, dmin], "<f2").view(np.uint8), np.array(packed + qs, np.uint8)])


def loop_fit_symmetric(x):
    """make_qx_quants(16, 32, x, L, rmse_type=1, NULL): the weights are x^2."""
    amax, peak = F32(0), F32(0)
    for v in x:
        if abs(v) > amax:
            amax, peak = abs(v), v
    if amax < F32(1e-15):
        return F32(0)
    w = x * x

    def sums(iscale):
        levels = np.clip(np.rint(iscale * x), -32, 31)
        return (w * x * levels).sum(), (w * levels * levels).sum()

    sumlx, suml2 = sums(F32(-32) / peak)
    scale = sumlx / suml2 if suml2 else F32(0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step:
            sumlx, suml2 = sums(-(F32(32) + F32(0.1) * step) / peak)
            if suml2 > 0 and sumlx * sumlx > best * suml2:
                scale = sumlx / suml2
                best = scale * sumlx
    return scale


def loop_q6_k_block(x):
    """quantize_row_q6_K_ref for one 256-value block, packed byte by byte as block_q6_K."""
    scales = [loop_fit_symmetric(x[16 * j:16 * j + 16]) for j in range(16)]
    max_abs, max_scale = F32(0), F32(0)
    for s in scales:
        if abs(s) > max_abs:
            max_abs, max_scale = abs(s), s
    if max_abs < F32(1e-15):
        return np.zeros(210, np.uint8)
    iscale = F32(-128) / max_scale
    d = np.float16(F32(1) / iscale)
    sc = [min(127, int(np.rint(iscale * s))) for s in scales]
    levels = [0] * 256
    for j in range(16):
        dj = F32(d) * F32(sc[j])
        if dj == 0:
            continue
        for i in range(16):
            levels[16 * j + i] = max(-32, min(31, int(np.rint(x[16 * j + i] / dj)))) + 32
    ql, qh = [0] * 128, [0] * 64
    for half in range(2):
        q = levels[128 * half:128 * half + 128]
        for i in range(32):
            ql[64 * half + i] = (q[i] & 0xF) | ((q[i + 64] & 0xF) << 4)
            ql[64 * half + i + 32] = (q[i + 32] & 0xF) | ((q[i + 96] & 0xF) << 4)
            qh[32 * half + i] = ((q[i] >> 4) | ((q[i + 32] >> 4) << 2) | ((q[i + 64] >> 4) << 4)
                                 | ((q[i + 96] >> 4) << 6))
    return np.concatenate([np.array(ql + qh, np.uint8), np.array(sc, np.int8).view(np.uint8),
                           np.array([d], "<f2").view(np.uint8)])


LOOPS = {"q4_k": loop_q4_k_block, "q6_k": loop_q6_k_block}


def test_loop_oracle_restores_through_the_gguf_dequantizers():
    """The loop oracle itself is checked: its blocks decode (by gguf) to within a k-quant's error."""
    x = np.random.default_rng(3).normal(size=(1, 256)).astype(np.float32)
    assert rel_rms(x, gguf_restore(loop_q4_k_block(x[0])[None], "q4_k")) < 0.09
    assert rel_rms(x, gguf_restore(loop_q6_k_block(x[0])[None], "q6_k")) < 0.025


@pytest.mark.parametrize("dtype", ["q4_k", "q6_k"])
@pytest.mark.parametrize("kind", ["gaussian", "outliers", "positive", "sparse"])
def test_k_quants_agree_with_the_per_block_loop(dtype, kind):
    """Measured (24 blocks each): Q4_K byte-identical for every kind; Q6_K identical for gaussian, 17/24
    outliers, 22/24 positive, 18/24 sparse. Q6_K weighs values by x^2, so where a few values dominate, its
    candidate scales tie to within float32 rounding and the order of summation decides; those blocks
    restore within 1.2% of the loop's error (bound 2%), and the whole tensor within 0.1% (bound 0.5%)."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(24, 256)).astype(np.float32) * 0.03
    if kind == "outliers":
        x[rng.random(x.shape) < 0.02] *= 30
    elif kind == "positive":
        x = np.abs(x) + 0.01
    elif kind == "sparse":
        x[rng.random(x.shape) < 0.7] = 0
    got = quantize(x, dtype)
    want = np.stack([LOOPS[dtype](row) for row in x])
    same = (got == want).all(axis=1)
    enough = same.all() if dtype == "q4_k" else same.mean() >= 2 / 3
    assert enough, f"{(~same).sum()} of {len(same)} blocks differ"
    for row in np.flatnonzero(~same):
        ours, loop = (rel_rms(x[row], gguf_restore(q[row:row + 1], dtype)[0]) for q in (got, want))
        assert ours <= loop * 1.02, (row, ours, loop)
    assert rel_rms(x, gguf_restore(got, dtype)) <= rel_rms(x, gguf_restore(want, dtype)) * 1.005


# --- Q4_K / Q6_K error bounds and properties ---------------------------------------------------------------

ERROR_BOUNDS = {("q4_k", "gaussian"): 0.075, ("q4_k", "outliers"): 0.105,
                ("q6_k", "gaussian"): 0.019, ("q6_k", "outliers"): 0.034}


@pytest.mark.parametrize("dtype, kind", list(ERROR_BOUNDS))
def test_k_quant_relative_rms_error_is_within_bounds(dtype, kind):
    """Measured on [256, 1024] (seed 5) of N(0, 0.02), and with 1% of values scaled 20x ("outliers"):
    Q4_K 0.0715 / 0.1011, Q6_K 0.0177 / 0.0321 relative RMS error; bounds leave about 5% headroom.
    Q8_0 for comparison: 0.0053 / 0.0112."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(256, 1024)).astype(np.float32) * 0.02
    if kind == "outliers":
        x[rng.random(x.shape) < 0.01] *= 20
    q = quantize(x, dtype)
    assert q.shape == (256, 1024 // 256 * BLOCK_TYPES[dtype][1])
    err = rel_rms(x, gguf_restore(q, dtype))
    assert err < ERROR_BOUNDS[(dtype, kind)], err
    np.testing.assert_array_equal(dequantize(q, dtype, x.shape), gguf_restore(q, dtype))


row_blocks = hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.just(256)),
                        elements=st.floats(-1.0, 1.0, width=32))


@pytest.mark.parametrize("dtype", ["q4_k", "q6_k"])
@settings(max_examples=40, deadline=None)
@given(x=row_blocks, peak_at=st.integers(0, 255), sign=st.sampled_from([-1.0, 1.0]),
       magnitude=st.sampled_from([0.5, 1.0, 1e2, 1e4]))
@example(x=np.full((1, 256), 0.97, np.float32), peak_at=0, sign=1.0, magnitude=1.0)
def test_k_quant_error_is_bounded_by_each_block_magnitude(dtype, x, peak_at, sign, magnitude):
    """Arbitrary blocks (constant runs, repeated values, zeros), each with largest magnitude `magnitude`,
    over the range where the f16 super-scales keep their precision (d = magnitude / 4096 for Q6_K is a
    normal float16 from 0.25 up; below it d is subnormal, its step up to 2.4% at 1e-2, and a block that
    llama.cpp's loop quantizes identically moves by 1/33): scales are finite and no value moves
    by more than a fraction of that magnitude (Q4_K: 1/8, Q6_K: 1/40; the worst found in 6000 examples
    were 1/14.5 and 1/45.9: Q4_K's 6-bit sub-block scales and mins add to its 4-bit step). The example is a
    block where every candidate grid puts each sub-block on one level, so the scale-and-min fit is
    undetermined; it once took an arbitrary pair and moved values by 0.37."""
    x[:, peak_at] = sign
    x = x * np.float32(magnitude)
    q = quantize(x, dtype)
    assert np.isfinite(f16_scales(q, dtype)).all()
    worst = np.abs(gguf_restore(q, dtype) - x).max() / magnitude
    assert worst <= {"q4_k": 1 / 8, "q6_k": 1 / 40}[dtype], worst


@pytest.mark.parametrize("dtype", list(BLOCK_TYPES))
def test_zero_rows_give_zero_blocks(dtype):
    q = quantize(np.zeros((2, 512), np.float32), dtype)
    np.testing.assert_array_equal(gguf_restore(q, dtype), 0)
    assert np.isfinite(f16_scales(q, dtype)).all()


@pytest.mark.parametrize("dtype", ["q4_k", "q6_k"])
@pytest.mark.parametrize("value", [1.0, -0.3, 5e-3, 700.0])
def test_constant_rows_are_restored_closely(dtype, value):
    x = np.full((2, 512), value, np.float32)
    restored = gguf_restore(quantize(x, dtype), dtype)
    np.testing.assert_allclose(restored, x, rtol=1e-2)


@pytest.mark.parametrize("dtype", list(BLOCK_TYPES))
def test_tiny_values_give_finite_blocks_no_larger_than_the_input(dtype):
    """Values ~1e-30 are below float16's reach: the blocks restore to (near) zero, never to garbage."""
    x = np.random.default_rng(6).normal(size=(2, 256)).astype(np.float32) * np.float32(1e-30)
    q = quantize(x, dtype)
    restored = gguf_restore(q, dtype)
    assert np.isfinite(f16_scales(q, dtype)).all() and np.isfinite(restored).all()
    assert np.abs(restored).max() <= 2 * np.abs(x).max()


@pytest.mark.parametrize("dtype", list(BLOCK_TYPES))
def test_values_beyond_the_float16_scale_range_are_refused(dtype):
    x = np.full((1, 256), 1e12, np.float32)
    with pytest.raises(ValueError, match=f"values too large for {dtype}: a block scale of .* float16 range"):
        quantize(x, dtype)


@pytest.mark.parametrize("dtype", list(BLOCK_TYPES))
def test_rows_of_partial_blocks_and_bad_input_are_refused(dtype):
    block = BLOCK_TYPES[dtype][0]
    wrong = f"rows of whole {block}-element blocks, got shape \\[2, {block + 16}\\]"
    with pytest.raises(ValueError, match=wrong):
        quantize(np.zeros((2, block + 16), np.float32), dtype)
    with pytest.raises(ValueError, match="non-finite"):
        quantize(np.full((1, 256), np.nan, np.float32), dtype)
    with pytest.raises(ValueError, match="2-D"):
        quantize(np.zeros(256, np.float32), dtype)


def test_unknown_quantization_type_is_refused():
    with pytest.raises(ValueError, match="'q4_0'"):
        quantize(np.zeros((1, 256), np.float32), "q4_0")


def test_error_report_matches_a_direct_computation():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(300, 512)).astype(np.float32)
    restored = gguf_restore(quantize(x, "q4_k"), "q4_k")
    report = error_report(x, restored)
    assert report["rel_rms"] == pytest.approx(rel_rms(x, restored), rel=1e-9)
    assert report["max_abs"] == pytest.approx(float(np.abs(restored.astype(np.float64) - x).max()), rel=1e-12)
    assert error_report(np.zeros((2, 3)), np.full((2, 3), 0.5)) == {"rel_rms": 0.5, "max_abs": 0.5}


# --- storage mix ------------------------------------------------------------------------------------------

def q6_k_layers(n_layers: int) -> set[int]:
    """llama.cpp's rule, restated: layers in the first eighth, in the last eighth, and every third layer
    counting from the end of the first eighth (the third, sixth, ... after it)."""
    first, last = n_layers // 8, 7 * n_layers // 8
    return set(range(first)) | set(range(last, n_layers)) | set(range(first + 2, last, 3))


def test_q4_k_m_mix_for_a_28_layer_decoder():
    assert q6_k_layers(28) == {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27}
    for layer in range(28):
        prefix = f"model.language_model.layers.{layer}."
        more = "q6_k" if layer in q6_k_layers(28) else "q4_k"
        assert storage_type(prefix + "self_attn.v_proj.weight", (1024, 1024), "q4_k_m", 28) == more
        assert storage_type(prefix + "mlp.down_proj.weight", (1024, 3072), "q4_k_m", 28) == more
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj", "mlp.gate_proj",
                     "mlp.up_proj"):
            assert storage_type(prefix + part + ".weight", (2048, 1024), "q4_k_m", 28) == "q4_k", part


@pytest.mark.parametrize("n_layers", [1, 4, 8, 12, 28, 36])
def test_q6_k_layers_follow_the_rule_for_other_depths(n_layers):
    got = {i for i in range(n_layers)
           if storage_type(f"model.language_model.layers.{i}.mlp.down_proj.weight", (64, 256), "q4_k_m",
                           n_layers) == "q6_k"}
    assert got == q6_k_layers(n_layers)


def mix(name, shape):
    return storage_type(name, shape, "q4_k_m", 28)


def q8_mix(name, shape):
    return storage_type(name, shape, "q8_0", 28)


def test_q4_k_m_embedding_encoder_and_fallbacks():
    embed = "model.language_model.embed_tokens.weight"
    assert mix(embed, (151936, 1024)) == "q6_k"
    assert mix("lm_head.weight", (151936, 1024)) == "q6_k"
    # encoder and adaptor v_proj / FFN-down matrices are not decoder layers: the base rule only
    for layer in (0, 1, 5, 69):
        assert mix(f"model.audio_tower.layers.{layer}.self_attn.v_proj.weight", (512, 512)) == "q4_k"
        assert mix(f"model.audio_tower.layers.{layer}.mlp.fc2.weight", (512, 2048)) == "q4_k"
    assert mix("model.multi_modal_projector.layers.0.self_attn.v_proj.weight", (1024, 1024)) == "q4_k"
    assert mix("model.multi_modal_projector.layers.1.mlp.fc2.weight", (1024, 2048)) == "q4_k"
    assert mix("model.multi_modal_projector.linear_2.weight", (1024, 2048)) == "q4_k"
    assert mix("model.audio_tower.layers.0.self_attn.q_proj.weight", (512, 560)) == "f16"
    assert mix("model.multi_modal_projector.linear_1.weight", (2048, 96)) == "q8_0"
    assert mix("model.language_model.layers.0.mlp.down_proj.weight", (64, 160)) == "q8_0"
    assert mix(embed, (100, 200)) == "f16"


def test_q8_0_mix():
    assert q8_mix("model.language_model.layers.0.mlp.down_proj.weight", (1024, 3072)) == "q8_0"
    assert q8_mix("model.language_model.embed_tokens.weight", (151936, 1024)) == "q8_0"
    assert q8_mix("model.audio_tower.layers.0.self_attn.q_proj.weight", (512, 560)) == "f16"
    assert q8_mix("model.multi_modal_projector.linear_1.weight", (2048, 48)) == "f16"
    with pytest.raises(ValueError, match="'q5_k_m'"):
        storage_type("x.weight", (64, 256), "q5_k_m", 28)
