"""Accuracy measurements: how far quantized weights and int8/bf16 activations drift from the exact path."""
