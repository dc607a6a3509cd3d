"""Other runtimes' files in the logical names: FunASR's model.pt folder (funasr), FunASR's llama.cpp GGUF pair
(funasr_llamacpp), and the GGUFs of transcribe.cpp, CrispASR and audio.cpp."""
