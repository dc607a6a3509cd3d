"""Speed measurements: the end-to-end benchmark and the per-kernel, per-stage and per-instruction probes."""
