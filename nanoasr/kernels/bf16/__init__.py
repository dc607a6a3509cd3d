"""Products of many rows rounded to bf16, float32 sums: on AMX tiles (amx.py), else with AVX512-BF16
(avx512.py)."""
