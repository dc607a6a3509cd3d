"""File formats: safetensors (memory-mapped reader) and GGUF (nanoasr's schema: read, write, convert)."""
