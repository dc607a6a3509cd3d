"""Reference probes: build random-weight checkpoints in the official layout and dump Transformers outputs."""
