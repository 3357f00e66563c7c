"""Random Qwen3-TTS checkpoints in the real layout (for tests and benchmarks).

``write_random_checkpoint(out_dir, preset)`` writes config.json,
generation_config.json, the text tokenizer files, model.safetensors
(``talker.*``) and speech_tokenizer/ (config, preprocessor config,
``decoder.*`` weights). The codec's encoder (audio -> codes, only used for
voice cloning) is not written; its config is, so the layout is complete for
CustomVoice. The text tokenizer is a small byte-level BPE whose special
tokens sit at the preset's ids (the real ones for ``qwen3-tts-0.6b``).

Weight values: ``random_tensor`` scales each tensor so activations stay
O(1) through the stacks (the fixture script uses the same rule on the
reference model).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from edge_infer.models.qwen3_tts.code2wav import Code2Wav
from edge_infer.models.qwen3_tts.config import parse_code2wav_config, parse_config
from edge_infer.models.qwen3_tts.layout import SPEECH_TOKENIZER_DIR, write_configs
from edge_infer.models.qwen3_tts.presets import checkpoint_spec
from edge_infer.models.qwen3_tts.talker_weights import checkpoint_shapes

DEFAULT_DTYPES = {"tiny": torch.float32, "qwen3-tts-0.6b": torch.bfloat16}


def random_tensor(name: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """A float32 value for the weight ``name``: the scale depends on what the tensor is."""
    leaf = name.rsplit(".", 1)[-1]
    noise = torch.randn(shape, generator=generator)
    if "embedding" in name and len(shape) == 2:
        return noise
    if len(shape) >= 2:
        value = noise / math.sqrt(math.prod(shape[1:]))
        if name.endswith("self_attn.o_proj.weight"):
            # Stronger attention: codes then depend on the whole prompt, not mostly on the last position.
            value = 3.0 * value
        if ".conv2.conv." in name:
            # Damped residual branches keep Code2Wav's amplitudes (and its rounding sensitivity) small.
            value = 0.3 * value
        return value
    if leaf == "cluster_usage":
        return 0.5 + torch.rand(shape, generator=generator)
    if leaf in ("alpha", "beta"):
        return 0.2 * noise
    if leaf in ("scale", "gamma"):
        return 0.5 + 0.1 * noise
    if leaf == "bias":
        return (0.03 if ".conv2.conv." in name else 0.1) * noise
    return 1.0 + 0.1 * noise  # norm weights


def _random_state(shapes: dict[str, tuple[int, ...]], seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    # Drawn in name order, so a tensor's value depends only on the names, not on how they were listed.
    generator = torch.Generator().manual_seed(seed)
    return {name: random_tensor(name, shape, generator).to(dtype) for name, shape in sorted(shapes.items())}


def write_random_checkpoint(out_dir: str | Path, preset: str = "tiny", seed: int = 0,
                            dtype: torch.dtype | None = None) -> Path:
    """Write a random checkpoint of ``preset`` ("tiny" or "qwen3-tts-0.6b") to ``out_dir``."""
    spec = checkpoint_spec(preset)
    dtype = dtype or DEFAULT_DTYPES[preset]
    out = Path(out_dir)
    write_configs(out, spec)
    with torch.device("meta"):
        code2wav = Code2Wav(parse_code2wav_config(spec.speech_tokenizer_config))
    talker = checkpoint_shapes(parse_config(spec.config))
    decoder = {"decoder." + name: tuple(param.shape) for name, param in code2wav.named_parameters()}
    save_file(_random_state(talker, seed, dtype), str(out / "model.safetensors"), metadata={"format": "pt"})
    save_file(_random_state(decoder, seed + 1, dtype),
              str(out / SPEECH_TOKENIZER_DIR / "model.safetensors"), metadata={"format": "pt"})
    return out
