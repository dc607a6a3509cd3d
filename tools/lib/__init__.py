"""What the tests and the scripts share: speech-like audio (synth), the parity checks against reference
outputs (parity), the measuring tools' environment and timer (measure), and the reference probes' GGUF writing
(gguf_file). Kept under tools/, not tests/, because the scripts import them too and tools never import
tests."""
