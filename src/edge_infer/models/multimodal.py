"""The thinker of Qwen2.5-VL and Qwen2.5-Omni: the text decoder and, behind one seam, its media encoders.

The engine runs it as the ``DecoderLM`` it is (loading, weight kernels,
the fused decode, ``run_layers`` over input embeddings, positions ``[3, T]``
for its multimodal RoPE). It also holds the towers — ``visual`` (the ViT:
images and videos) and, for Omni, ``audio_tower`` — named as their tensors
are, so its ``weight_specs()`` list them beside the decoder's and one
``load_weights`` fills both (the installer sees each linear's target and may
give the towers kernels of their own). What it adds for the engine is
``encode(kind, features)``: one image, video or audio clip's features in, its
embeddings out, one row per placeholder token, in the decoder's width and
dtype. The engine calls nothing else of an encoder, so a tower can be swapped
(a quantized one, one on another backend) behind ``encoders`` without the
engine knowing. Built with ``towers=False`` it holds the decoder alone (a
thinker fed embeddings by an encoder stage): its weight specs and
``encoders`` are empty, and every item must come with its embeddings.
``tower_encoders`` and ``encode_item`` are the same seam over towers held
anywhere, e.g. by the encoder stage (runtime/encoder_executor.py), which
loads them without a decoder (models/encoders.py).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from edge_infer.errors import InvalidRequestError
from edge_infer.models.audio_encoder import AudioEncoder
from edge_infer.models.config import ModelConfig
from edge_infer.models.encoder_weights import TOWER_PREFIXES, is_tower_spec
from edge_infer.models.llama import DecoderLM
from edge_infer.models.vision import VisionEncoder
from edge_infer.models.weights import WeightSpec

# One media item's features (edge_infer.media's VisionFeatures or AudioFeatures) -> [num_tokens, hidden].
MediaEncoder = Callable[[Any], torch.Tensor]


def tower_encoders(visual: VisionEncoder | None, audio: AudioEncoder | None) -> dict[str, MediaEncoder]:
    """kind (image, video, audio) -> its encoder; images and videos share the vision tower. The features are
    edge_infer.media's (a layer above this one): VisionFeatures, AudioFeatures."""
    encoders: dict[str, MediaEncoder] = {}
    if visual is not None:
        def see(f: Any) -> torch.Tensor:
            return visual(torch.from_numpy(f.pixel_values), [f.grid_thw])

        encoders.update(image=see, video=see)
    if audio is not None:
        encoders["audio"] = lambda f: audio(torch.from_numpy(f.mel))
    return encoders


@torch.inference_mode()
def encode_item(encoders: dict[str, MediaEncoder], kind: str, features: Any, hidden_size: int, dtype: torch.dtype,
                architecture: str) -> torch.Tensor:
    """The embeddings ``[features.num_tokens, hidden_size]`` of one media item, in ``dtype``."""
    encoder = encoders.get(kind)
    if encoder is None:
        raise InvalidRequestError(f"this engine has no {kind} encoder for {architecture}")
    out = encoder(features)
    expected = (features.num_tokens, hidden_size)
    if tuple(out.shape) != expected:
        raise RuntimeError(f"the {kind} encoder returned {tuple(out.shape)} embeddings; the prompt holds {expected}")
    return out.to(dtype)


class MultimodalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig, max_positions: int, towers: bool = True):
        if cfg.multimodal is None:
            raise ValueError(f"{cfg.architecture} is a text model; build a DecoderLM")
        super().__init__(cfg, max_positions)
        mm = cfg.multimodal
        self.visual = VisionEncoder(mm.vision) if towers else None
        self.audio_tower = AudioEncoder(mm.audio) if towers and mm.audio is not None else None
        # A kind without an encoder is refused when a request brings its features (EngineCore checks
        # `can_encode`); items that come with their embeddings need none.
        self.encoders: dict[str, MediaEncoder] = tower_encoders(self.visual, self.audio_tower)

    def weight_specs(self) -> list[WeightSpec]:
        specs = super().weight_specs()
        return specs if self.visual is not None else [s for s in specs if not is_tower_spec(s)]

    def towers(self) -> dict[str, VisionEncoder | AudioEncoder]:
        """The towers by kind (vision, audio)."""
        found = {"vision": self.visual, "audio": self.audio_tower}
        return {kind: tower for kind, tower in found.items() if tower is not None}

    def can_encode(self, kind: str) -> bool:
        return kind in self.encoders

    def encode(self, kind: str, features: Any) -> torch.Tensor:
        """The embeddings ``[features.num_tokens, hidden]`` of one media item, in the decoder's dtype."""
        return encode_item(self.encoders, kind, features, self.cfg.hidden_size, self.dtype, self.cfg.architecture)

    def kernels_by_kind(self) -> dict[str, str]:
        towers = sorted({lin.kernel.label for name, lin in self.linears()
                         if name.startswith(tuple(TOWER_PREFIXES.values())) and lin.kernel is not None})
        return {**super().kernels_by_kind(), **({"encoder linears": "+".join(towers)} if towers else {})}

    def tower_bytes(self) -> dict[str, int]:
        """Resident bytes of each tower's weights."""
        return {kind: tower.resident_bytes() for kind, tower in self.towers().items()}

    def resident_bytes(self) -> int:
        return super().resident_bytes() + sum(self.tower_bytes().values())

    def decode_read_bytes(self) -> int:
        """A decode step reads the decoder's weights, never the towers'."""
        return super().decode_read_bytes() - sum(self.tower_bytes().values())
