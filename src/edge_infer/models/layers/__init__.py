"""Layers of the decoder models: linear kernels, RoPE, the paged KV cache and attention over it."""
