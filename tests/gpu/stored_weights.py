"""Random stored weights for the GPU kernel tests, and their float32 values from the numpy oracle."""
import numpy as np

from nanoasr.quant.reference import dequantize

BLOCK = {"q8_0": (32, 34), "q4_k": (256, 144), "q6_k": (256, 210)}  # values, bytes per block
F16_FIELDS = {"q8_0": (0,), "q4_k": (0, 2), "q6_k": (208,)}  # byte offsets of the f16 scales in a block


def random_blocks(rng, dtype: str, rows: int, cols: int) -> np.ndarray:
    """uint8 [rows, row_bytes]: every bit pattern of quants and packed scales, finite f16 scale fields."""
    per, nbytes = BLOCK[dtype]
    raw = rng.integers(0, 256, (rows, cols // per, nbytes), dtype=np.uint8)
    for at in F16_FIELDS[dtype]:
        scale = rng.uniform(-0.05, 0.05, (rows, cols // per)).astype(np.float16)
        raw[:, :, at:at + 2] = scale.view(np.uint8).reshape(rows, cols // per, 2)
    return raw.reshape(rows, -1)


def stored(rng, dtype: str, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(data as StoredTensor holds it, its float32 value [rows, cols] from nanoasr.quant.reference)."""
    if dtype == "f32":
        data = rng.standard_normal((rows, cols)).astype(np.float32)
    elif dtype == "f16":
        data = rng.standard_normal((rows, cols)).astype(np.float16)
    elif dtype == "bf16":
        data = rng.integers(0, 1 << 16, (rows, cols), dtype=np.uint16) & np.uint16(0xBFFF)  # finite values
    else:
        data = random_blocks(rng, dtype, rows, cols)
    return data, dequantize(data, dtype, (rows, cols))
