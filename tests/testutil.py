"""Helpers shared by tests (importable: tests/ is on pytest's pythonpath)."""
from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]

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


def load_script(name: str):
    """A module of scripts/ (not a package), loaded by path once."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


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


# Tiny thinkers of odd shapes (transformers-written): the text decoders differ from each other and from the
# text families, the towers are small (the media ids are mm_prompts'; vocabularies of 300 hold them).
THINKER_TEXT = {
    "qwen2_5_vl": dict(vocab_size=300, hidden_size=120, intermediate_size=144, num_hidden_layers=2,
                       num_attention_heads=5, num_key_value_heads=1, max_position_embeddings=2048,
                       rope_parameters={"rope_type": "default", "mrope_section": [2, 5, 5], "rope_theta": 1e6}),
    "qwen2_5_omni": dict(vocab_size=300, hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=2048,
                         rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e6}),
}
THINKER_VISION = dict(depth=2, hidden_size=32, intermediate_size=40, num_heads=2, fullatt_block_indexes=[1],
                      window_size=56)
THINKER_AUDIO = dict(num_mel_bins=16, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=40, d_model=32,
                     n_window=10, max_source_positions=400)


def unit_scale(model, seed: int = 1) -> None:
    """Redraw ``model``'s parameters at unit scale: norms near 1, matrices scaled by fan-in, biases small. At
    transformers' 0.02 init the towers' deep layers are near identity and their outputs near zero; these move the
    output at every layer."""
    import math

    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() == 1 and ("norm" in name or "ln_" in name):
                p.copy_(1 + 0.2 * noise)
            elif p.dim() == 1:
                p.copy_(0.2 * noise)
            else:
                p.copy_(noise / math.sqrt(p[0].numel()))


def write_thinker_checkpoint(path: Path, kind: str, tie_word_embeddings: bool = False, vision: dict | None = None,
                             audio: dict | None = None) -> Path:
    """A random thinker written by transformers (fp32): ``kind`` is qwen2_5_vl, qwen2_5_omni_thinker or
    qwen2_5_omni (the full model: the same thinker under ``thinker.``, and stand-ins for the talker's and
    token2wav's tensors, which edge-infer neither loads nor counts). ``vision`` / ``audio`` change the
    towers' shapes (THINKER_VISION, THINKER_AUDIO)."""
    import json

    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from mm_prompts import OMNI_TOKEN_IDS, TOKEN_IDS

    family = "qwen2_5_vl" if kind == "qwen2_5_vl" else "qwen2_5_omni"
    text = THINKER_TEXT[family]
    audio = dict(THINKER_AUDIO, **(audio or {}))
    vision = dict(THINKER_VISION, **(vision or {}), out_hidden_size=text["hidden_size"])
    if family == "qwen2_5_vl":
        config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=dict(vision, tokens_per_second=2),
                                               tie_word_embeddings=tie_word_embeddings, **TOKEN_IDS)
        model_cls = transformers.Qwen2_5_VLForConditionalGeneration
    else:
        ids = {k.replace("_token_id", "_token_index") if k in ("image_token_id", "video_token_id", "audio_token_id")
               else k: v for k, v in OMNI_TOKEN_IDS.items()}
        config = transformers.Qwen2_5OmniThinkerConfig(
            text_config=text, vision_config=vision, audio_config=dict(audio, output_dim=text["hidden_size"]),
            tie_word_embeddings=tie_word_embeddings, **ids)
        model_cls = transformers.Qwen2_5OmniThinkerForConditionalGeneration
    config.get_text_config().initializer_range = 0.15  # a wide init: greedy outputs vary
    torch.manual_seed(0)
    model = model_cls(config).to(torch.float32).eval()
    for tower in (model.model.visual, getattr(model.model, "audio_tower", None)):
        if tower is not None:  # media change the output: two images give two answers
            unit_scale(tower)
    model.save_pretrained(path)
    if kind == "qwen2_5_omni":
        weights = {f"thinker.{k}": v for k, v in load_file(path / "model.safetensors").items()}
        weights["talker.model.embed_tokens.weight"] = torch.zeros(64, 8)
        weights["token2wav.code2wav_dit_model.proj.weight"] = torch.zeros(8, 8)
        save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
        full = transformers.Qwen2_5OmniConfig(thinker_config=config.to_dict(), enable_audio_output=True).to_dict()
        full["architectures"] = ["Qwen2_5OmniForConditionalGeneration"]
        (path / "config.json").write_text(json.dumps(full, indent=2))
    return path


def load_thinker(path: Path):
    """The transformers model of a ``write_thinker_checkpoint`` directory (for the full Omni model, its thinker)."""
    import json
    import tempfile

    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    raw = json.loads((Path(path) / "config.json").read_text())
    if "thinker_config" not in raw:
        return getattr(transformers, raw["architectures"][0]).from_pretrained(path, dtype=torch.float32).eval()
    with tempfile.TemporaryDirectory() as tmp:  # the thinker alone, as transformers saves it
        (Path(tmp) / "config.json").write_text(json.dumps(
            dict(raw["thinker_config"], architectures=["Qwen2_5OmniThinkerForConditionalGeneration"])))
        save_file({k.removeprefix("thinker."): v for k, v in load_file(Path(path) / "model.safetensors").items()
                   if k.startswith("thinker.")}, Path(tmp) / "model.safetensors", metadata={"format": "pt"})
        return transformers.Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(tmp, dtype=torch.float32).eval()


class LoopThread:
    """An event loop on its own thread, so a pipeline can outlive one test."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=180):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def wait_until(predicate, timeout=30.0, interval=0.05) -> bool:
    """Whether ``predicate`` holds within ``timeout`` seconds (polled; True as soon as it does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
