"""The Qwen2.5 vision transformer (Qwen2.5-VL, and Qwen2.5-Omni's thinker): pixels -> text-model embeddings.

Shapes, for a call over N images/videos with grids ``(t_i, h_i, w_i)`` in
patches (``m`` = spatial_merge_size, ``P`` = sum of t_i * h_i * w_i)::

    pixel_values  [P, in_channels * temporal_patch * patch * patch]  fp32, the processor's patch order
                  (per item, per frame: merge blocks of m x m patches in row-major order, each block's
                  patches row-major)
    patch embed   [P, hidden]        the Conv3d (stride = kernel) as one matrix product over flat patches (in fp32
                                     where bf16 is emulated: linear.products_dtype)
    window order  [P, hidden]        whole m x m blocks regrouped window by window (window_units blocks a side;
                                     windows at the right and bottom edges are smaller)
    blocks        [P, hidden]        RMSNorm -> attention (2-D RoPE) -> RMSNorm -> SwiGLU MLP; blocks in
                                     fullatt_block_indexes attend within each frame, the others within windows
    merger        [P / m^2, out_hidden_size]  RMSNorm, m x m blocks concatenated, Linear -> GELU -> Linear
    output        [P / m^2, out_hidden_size]  back in the processor's order: item i's tokens follow item i-1's

Nothing attends across images, videos or frames (transformers' cu_seqlens).
Built without tensors: ``weight_specs()`` lists what the loader installs
(``loader.load_weights``, with the tower's prefix); matrix products go
through ``Linear`` so the quantized kernels can be installed as in the decoder.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from edge_infer.models.encoder_config import VISION_NORM_EPS, VisionConfig
from edge_infer.models.encoder_weights import vision_weight_specs
from edge_infer.models.layers.linear import Linear, products_dtype
from edge_infer.models.layers.native_ops import rms_norm, rotate, swiglu
from edge_infer.models.layers.rope import inverse_frequencies
from edge_infer.models.layers.segments import Segments
from edge_infer.models.loader import resident_bytes, resolve_target
from edge_infer.models.weights import WeightSpec

__all__ = ["VisionConfig", "VisionEncoder", "VisionLayout"]


class VisionLayout:
    """Where each merged block of one call goes: window order, attention segments, 2-D positions.

    A "unit" is one m x m block of patches (one output token); units keep
    their m^2 patches together in every order.
    """

    def __init__(self, cfg: VisionConfig, grid_thw: list[tuple[int, int, int]]) -> None:
        m, s = cfg.spatial_merge_size, cfg.window_units
        orders, unit_hw, window_units, frame_units = [], [], [], []
        first = 0
        for t, h, w in grid_thw:
            if h % m or w % m or min(t, h, w) <= 0:
                raise ValueError(f"grid (t={t}, h={h}, w={w}) must be positive with h and w multiples of "
                                 f"spatial_merge_size={m}")
            rows, cols = h // m, w // m
            units = torch.arange(first, first + t * rows * cols).view(t, rows, cols)
            # Pad to whole windows with -1, then read window by window.
            pad_r, pad_c = -rows % s, -cols % s
            padded = F.pad(units, (0, pad_c, 0, pad_r), value=-1)
            windows = padded.view(t, (rows + pad_r) // s, s, (cols + pad_c) // s, s).permute(0, 1, 3, 2, 4)
            windows = windows.reshape(-1, s * s)
            sizes = (windows >= 0).sum(1)
            orders.append(windows[windows >= 0])
            window_units += sizes[sizes > 0].tolist()
            frame_units += [rows * cols] * t
            r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
            unit_hw.append(torch.stack((r, c), -1).reshape(1, -1, 2).expand(t, -1, -1).reshape(-1, 2))
            first += t * rows * cols
        self.num_units = first
        self.merge_unit = unit = m * m
        self.order = torch.cat(orders)  # unit at each window-order place
        self.windows = Segments([n * unit for n in window_units])
        # Full-attention blocks: within each frame. Windows never cross a frame, so the window
        # order keeps every frame's units together and in frame order.
        self.frames = Segments([n * unit for n in frame_units])
        within = torch.stack(torch.meshgrid(torch.arange(m), torch.arange(m), indexing="ij"), -1).reshape(1, unit, 2)
        # (row, col) in patches of every token, in window order.
        self.positions = (torch.cat(unit_hw)[self.order][:, None, :] * m + within).reshape(-1, 2)

    @property
    def num_patches(self) -> int:
        return self.num_units * self.merge_unit

    def to_window_order(self, x: torch.Tensor) -> torch.Tensor:
        """[P, ...] in the processor's order -> window order (whole units move)."""
        return x.view(self.num_units, self.merge_unit, *x.shape[1:])[self.order].view(x.shape)

    def from_window_order(self, merged: torch.Tensor) -> torch.Tensor:
        """[units, ...] in window order -> the processor's order."""
        out = torch.empty_like(merged)
        out[self.order] = merged
        return out


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.norm1: torch.Tensor | None = None
        self.qkv = Linear(h, 3 * h, bias=True)
        self.proj = Linear(h, h, bias=True)
        self.norm2: torch.Tensor | None = None
        self.gate_up = Linear(h, 2 * i, bias=True)
        self.down = Linear(i, h, bias=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Segments) -> torch.Tensor:
        n, heads, d = x.shape[0], self.cfg.num_heads, self.cfg.head_dim
        qkv = self.qkv(rms_norm(x, self.norm1, VISION_NORM_EPS)).view(n, 3, heads, d)
        # q and k are adjacent: rotate them together, in fp32 as transformers does.
        qk = rotate(qkv[:, :2].reshape(n, 2 * heads, d), cos, sin)
        attn = segments.attend(qk[:, :heads], qk[:, heads:], qkv[:, 2])
        # The residual adds and the activation write into tensors this block made, the same sums as fresh
        # ones: a 448x448 image allocates a quarter fewer bytes per block, each of them a page fault
        # under the encoders' pinned allocator (memory.measure.pin_mmap_threshold).
        x = self.proj(attn.reshape(n, heads * d)).add_(x)
        # SwiGLU: the only activation VisionConfig accepts
        return self.down(swiglu(self.gate_up(rms_norm(x, self.norm2, VISION_NORM_EPS)))).add_(x)


class VisionEncoder(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        merged = cfg.hidden_size * cfg.merge_unit
        self.patch_embed: torch.Tensor | None = None  # the Conv3d weight [hidden, C, T, P, P]
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger_norm: torch.Tensor | None = None
        self.merger_fc1 = Linear(merged, merged, bias=True)
        self.merger_fc2 = Linear(merged, cfg.out_hidden_size, bias=True)
        self.full_attention = frozenset(cfg.fullatt_block_indexes)

    def weight_specs(self) -> list[WeightSpec]:
        return vision_weight_specs(self.cfg)

    def resolve(self, target: str) -> tuple[object, str]:
        return resolve_target(self, target)

    def resident_bytes(self) -> int:
        return resident_bytes(self)

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embed.dtype

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos and signed sin ``[P, 1, head_dim]``: the first half of each head rotates by row, the second by column."""
        inv_freq = inverse_frequencies(self.cfg.head_dim // 2, self.cfg.rope_theta, None)
        angles = (positions[:, :, None].float() * inv_freq).reshape(positions.shape[0], -1)  # [P, head_dim / 2]
        return torch.cat((angles.cos(), angles.cos()), -1)[:, None], torch.cat((-angles.sin(), angles.sin()), -1)[:, None]

    def forward(self, pixel_values: torch.Tensor, grid_thw: list[tuple[int, int, int]]) -> torch.Tensor:
        """``pixel_values`` [P, patch_dim] of the items in ``grid_thw`` -> [P / m^2, out_hidden_size]."""
        cfg = self.cfg
        layout = VisionLayout(cfg, [tuple(int(v) for v in g) for g in grid_thw])
        if tuple(pixel_values.shape) != (layout.num_patches, cfg.patch_dim):
            raise ValueError(f"pixel_values has shape {tuple(pixel_values.shape)}; grids {list(grid_thw)} need "
                             f"({layout.num_patches}, {cfg.patch_dim})")
        products = products_dtype(self.dtype)
        x = F.linear(pixel_values.to(products), self.patch_embed.view(cfg.hidden_size, -1).to(products)).to(self.dtype)
        x = layout.to_window_order(x)
        cos, sin = self.rotary(layout.positions)
        for n, block in enumerate(self.blocks):
            x = block(x, cos, sin, layout.frames if n in self.full_attention else layout.windows)
        x = rms_norm(x, self.merger_norm, VISION_NORM_EPS).view(layout.num_units, -1)
        x = self.merger_fc2(F.gelu(self.merger_fc1(x)))
        return layout.from_window_order(x)
