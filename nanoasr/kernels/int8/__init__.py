"""Products of rows quantized to int8 against Q8_0, Q4_K and Q6_K weights (ggml's numerics): dot.py for up
to 8 rows (decoding), gemm.py for many (the encoder and the prefill); x86 paths, AVX512-VNNI and AVX2."""
