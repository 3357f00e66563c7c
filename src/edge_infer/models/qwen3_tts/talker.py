"""The Talker: an autoregressive decoder over codec frames, its code predictor, and its text side.

Per frame the decoder predicts the first codebook's code from its last
hidden state (``codec_head``); the code predictor, a small decoder of its
own, then predicts the remaining ``num_code_groups - 1`` residual codes one
by one, conditioned on that hidden state and the codes so far. The sum of
the frame's code embeddings (plus one text embedding) is the decoder's next
input.

Both decoders are Qwen3-architecture stacks (q/k RMSNorm, GQA, 1-D RoPE),
so both are the text engine's ``DecoderLM``: fused q/k/v and gate/up, the
engine's weight kernels and ``paged_attention`` over a paged KV cache.
``talker_weights`` maps the checkpoint names. The text side (text
embedding + projection MLP) only builds prompts; it is a plain torch module
(``TextSide``) in the model's dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from edge_infer.models.config import ModelConfig
from edge_infer.models.layers.linear import Linear
from edge_infer.models.layers.native_ops import rms_norm
from edge_infer.models.llama import DecoderLM
from edge_infer.models.qwen3_tts.config import Qwen3TTSConfig
from edge_infer.models.qwen3_tts.talker_weights import predictor_specs, talker_specs
from edge_infer.models.weights import WeightSpec


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
    the Talker's width, as they also feed the Talker): code ``c`` of
    residual codebook ``i`` (1-based) is row ``(i - 1) * codebook_size + c``.
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


class TextProjection(nn.Module):
    """text_hidden -> hidden through a SiLU MLP (the text embedding lives in the text model's width)."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class _TextModel(nn.Module):
    """Holds ``text_embedding`` only to give it the checkpoint's name, ``model.text_embedding``."""

    def __init__(self, config: Qwen3TTSConfig) -> None:
        super().__init__()
        talker = config.talker
        # An explicit (uninitialised) weight: Embedding's own init on the meta device imports sympy, +67 MB RssAnon.
        shape = (talker.text_vocab_size, talker.text_hidden_size)
        self.text_embedding = nn.Embedding(*shape, _weight=torch.empty(shape))


class TextSide(nn.Module):
    """``talker.model.text_embedding`` and ``talker.text_projection`` (load with prefix ``talker.``): text ids -> Talker inputs."""

    def __init__(self, config: Qwen3TTSConfig) -> None:
        super().__init__()
        self.model = _TextModel(config)
        self.text_projection = TextProjection(config.talker.text_hidden_size, config.talker.shape.hidden_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self.model.text_embedding(ids))


@dataclass
class Talker:
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
