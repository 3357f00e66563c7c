"""The Qwen3-TTS Talker as engine decoders: its layers run over the paged KV cache.

The Talker's decoder and its code predictor are Qwen3-architecture stacks
(q/k RMSNorm, GQA, 1-D RoPE), so both are ``DecoderLM``s of the text engine:
fused q/k/v and gate/up, the engine's weight kernels (oneDNN bf16, and the
int4 path when quantization is set) and ``paged_attention``.
``talker_weights`` maps the checkpoint names. The text side (text embedding
+ projection MLP) only builds prompts; it is a plain torch module
(``TextSide``) in the model's dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from edge_infer.memory.measure import malloc_trim
from edge_infer.config import EngineConfig
from edge_infer.models.config import ModelConfig
from edge_infer.models.layers.linear import Linear
from edge_infer.models.llama import DecoderLM, rms_norm
from edge_infer.models.checkpoint import read_tensor_index
from edge_infer.models.loader import TORCH_DTYPES, LinearInstaller, load_module, load_weights
from edge_infer.models.qwen3_tts.config import Qwen3TTSConfig
from edge_infer.models.qwen3_tts.talker import TextProjection
from edge_infer.models.weights import WeightSpec
from edge_infer.models.qwen3_tts.talker_weights import (
    predictor_decoder_config, predictor_specs, talker_decoder_config, talker_specs, text_side_shapes,
)


class TalkerDecoder(DecoderLM):
    """The Talker's decoder: codec embedding in, codec head out."""

    def weight_specs(self) -> list[WeightSpec]:
        return talker_specs(self.cfg)

    def head(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Final norm over decoder outputs ``[n, hidden]``; returns (normed hidden, fp32 codec logits)."""
        normed = rms_norm(hidden, self.final_norm, self.cfg.rms_norm_eps)
        return normed, self.lm_head(normed).float()


class PredictorDecoder(DecoderLM):
    """The code predictor: one output head per residual codebook, embeddings of residual codes stacked.

    ``embed`` holds the residual codebooks' tables one after the other (in
    the Talker's width): code ``c`` of residual codebook ``i`` (1-based) is
    row ``(i - 1) * codebook_size + c``.
    """

    def __init__(self, cfg: ModelConfig, talker_hidden: int, num_code_groups: int):
        super().__init__(cfg, max_positions=num_code_groups)
        self.talker_hidden = talker_hidden
        self.codebook_size = cfg.vocab_size
        self.num_residual = num_code_groups - 1
        self.heads = nn.ModuleList(Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(self.num_residual))
        # Only when the widths differ (e.g. the 1.7B Talker).
        self.projection = Linear(talker_hidden, cfg.hidden_size, bias=True) if talker_hidden != cfg.hidden_size else None

    def weight_specs(self) -> list[WeightSpec]:
        return predictor_specs(self.cfg, self.talker_hidden, self.num_residual + 1)

    def resident_bytes(self) -> int:
        extra = sum(h.resident_bytes for h in self.heads)
        return super().resident_bytes() + extra + (self.projection.resident_bytes if self.projection is not None else 0)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(x) if self.projection is not None else x

    def embed_residual(self, codebook: int, codes: torch.Tensor) -> torch.Tensor:
        """Embeddings (Talker width) of codes of residual codebook ``codebook`` (1-based)."""
        return F.embedding(codes + (codebook - 1) * self.codebook_size, self.embed)


class _TextModel(nn.Module):
    def __init__(self, config: Qwen3TTSConfig) -> None:
        super().__init__()
        talker = config.talker
        # An explicit (uninitialised) weight: Embedding's own init on the meta device imports sympy, +67 MB RssAnon.
        shape = (talker.text_vocab_size, talker.text_hidden_size)
        self.text_embedding = nn.Embedding(*shape, _weight=torch.empty(shape))


class _TalkerText(nn.Module):
    def __init__(self, config: Qwen3TTSConfig) -> None:
        super().__init__()
        self.model = _TextModel(config)
        self.text_projection = TextProjection(config.talker.text_hidden_size, config.talker.shape.hidden_size)


class TextSide(nn.Module):
    """``talker.model.text_embedding`` and ``talker.text_projection``: text ids -> Talker inputs."""

    def __init__(self, config: Qwen3TTSConfig) -> None:
        super().__init__()
        self.talker = _TalkerText(config)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.talker.text_projection(self.talker.model.text_embedding(ids))


@dataclass
class PagedTalker:
    """The loaded Talker: decoder, code predictor and text side, plus the embeddings a prompt needs."""

    config: Qwen3TTSConfig
    decoder: TalkerDecoder
    predictor: PredictorDecoder
    text: TextSide

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.dtype

    # The embedding interface of ``build_prompt``.

    def embed_text(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        return self.text(torch.as_tensor(ids, dtype=torch.long))

    def embed_codec(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(torch.as_tensor(ids, dtype=torch.long))

    def embed_frame(self, frame: torch.Tensor) -> torch.Tensor:
        """Sum of a frame's code embeddings: first code in the Talker's table, residuals in the predictor's."""
        offsets = frame[1:] + torch.arange(self.predictor.num_residual) * self.predictor.codebook_size
        parts = torch.cat((self.decoder.embed_tokens(frame[:1]), F.embedding(offsets, self.predictor.embed)))
        return parts.sum(0)

    def resident_bytes(self) -> int:
        text = sum(p.numel() * p.element_size() for p in self.text.parameters())
        return self.decoder.resident_bytes() + self.predictor.resident_bytes() + text


def load_paged_talker(model_dir: str | Path, config: Qwen3TTSConfig, engine: EngineConfig,
                      install_linear: LinearInstaller) -> PagedTalker:
    """Build and fill the Talker's decoders (through the engine's loader) and its text side."""
    dtype = TORCH_DTYPES[engine.dtype]
    talker = config.talker
    decoder = TalkerDecoder(talker_decoder_config(config, engine.max_model_len, engine.dtype), engine.max_model_len)
    predictor = PredictorDecoder(predictor_decoder_config(config, engine.dtype), talker.shape.hidden_size,
                                 talker.num_code_groups)
    for model in (decoder, predictor):
        load_weights(model, model_dir, dtype, install_linear, release=malloc_trim)
        if engine.quant is not None:
            from edge_infer.quant.fused_decode import offer

            offer(model, engine.quant)
    # Everything else in model.safetensors belongs to the decoders (or to voice cloning's speaker encoder).
    text_side = text_side_shapes(config)
    others = tuple(name for name in read_tensor_index(model_dir) if name not in text_side)
    text = load_module(lambda: TextSide(config), model_dir, dtype, ignore=others)
    return PagedTalker(config, decoder.eval(), predictor.eval(), text)
