"""File formats: safetensors, torch.save zips and GGUF (reader, writer, vocabulary).

numpy, the gguf package and tokenizers over nanoasr.tensor; never nanoasr.model or nanoasr.checkpoints:
what the tensors and keys mean is the checkpoints layer's business.
"""
