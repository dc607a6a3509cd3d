"""Fun-ASR-Nano: config, weights, the three networks, prompt, tokenizer and greedy generation."""
