"""A path -> a validated Checkpoint in the logical names: load (by path), checkpoint (the checks), spec (the
one model_specs loader), shapes (config from tensor shapes), layouts (other tensor names), gguf_schema
(nanoasr's GGUF), ctc and ctc_vocab (FunASR's CTC branch and its vocabulary file); runtimes/ reads other
runtimes' files."""
