"""One decoder for Llama, Qwen2, Qwen3 and Mistral checkpoints.

The families differ only in flags of ``ModelConfig``: q/k/v bias (Qwen2),
per-head q/k RMSNorm (Qwen3), an explicit ``head_dim``, Llama-3 RoPE scaling,
a sliding window (Mistral). q/k/v and gate/up are fused into one linear each,
so a layer runs four matrix products.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from edge_infer.models.layers.attention import AttentionMetadata, paged_attention, write_kv
from edge_infer.models.layers.native_ops import rms_norm, swiglu
from edge_infer.models.config import ModelConfig
from edge_infer.models.layers.linear import DenseKernel, Linear
from edge_infer.models.layers.rope import RotaryTable, apply_rotary
from edge_infer.models.weights import WeightSpec, weight_specs

if TYPE_CHECKING:
    from edge_infer.models.layers.kv_cache import KVCache



class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.qkv = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.gate_up = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.input_norm: torch.Tensor | None = None
        self.post_attention_norm: torch.Tensor | None = None
        self.q_norm: torch.Tensor | None = None
        self.k_norm: torch.Tensor | None = None
        self.scale = cfg.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        cfg = self.cfg
        n = x.shape[0]
        heads, kv_heads, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h = rms_norm(x, self.input_norm, cfg.rms_norm_eps)
        qkv = self.qkv(h)
        # q and k are adjacent in the fused output: rotate them together.
        qk = qkv[:, : cfg.q_size + cfg.kv_size].view(n, heads + kv_heads, d)
        v = qkv[:, cfg.q_size + cfg.kv_size :].view(n, kv_heads, d)
        if cfg.qk_norm:  # one norm over all q and k heads, each head with its own weight row
            weight = torch.cat((self.q_norm.expand(heads, d), self.k_norm.expand(kv_heads, d)))
            qk = rms_norm(qk, weight, cfg.rms_norm_eps)
        qk = apply_rotary(qk, cos, sin)
        q, k = qk[:, :heads], qk[:, heads:]
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        attn = paged_attention(q, k_cache, v_cache, meta, self.scale)
        x = x + self.o_proj(attn)
        h = rms_norm(x, self.post_attention_norm, cfg.rms_norm_eps)
        return x + self.down(swiglu(self.gate_up(h)))


class DecoderLM(nn.Module):
    """Embedding, decoder layers, final norm and output head.

    Built without tensors; ``models.loader`` installs weights from
    ``weight_specs()``. ``forward`` returns fp32 logits only for the rows the
    sampler needs (``logits_rows``), never for every prompt token.
    """

    def __init__(self, cfg: ModelConfig, max_positions: int):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.embed: torch.Tensor | None = None
        self.final_norm: torch.Tensor | None = None
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = RotaryTable(cfg.head_dim, cfg.rope_theta, max_positions, cfg.rope_scaling, cfg.mrope_section)
        # Decode steps in fused layer calls: whoever installs the weight kernels may set ``fused_factory``
        # (quant.fused_decode.build), asked at the first decode whether it can fuse this model; None keeps
        # the PyTorch layers. ``fused_decode`` False measures the PyTorch path anyway.
        self.fused_factory: Callable[["DecoderLM"], Any] | None = None
        self.fused_decode: bool | None = None
        self._fused = None

    @property
    def dtype(self) -> torch.dtype:
        return self.final_norm.dtype

    def weight_specs(self) -> list[WeightSpec]:
        return weight_specs(self.cfg)

    def resolve(self, target: str) -> tuple[object, str]:
        """The object owning ``target`` and the attribute name to set on it."""
        obj: object = self
        parts = target.split(".")
        for part in parts[:-1]:
            obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
        return obj, parts[-1]

    def tie_head(self) -> None:
        """One copy for the embedding table and the output head.

        Either the head reads the embedding table, or (a quantized tied head,
        ``embed`` left unset by the loader) the lookup reads rows from the head.
        """
        if self.embed is not None:
            self.lm_head.kernel = DenseKernel(self.embed)

    def linears(self) -> list[tuple[str, Linear]]:
        return [(name, m) for name, m in self.named_modules() if isinstance(m, Linear)]

    def kernels_by_kind(self) -> dict[str, str]:
        """The kernel each kind of linear runs on (names as hardware.kernels lists them, ISA variant in brackets)."""
        decoder = sorted({lin.kernel.label for name, lin in self.linears() if name.startswith("layers.") and lin.kernel is not None})
        return {
            "decoder linears": "+".join(decoder),
            "output head": self.lm_head.kernel.label if self.lm_head.kernel is not None else "unloaded",
            "embedding lookup": "table" if self.embed is not None else self.lm_head.kernel.label,
        }

    def resident_bytes(self) -> int:
        """Bytes of every weight as held in memory, shared storage counted once."""
        total = 0 if self.embed is None else self.embed.numel() * self.embed.element_size()
        for layer in self.layers:
            total += sum(lin.resident_bytes for lin in (layer.qkv, layer.o_proj, layer.gate_up, layer.down))
            for t in (layer.input_norm, layer.post_attention_norm, layer.q_norm, layer.k_norm):
                if t is not None:
                    total += t.numel() * t.element_size()
        total += self.final_norm.numel() * self.final_norm.element_size()
        if not self._head_reads_table():  # the head has storage of its own
            total += self.lm_head.resident_bytes
        return total

    def _head_reads_table(self) -> bool:
        kernel = self.lm_head.kernel
        return isinstance(kernel, DenseKernel) and kernel.weight is self.embed

    def decode_read_bytes(self) -> int:
        """Weight bytes one decode step reads: all that is resident, except that
        an embedding table the head does not share gives the step one row."""
        total = self.resident_bytes()
        if self.embed is not None and not self._head_reads_table():
            rows, width = self.embed.shape
            total -= (rows - 1) * width * self.embed.element_size()
        return total

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.embed is None:  # tied head held only in its quantized (or 16-bit packed) form
            return self.lm_head.kernel.rows(input_ids)
        return F.embedding(input_ids, self.embed).to(self.dtype)  # a 16-bit table for fp32 activations: widened here

    def run_layers(self, x: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_cache: "KVCache") -> torch.Tensor:
        """Run the decoder layers over input embeddings ``[T, hidden]`` at ``positions`` (``[T]``, or ``[3, T]`` for
        M-RoPE); returns hidden states."""
        cos, sin = self.rope.lookup(positions, x.dtype)
        if self.fused_decode is None:
            self._fused = self.fused_factory(self) if self.fused_factory is not None else None
            self.fused_decode = self._fused is not None
        if self.fused_decode and self._fused.accepts(x, meta):
            return self._fused(x, cos, sin, meta, kv_cache)
        for n, layer in enumerate(self.layers):
            x = layer(x, cos, sin, meta, kv_cache.k[n], kv_cache.v[n])
        return x

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: "KVCache",
        logits_rows: torch.Tensor,
    ) -> torch.Tensor:
        hidden = self.run_layers(self.embed_tokens(input_ids), positions, meta, kv_cache)
        return self.logits(hidden, logits_rows)

    def logits(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """fp32 next-token logits ``[len(rows), vocab]`` from rows of the decoder's output ``hidden``."""
        if rows.numel() == 0:  # only mid-prompt chunks this step: nothing to sample
            return torch.empty(0, self.cfg.vocab_size)
        x = rms_norm(hidden.index_select(0, rows), self.final_norm, self.cfg.rms_norm_eps)
        return self.lm_head(x).float()
