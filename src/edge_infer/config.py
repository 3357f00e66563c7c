"""The resolved settings an engine core is built from.

Users give partial settings; ``edge_infer.memory.plan`` resolves every
default (dtype, context length, KV budget) and admits or refuses them. An
``EngineConfig`` therefore always describes something that fits.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from edge_infer.errors import InvalidRequestError

DTYPES = ("bfloat16", "float32")
# What --quantization takes: 4-bit weights through PyTorch's tinygemm (W4A16), 4-bit weights times the activations
# as they are on edge-infer's own kernels (W4A16), or 4- or 8-bit weights times int8 activations on them (W4A8, W8A8).
QUANT_METHODS = ("cpu_int4", "cpu_w4a16", "cpu_w4a8", "cpu_w8a8")
# The kernel each method runs its weights on (QuantConfig.kernel): PyTorch's tinygemm, edge-infer's 64-row tiles
# times the activations as they are, or the same tiles times int8 activations (quant/int8_kernels.py).
METHOD_KERNELS = {"cpu_int4": "tinygemm", "cpu_w4a16": "w4a16", "cpu_w4a8": "int8", "cpu_w8a8": "int8"}
KERNEL_METHODS = {"tinygemm": "cpu_int4", "w4a16": "cpu_w4a16", "int8": "cpu_w4a8"}  # 4-bit weights' method per kernel
# "auto": chosen by priority among what this CPU runs (memory/weight_path.py).
QUANTIZATION_CHOICES = (*QUANT_METHODS, "auto", "none")
PRIORITIES = ("speed", "fidelity", "memory")
# What --encoder-quantization takes for a thinker's media towers: none (dense, in the engine's dtype), the
# decoder's weight path (same), one by name, or auto (hardware.kernels.auto_encoder_quantization: none, or where
# dense towers would run emulated bf16 the decoder's int8 kernel, cpu_w4a8 beside cpu_int4 or cpu_w4a16).
ENCODER_QUANTIZATION_CHOICES = ("none", "same", *QUANT_METHODS, "auto")
# auto: the compute dtype; int8: codes with an fp32 scale per token and head (models/layers/kv_cache.py).
KV_CACHE_DTYPES = ("auto", "int8")


@dataclass(frozen=True)
class QuantConfig:
    """Quantized weight settings (``quantization="cpu_int4"``, ``"cpu_w4a16"``, ``"cpu_w4a8"`` or ``"cpu_w8a8"``)."""

    # The weight format: 4 bits (cpu_int4 checkpoints) or 8 bits (cpu_int8, symmetric, int8 activations only).
    bits: int = 4
    group_size: int = 128
    symmetric: bool = True
    quantize_head: bool = False
    # A kernel choice, not a weight format (one of METHOD_KERNELS' values): the same 4-bit codes load on any.
    kernel: str = "tinygemm"

    def __post_init__(self) -> None:
        if self.kernel not in KERNEL_METHODS:
            raise InvalidRequestError(f"kernel {self.kernel!r} is not one of the quantized weights' kernels; "
                                      f"choose a --quantization method ({', '.join(METHOD_KERNELS)})")

    @classmethod
    def named(cls, name: str, **settings: Any) -> "QuantConfig":
        """The settings a --quantization name (one of QUANT_METHODS) stands for."""
        assert name in QUANT_METHODS, name
        return cls(bits=8 if name == "cpu_w8a8" else 4, kernel=METHOD_KERNELS[name], **settings)

    @property
    def int8_activations(self) -> bool:
        """Whether the activations are quantized to int8 for the products (cpu_w4a8, cpu_w8a8)."""
        return self.kernel == "int8"

    @property
    def tiles(self) -> bool:
        """Whether the weights are held in edge-infer's 64-row tiles (bf16 scales) rather than tinygemm's layout."""
        return self.kernel != "tinygemm"

    @property
    def method(self) -> str:
        """The weight format, as a quantized checkpoint's config.json names it."""
        return "cpu_int8" if self.bits == 8 else "cpu_int4"

    @property
    def name(self) -> str:
        """The --quantization name these settings run as."""
        if self.bits == 8:
            return "cpu_w8a8"
        return KERNEL_METHODS[self.kernel]


def encoder_quant_config(choice: str | None, decoder: QuantConfig | None) -> QuantConfig | None:
    """The towers' settings for ``--encoder-quantization choice``: ``same`` takes the decoder's (its head option
    aside), a method name that method at the decoder's group size (128 without one)."""
    if choice in (None, "none"):
        return None
    if choice == "same":
        return None if decoder is None else replace(decoder, quantize_head=False)
    if choice not in QUANT_METHODS:
        raise InvalidRequestError(f"encoder_quantization {choice!r} is not supported; use one of "
                                  f"{', '.join(ENCODER_QUANTIZATION_CHOICES)}")
    return QuantConfig.named(choice, group_size=decoder.group_size if decoder is not None else 128)


@dataclass(frozen=True)
class EngineConfig:
    model: str
    dtype: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_memory_bytes: int
    block_size: int = 16
    quant: QuantConfig | None = None
    weight_backend: str = "auto"  # auto | onednn | dense | w16 (16-bit weights widened in the kernel: quant/widened.py)
    num_threads: int | None = None
    seed: int = 0
    eos_token_ids: tuple[int, ...] = ()
    # A tied model's output head read from a second, oneDNN-packed copy of the embedding table:
    # faster decode (the head is read whole every token) for vocab x hidden more bytes.
    packed_head: bool = False
    # Full KV blocks kept and shared between requests with the same prefix (engine/block_allocator.py).
    prefix_caching: bool = False
    kv_cache_dtype: str = "auto"  # auto: the compute dtype; int8: codes + an fp32 scale per token and head
    # Threads the media encoders run on (a multimodal thinker); None: num_threads.
    encoder_threads: int | None = None
    # The towers' weight path (ENCODER_QUANTIZATION_CHOICES); encoder_quant() resolves it.
    encoder_quantization: str = "none"
    # A thinker's worker: freed tensor blocks kept for reuse up to this many bytes beyond the live high-water
    # mark (the plan's "block cache" item; quant/native.cache_large_blocks). 0: none kept.
    block_cache_bytes: int = 0
    # A thinker's media towers loaded with its decoder. False: the decoder alone, every media item must come with
    # its embeddings (an encoder stage computes them: runtime/encoder_executor.py).
    load_encoders: bool = True

    def encoder_quant(self) -> QuantConfig | None:
        """The towers' quantized weight settings, or None for dense weights in ``dtype``."""
        return encoder_quant_config(self.encoder_quantization, self.quant)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
