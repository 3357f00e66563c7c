"""Helpers shared by tests (importable: tests/ is on pytest's pythonpath)."""
from __future__ import annotations

from pathlib import Path

import psutil

FAMILY_CONFIGS = {
    # Odd shapes on purpose: head counts that are not powers of two, MQA, head_dim != hidden / heads.
    "llama": dict(
        cls="LlamaConfig", vocab_size=384, hidden_size=96, intermediate_size=160, num_hidden_layers=3,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64},
    ),
    "qwen2": dict(
        cls="Qwen2Config", vocab_size=384, hidden_size=80, intermediate_size=144, num_hidden_layers=2,
        num_attention_heads=5, num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True,
        rope_theta=1000000.0,
    ),
    "qwen3": dict(
        cls="Qwen3Config", vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=3, num_key_value_heads=1, head_dim=40, max_position_embeddings=512,
        tie_word_embeddings=True, rope_theta=1000000.0,
    ),
    "mistral": dict(
        cls="MistralConfig", vocab_size=384, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=512, tie_word_embeddings=False,
        sliding_window=24,
    ),
}


def write_hf_checkpoint(path: Path, family: str, **overrides) -> Path:
    """A random checkpoint written by transformers itself (fp32), for parity tests."""
    import torch
    import transformers

    spec = {**FAMILY_CONFIGS[family], **overrides}
    cls = getattr(transformers, spec.pop("cls"))
    # A wide init makes greedy outputs vary, so a token-for-token match means something.
    config = cls(initializer_range=0.15, **spec)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(path)
    return path


def live_children():
    """Child processes of this test process, except multiprocessing's resource tracker."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.is_running() and child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


def packed_kernel(kernel_class, weight, group_size: int, symmetric: bool, dtype, block_rows: int = 128, bits: int = 4,
                  **kernel_kw):
    """``weight`` quantized to ``bits`` and packed into ``kernel_class`` (Int4Kernel, W4A8Kernel, W8A8Kernel) in
    blocks of rows, as the loader does; returns the kernel and the quantized rows."""
    from edge_infer.quant.quantize import quantize_rows

    q = quantize_rows(weight, group_size, symmetric, bits)
    kernel = kernel_class(weight.shape[0], weight.shape[1], group_size, dtype, **kernel_kw)
    for start in range(0, weight.shape[0], block_rows):
        sl = slice(start, start + block_rows)
        kernel.write_rows(start, q.codes[sl], q.scales[sl], q.zeros[sl])
    return kernel, q


def runnable_variants() -> list[str]:
    """The ISA variants of edge-infer's kernels this CPU runs (masks included), fastest first; the scalar reference last."""
    from edge_infer.hardware.cpu import detect
    from edge_infer.hardware.kernels import NATIVE_VARIANTS

    cpu = detect()
    return [v.name for v in NATIVE_VARIANTS if v.arch == cpu.arch and cpu.has(*v.needs)] + ["scalar"]


def require_built(variant: str) -> None:
    """Skip, naming why, when the built library lacks ``variant`` (its compiler could not build it)."""
    import pytest

    from edge_infer.quant.native import built_variants

    if variant not in built_variants():
        pytest.skip(f"the kernel library was built without the {variant} variant (the compiler lacks its flags)")


def on_variant(model, variant: str):
    """``model`` (a DecoderLM) with every int8 kernel, and so the fused layer built at its next decode, on ``variant``."""
    require_built(variant)
    for _, lin in model.linears():
        if hasattr(lin.kernel, "variant"):
            lin.kernel.variant = variant
    model.fused_decode = None
    return model
