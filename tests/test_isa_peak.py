"""tools/bench/isa_peak.py's chains compute the steps they are named for: each step's result after a few
steps, against numpy's model of the instructions (on the steps this CPU runs). No timing is judged here."""
import numpy as np
import pytest

from tools.bench import isa_peak


def _fma(v):
    return np.float32(v) * np.float32(0.5) + np.float32(1.0)  # x * 0.5 is exact: one rounding, as the fma


def _bytes(v):  # the four bytes of an int32 lane, low first, unsigned
    return [(int(v) >> (8 * i)) & 0xFF for i in range(4)]


def _signed(value, bits=8):  # an unsigned field read as two's complement
    return value - (1 << bits) if value >> (bits - 1) else value


def _pairs(v):  # vpmaddwd(lane as two int16, 3s)
    low, high = int(v) & 0xFFFF, (int(v) >> 16) & 0xFFFF
    return np.int32(v) + np.int32(3 * (_signed(low, 16) + _signed(high, 16)))


def _fours(v):  # vpmaddubsw(lane's bytes unsigned, 3s), then pairs summed by vpmaddwd; vpdpbusd(lane, lane's
    # bytes unsigned, 3s) sums the same
    return np.int32(v) + np.int32(3 * sum(_bytes(v)))


def _signed_fours(v):  # vpsignb(lane's bytes, [1, -1, ...]) met by 3s unsigned; -(-128) stays -128
    signed = [_signed(b) if i % 2 == 0 else _signed((-_signed(b)) & 0xFF) for i, b in enumerate(_bytes(v))]
    return np.int32(v) + np.int32(3 * sum(signed))


MODELS = {"fp32 FMA 256": _fma, "fp32 FMA 512": _fma, "int8 pairs": _pairs, "int8 fours": _fours,
          "int8 signed fours": _signed_fours, "int8 VNNI": _fours}


@pytest.mark.parametrize("name", isa_peak.available())
def test_each_chain_computes_its_step(name):
    steps, start = 5, 1234567.0
    with np.errstate(over="ignore"):
        for thread, got in enumerate(isa_peak.chain_runner(name)(steps, start, 2)):
            value = np.float32(start + thread) if name.startswith("fp32") else np.int32(start + thread)
            for _ in range(steps):
                value = MODELS[name](value)
            assert got == isa_peak.CHAINS * float(value), (name, thread)


def test_steps_follow_the_target_features():
    assert set(MODELS) == set(isa_peak.STEPS)
    avx2 = {"avx2": True, "fma": True}
    assert isa_peak.available(avx2) == ["fp32 FMA 256", "int8 pairs", "int8 fours", "int8 signed fours"]
    assert isa_peak.available({**avx2, "avx512f": True, "avx512vnni": True}) == list(isa_peak.STEPS)
    assert isa_peak.available({}) == []
