"""Qwen2.5-Omni's audio tower (Whisper-style): one clip's log-mel -> text-model embeddings.

Shapes, for one clip of F frames (``n`` = n_window, chunks of 2n frames; ``L`` = tokens after the conv)::

    mel        [num_mel_bins, F]             the unpadded log-mel (as the Omni processor's attention mask says)
    chunks     [C, num_mel_bins, 2n]         C = ceil(F / 2n); the last chunk zero-padded
    conv1      [C, d_model, 2n]              k=3, pad 1, GELU; columns past the clip's end zeroed
    conv2      [C, d_model, n']              k=3, stride 2, pad 1, GELU; n' = (2n - 1) // 2 + 1
    + sinusoidal positions, restarting at 0 in every chunk
    tokens     [L, d_model]                  L = (F - 1) // 2 + 1: the chunks' valid tokens, in order
    layers     [L, d_model]                  LayerNorm -> attention within each chunk -> LayerNorm -> GELU MLP
    pool       [L // 2 ... , d_model]        average of each pair over the whole clip (an odd last token dropped)
    output     [audio_output_length(F), output_dim]   ln_post, proj

Built without tensors: ``weight_specs()`` lists what the loader installs
(with the tower's prefix); matrix products go through ``Linear``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from edge_infer.models.encoder_config import AUDIO_NORM_EPS, AudioConfig, audio_output_length, conv_output_length
from edge_infer.models.encoder_weights import audio_weight_specs
from edge_infer.models.layers.linear import Linear, products_dtype
from edge_infer.models.layers.segments import Segments
from edge_infer.models.loader import resident_bytes, resolve_target
from edge_infer.models.weights import WeightSpec

__all__ = ["AudioConfig", "AudioEncoder", "sinusoids"]


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's fixed positions ``[length, channels]``: sines of ``channels / 2`` geometric timescales, then cosines."""
    rates = torch.exp(-math.log(max_timescale) / (channels // 2 - 1) * torch.arange(channels // 2).float())
    angles = torch.arange(length)[:, None] * rates[None, :]
    return torch.cat((angles.sin(), angles.cos()), dim=1)


class AudioLayer(nn.Module):
    def __init__(self, cfg: AudioConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.attn_norm: torch.Tensor | None = None
        self.attn_norm_bias: torch.Tensor | None = None
        self.qkv = Linear(d, 3 * d, bias=False)  # k_proj has no bias: q's and v's are added apart
        self.q_bias: torch.Tensor | None = None
        self.v_bias: torch.Tensor | None = None
        self.out_proj = Linear(d, d, bias=True)
        self.mlp_norm: torch.Tensor | None = None
        self.mlp_norm_bias: torch.Tensor | None = None
        self.fc1 = Linear(d, cfg.encoder_ffn_dim, bias=True)
        self.fc2 = Linear(cfg.encoder_ffn_dim, d, bias=True)

    def forward(self, x: torch.Tensor, chunks: Segments) -> torch.Tensor:
        n, d, heads = x.shape[0], self.cfg.d_model, self.cfg.encoder_attention_heads
        h = F.layer_norm(x, (d,), self.attn_norm, self.attn_norm_bias, AUDIO_NORM_EPS)
        q, k, v = self.qkv(h).split(d, dim=-1)
        q, v = q + self.q_bias, v + self.v_bias
        attn = chunks.attend(*(t.reshape(n, heads, -1) for t in (q, k, v)))
        x = x + self.out_proj(attn.reshape(n, d))
        h = F.layer_norm(x, (d,), self.mlp_norm, self.mlp_norm_bias, AUDIO_NORM_EPS)
        return x + self.fc2(F.gelu(self.fc1(h)))


class AudioEncoder(nn.Module):
    def __init__(self, cfg: AudioConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.conv1: torch.Tensor | None = None
        self.conv1_bias: torch.Tensor | None = None
        self.conv2: torch.Tensor | None = None
        self.conv2_bias: torch.Tensor | None = None
        self.layers = nn.ModuleList(AudioLayer(cfg) for _ in range(cfg.encoder_layers))
        self.ln_post: torch.Tensor | None = None
        self.ln_post_bias: torch.Tensor | None = None
        self.proj = Linear(cfg.d_model, cfg.output_dim, bias=True)

    def weight_specs(self) -> list[WeightSpec]:
        return audio_weight_specs(self.cfg)

    def resolve(self, target: str) -> tuple[object, str]:
        return resolve_target(self, target)

    def resident_bytes(self) -> int:
        return resident_bytes(self)

    @property
    def dtype(self) -> torch.dtype:
        return self.conv1.dtype

    def embed(self, mel: torch.Tensor) -> tuple[torch.Tensor, Segments]:
        """The conv front end: mel [num_mel_bins, F] -> tokens [L, d_model] and their chunks."""
        cfg = self.cfg
        frames, size = mel.shape[1], cfg.chunk_frames
        count = -(-frames // size)
        # In fp32 where bf16 is emulated (linear.products_dtype): rounded to the tower's dtype once, at the end.
        products = products_dtype(self.dtype)
        chunks = F.pad(mel.to(products), (0, count * size - frames)).view(cfg.num_mel_bins, count, size).transpose(0, 1)
        x = F.gelu(F.conv1d(chunks, self.conv1.to(products), self.conv1_bias.to(products), padding=1))
        # The last chunk ends with the clip: conv2 must read zeros past it, as a chunk of its own length would.
        tail = frames - (count - 1) * size
        x[-1, :, tail:] = 0
        x = F.gelu(F.conv1d(x, self.conv2.to(products), self.conv2_bias.to(products), stride=2, padding=1))
        x = x.transpose(1, 2) + sinusoids(x.shape[2], cfg.d_model).to(products)  # [C, n', d]
        tokens = conv_output_length(frames)
        full, last = cfg.chunk_tokens, conv_output_length(tail)
        return x.reshape(-1, cfg.d_model)[:tokens].to(self.dtype), Segments([full] * (count - 1) + [last])

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """One clip's log-mel ``[num_mel_bins, frames]`` -> ``[audio_output_length(frames), output_dim]``."""
        cfg = self.cfg
        if mel.dim() != 2 or mel.shape[0] != cfg.num_mel_bins:
            raise ValueError(f"mel has shape {tuple(mel.shape)}; expected ({cfg.num_mel_bins}, frames)")
        out_tokens = audio_output_length(mel.shape[1])
        if out_tokens == 0:
            return mel.new_zeros(0, cfg.output_dim, dtype=self.dtype)
        x, chunks = self.embed(mel)
        for layer in self.layers:
            x = layer(x, chunks)
        x = (x[0: 2 * out_tokens: 2] + x[1: 2 * out_tokens: 2]) / 2
        x = F.layer_norm(x, (cfg.d_model,), self.ln_post, self.ln_post_bias, AUDIO_NORM_EPS)
        return self.proj(x)
