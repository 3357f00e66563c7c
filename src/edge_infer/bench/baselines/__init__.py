"""Other engines measured by the harness's own method: llama.cpp (GGUF export, quantize, pp-tg, greedy check)."""
