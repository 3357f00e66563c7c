"""Attention within independent segments of one packed sequence (block-diagonal attention).

The encoders pack everything of one call into ``[T, ...]``: the ViT's
windows, frames and images, the audio tower's chunks. Tokens attend only
within their segment (non-causally). ``Segments`` groups the segments by
length and runs one batched SDPA call per length: released windows are
all 64 tokens except at an image's right and bottom edges, audio chunks
all ``n_window`` tokens except the last, so a call is one to a few SDPA
invocations. Measured at the 3B ViT shape (16 heads of 80) on one
448x448 image (1024 tokens, 16 windows of 64), one window layer, 2 threads,
min of 15 runs on a shared (loaded) machine, fp32 / bf16: batched by
length 20 / 17 ms; one SDPA call per window 35 / 78 ms; one call over all
1024 tokens with a block-diagonal boolean mask 490 / 690 ms (it computes
and masks all T x T scores; SDPA's masked CPU path is slower still than
unmasked full attention, 135 / 64 ms). Where edge-infer's bf16 attention
runs (``native_ops``) every segment goes through it in one call.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from edge_infer.models.layers import native_ops


class Segments:
    """Contiguous segments (lengths in order, summing to T) whose tokens attend only among themselves."""

    def __init__(self, lengths: list[int]) -> None:
        self.total = sum(lengths)
        self.offsets = [0]  # segment boundaries, empty segments left out
        for length in lengths:
            if length:
                self.offsets.append(self.offsets[-1] + length)
        starts, offset = [], 0
        for length in lengths:
            starts.append(offset)
            offset += length
        by_length: dict[int, list[int]] = {}
        for start, length in zip(starts, lengths):
            if length:
                by_length.setdefault(length, []).append(start)
        # Per length: a slice (the segments are adjacent) or a gather index [n * length].
        self.groups: list[tuple[int, int, slice | torch.Tensor]] = []
        for length, group in by_length.items():
            n = len(group)
            if group == list(range(group[0], group[0] + n * length, length)):
                self.groups.append((n, length, slice(group[0], group[0] + n * length)))
            else:
                index = (torch.tensor(group)[:, None] + torch.arange(length)).reshape(-1)
                self.groups.append((n, length, index))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v ``[T, heads, head_dim]`` -> ``[T, heads, head_dim]``, scaled by head_dim ** -0.5."""
        if native_ops.attention_runs(q):
            return native_ops.segment_attention(q, k, v, self.offsets, self.offsets, False, q.shape[-1] ** -0.5)
        if len(self.groups) == 1 and self.groups[0][0] * self.groups[0][1] == q.shape[0]:
            n, length, _ = self.groups[0]
            return _batched(q, k, v, n, length)
        out = torch.empty_like(q)
        for n, length, where in self.groups:
            if isinstance(where, slice):
                out[where] = _batched(q[where], k[where], v[where], n, length)
            else:
                out.index_copy_(0, where, _batched(q[where], k[where], v[where], n, length))
        return out


def _batched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int, length: int) -> torch.Tensor:
    """``n`` segments of ``length`` tokens, adjacent in q/k/v ``[n * length, heads, d]``."""
    heads, d = q.shape[1], q.shape[2]
    q, k, v = (t.reshape(n, length, heads, d).transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(n * length, heads, d)
