"""The Talker: an autoregressive decoder over codec frames, and its code predictor.

Per frame the Talker's decoder predicts the first codebook's code from its
last hidden state (``codec_head``); the code predictor, a small decoder of
its own, then predicts the remaining ``num_code_groups - 1`` residual codes
one by one, conditioned on that hidden state and the codes so far. The sum
of the frame's code embeddings (plus one text embedding) is the Talker's
next input.

Module attributes mirror the checkpoint's ``talker.*`` weight names.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from edge_infer.models.qwen3_tts.attention import ContiguousKVCache, KVCache
from edge_infer.models.qwen3_tts.config import CodePredictorConfig, Qwen3TTSConfig, TalkerConfig
from edge_infer.models.qwen3_tts.layers import DecoderStack

# Chooses a code from a logits vector.
CodeSelector = Callable[[torch.Tensor], int]


class TextProjection(nn.Module):
    """text_hidden -> hidden through a SiLU MLP (the text embedding lives in the text model's width)."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerModel(DecoderStack):
    def __init__(self, config: TalkerConfig) -> None:
        super().__init__(config.shape, qk_norm=True, layer_scale=False)
        self.codec_embedding = nn.Embedding(config.vocab_size, config.shape.hidden_size)
        self.text_embedding = nn.Embedding(config.text_vocab_size, config.text_hidden_size)


class CodePredictorModel(DecoderStack):
    def __init__(self, config: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__(config.shape, qk_norm=True, layer_scale=False)
        # Residual codebook i's embedding lives in the Talker's width: it feeds both models.
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(config.codebook_size, talker_hidden) for _ in range(config.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    def __init__(self, config: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__()
        self.config = config
        self.model = CodePredictorModel(config, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(config.shape.hidden_size, config.codebook_size, bias=False)
            for _ in range(config.num_code_groups - 1)
        )
        # Present in the checkpoint only when the widths differ (e.g. the 1.7B Talker).
        self.small_to_mtp_projection = (
            nn.Linear(talker_hidden, config.shape.hidden_size, bias=True)
            if config.shape.hidden_size != talker_hidden else nn.Identity()
        )

    def new_cache(self, like: torch.Tensor) -> ContiguousKVCache:
        shape = self.config.shape
        return ContiguousKVCache(shape.num_layers, self.config.num_code_groups, shape.num_kv_heads,
                                 shape.head_dim, dtype=like.dtype, device=like.device)

    def predict(self, talker_hidden: torch.Tensor, first_code_embedding: torch.Tensor,
                select: CodeSelector, cache: ContiguousKVCache) -> list[int]:
        """Residual codes 1..G-1 of one frame.

        The sequence is [talker hidden state, embedding of the first code,
        embeddings of residual codes 1..G-2]; position i's output through
        ``lm_head[i-1]`` gives residual code i.
        """
        cache.reset()
        x = torch.stack((talker_hidden, first_code_embedding))
        codes: list[int] = []
        for step in range(self.config.num_code_groups - 1):
            hidden = self.model(self.small_to_mtp_projection(x), cache)
            cache.advance(x.shape[0])
            code = select(self.lm_head[step](hidden[-1]))
            codes.append(code)
            if step + 1 < len(self.lm_head):
                x = self.model.codec_embedding[step](torch.tensor([code], device=hidden.device))
        return codes


class Talker(nn.Module):
    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        self.config = config
        self.model = TalkerModel(config)
        self.text_projection = TextProjection(config.text_hidden_size, config.shape.hidden_size)
        self.codec_head = nn.Linear(config.shape.hidden_size, config.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config.code_predictor, config.shape.hidden_size)

    def embed_text(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.codec_head.weight.device)
        return self.text_projection(self.model.text_embedding(ids))

    def embed_codec(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.codec_head.weight.device)
        return self.model.codec_embedding(ids)

    def embed_frame(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of a frame's code embeddings: first code in the Talker's table, residuals in the predictor's."""
        parts = [self.model.codec_embedding(codes[:1])]
        parts += [table(codes[i + 1:i + 2]) for i, table in enumerate(self.code_predictor.model.codec_embedding)]
        return torch.cat(parts).sum(0)

    def new_cache(self, capacity: int, dtype: torch.dtype | None = None) -> ContiguousKVCache:
        shape = self.config.shape
        weight = self.codec_head.weight
        return ContiguousKVCache(shape.num_layers, capacity, shape.num_kv_heads, shape.head_dim,
                                 dtype=dtype or weight.dtype, device=weight.device)

    def forward(self, embeds: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run [T, hidden] input embeddings through the decoder; returns the normed hidden states."""
        hidden = self.model(embeds, cache)
        cache.advance(embeds.shape[0])
        return hidden


class Qwen3TTSTalkerCheckpoint(nn.Module):
    """The root of config.json's model: only ``talker`` (CustomVoice has no speaker encoder)."""

    def __init__(self, config: Qwen3TTSConfig) -> None:
        super().__init__()
        self.config = config
        self.talker = Talker(config.talker)
