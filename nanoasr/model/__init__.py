"""Fun-ASR-Nano's networks and decoding, (x, weights, cfg) -> y with no file access: config, encoder, adaptor,
the CTC head, decoder, prompt, tokenizer and greedy generation."""
