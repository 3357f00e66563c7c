"""A multimodal checkpoint's encoders, built and loaded: the vision tower and the audio tower.

``load_encoders`` reads ``config.json`` (Qwen2.5-VL, the Qwen2.5-Omni
thinker, or the whole Omni model), finds each tower's prefix among the
checkpoint's tensor names and installs its weights with the given linear
installer (``install_dense`` by default; the engine passes its own, so the
quantized kernels apply to the encoders as to the decoder).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, TypeVar

import torch

from edge_infer.errors import CheckpointError
from edge_infer.models.audio_encoder import AudioEncoder
from edge_infer.models.checkpoint import read_tensor_index
from edge_infer.models.encoder_config import encoder_configs
from edge_infer.models.encoder_weights import tower_prefix
from edge_infer.models.loader import LinearInstaller, install_dense, load_weights
from edge_infer.models.vision import VisionEncoder

E = TypeVar("E", VisionEncoder, AudioEncoder)


def load_encoder(encoder: E, model_dir: str | Path, dtype: torch.dtype, install_linear: LinearInstaller | None = None,
                 prefix: str | None = None, release: Callable[[], object] | None = None) -> E:
    """Fill ``encoder``'s weights from the checkpoint (its tower found by name unless ``prefix`` is given)."""
    if prefix is None:
        kind = "vision" if isinstance(encoder, VisionEncoder) else "audio"
        prefix = tower_prefix(read_tensor_index(Path(model_dir)), kind, where=f"checkpoint {model_dir}")
    load_weights(encoder, model_dir, dtype, install_linear or install_dense("dense"), release=release, prefix=prefix)
    return encoder.eval().requires_grad_(False)


def load_encoders(model_dir: str | Path, dtype: torch.dtype, install_linear: LinearInstaller | None = None,
                  release: Callable[[], object] | None = None) -> tuple[VisionEncoder | None, AudioEncoder | None]:
    """The checkpoint's vision and audio encoders, loaded (None for a tower its config.json does not have)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: a checkpoint directory needs config.json next to its *.safetensors")
    vision_cfg, audio_cfg = encoder_configs(json.loads(path.read_text()), where=str(path))
    vision = load_encoder(VisionEncoder(vision_cfg), model_dir, dtype, install_linear, release=release) if vision_cfg else None
    audio = load_encoder(AudioEncoder(audio_cfg), model_dir, dtype, install_linear, release=release) if audio_cfg else None
    return vision, audio
