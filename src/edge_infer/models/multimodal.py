"""The thinker of Qwen2.5-VL and Qwen2.5-Omni: the text decoder and, behind one seam, its media encoders.

The engine runs it as the ``DecoderLM`` it is (loading, weight kernels,
the fused decode, ``run_layers`` over input embeddings, positions ``[3, T]``
for its multimodal RoPE). What it adds is ``encode(kind, features)``: one
image, video or audio clip's features in, its embeddings out, one row per
placeholder token, in the decoder's width and dtype. The engine calls
nothing else of an encoder, so a tower can be swapped (a quantized one, one
on another backend) behind ``encoders`` without the engine knowing.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from edge_infer.errors import InvalidRequestError
from edge_infer.models.config import ModelConfig
from edge_infer.models.llama import DecoderLM

# One media item's features (edge_infer.media's VisionFeatures or AudioFeatures) -> [num_tokens, hidden].
MediaEncoder = Callable[[Any], torch.Tensor]


class MultimodalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig, max_positions: int):
        if cfg.multimodal is None:
            raise ValueError(f"{cfg.architecture} is a text model; build a DecoderLM")
        super().__init__(cfg, max_positions)
        # kind (image, video, audio) -> its encoder; images and videos share the vision tower. A kind
        # without one is refused when a request brings it (EngineCore checks `can_encode`).
        self.encoders: dict[str, MediaEncoder] = {}

    def can_encode(self, kind: str) -> bool:
        return kind in self.encoders

    @torch.inference_mode()
    def encode(self, kind: str, features: Any) -> torch.Tensor:
        """The embeddings ``[features.num_tokens, hidden]`` of one media item, in the decoder's dtype."""
        encoder = self.encoders.get(kind)
        if encoder is None:
            raise InvalidRequestError(f"this engine has no {kind} encoder for {self.cfg.architecture}")
        out = encoder(features)
        expected = (features.num_tokens, self.cfg.hidden_size)
        if tuple(out.shape) != expected:
            raise RuntimeError(f"the {kind} encoder returned {tuple(out.shape)} embeddings; the prompt holds {expected}")
        return out.to(self.dtype)
