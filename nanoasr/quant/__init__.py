"""Block quantization in numpy: GGUF's Q8_0, Q4_K and Q6_K layouts, their dequantizers and quantizers."""
