"""libllama, and nothing else: the only package that imports `llama_cpp` (model, vocabulary,
context, batch, sampler chain, LoRA adapters, grammar, log routing)."""
