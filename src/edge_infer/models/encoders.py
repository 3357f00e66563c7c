"""A multimodal checkpoint's towers on their own, built and loaded: the vision tower and the audio tower.

The engine loads the towers with the thinker (``MultimodalLM`` holds them,
its weight specs list them). This is for the towers alone — their tests,
measurements of an encoder by itself: the configs come from
``ModelConfig`` (Qwen2.5-VL, the Qwen2.5-Omni thinker, the whole Omni model),
the tensors by their canonical names (``visual.``, ``audio_tower.``), the
linears through the given installer (``install_dense`` by default; the
engine's installers put the quantized kernels in as for the decoder).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, TypeVar

import torch

from edge_infer.errors import CheckpointError
from edge_infer.models.audio_encoder import AudioEncoder
from edge_infer.models.checkpoint import check_checkpoint
from edge_infer.models.config import ModelConfig
from edge_infer.models.encoder_weights import TOWER_PREFIXES, tower_weight_specs
from edge_infer.models.loader import LinearInstaller, install_dense, load_weights
from edge_infer.models.vision import VisionEncoder

E = TypeVar("E", VisionEncoder, AudioEncoder)


def load_encoder(encoder: E, model_dir: str | Path, dtype: torch.dtype, install_linear: LinearInstaller | None = None,
                 release: Callable[[], object] | None = None) -> E:
    """Fill ``encoder``'s weights from the checkpoint's tower of its kind."""
    prefix = TOWER_PREFIXES["vision" if isinstance(encoder, VisionEncoder) else "audio"]
    load_weights(encoder, model_dir, dtype, install_linear or install_dense("dense"), release=release, prefix=prefix)
    return encoder.eval().requires_grad_(False)


def load_encoders(model_dir: str | Path, dtype: torch.dtype, install_linear: LinearInstaller | None = None,
                  release: Callable[[], object] | None = None) -> tuple[VisionEncoder, AudioEncoder | None]:
    """The checkpoint's vision encoder and (Omni) audio encoder, loaded."""
    cfg = ModelConfig.from_dir(model_dir)
    mm = cfg.multimodal
    if mm is None:
        raise CheckpointError(f"{model_dir} holds a text model ({cfg.architecture}): it has no media encoders")
    check_checkpoint(cfg, model_dir, tower_weight_specs(mm.vision, mm.audio))  # a missing tower, named
    vision = load_encoder(VisionEncoder(mm.vision), model_dir, dtype, install_linear, release)
    audio = load_encoder(AudioEncoder(mm.audio), model_dir, dtype, install_linear, release) if mm.audio else None
    return vision, audio
