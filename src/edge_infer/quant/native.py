"""edge-infer's own int8-activation kernels (``csrc/``): the ISA variant this CPU runs, and the library.

The variant is chosen from the CPU capability model (``hardware.kernels``,
masks included) among those the built library holds, and passed to every
call, so ``EDGE_INFER_CPU_FEATURES=avx2`` on an AVX-512 machine runs the
AVX2 code. The library is built on first use (``native_build``). Anything
missing is refused by name: there is no silent fall back to another kernel.
"""
from __future__ import annotations

import functools

import torch

from edge_infer.errors import KernelUnavailableError
from edge_infer.hardware.cpu import detect
from edge_infer.hardware.kernels import KERNELS
from edge_infer.quant import native_build


def missing_requirement(kernel: str = "cpu-w4a8") -> str | None:
    """Why ``kernel`` (cpu-w4a8, cpu-w8a8 or cpu-w4a16) cannot run here, or None when it can."""
    reason = KERNELS[kernel].missing(detect())
    if reason is not None:
        return f"{reason}; use cpu_int4"
    return native_build.missing_toolchain()


def require(kernel: str) -> str:
    """Build (once) and load the library; the variant ``kernel`` runs on here. Refuses by name."""
    reason = missing_requirement(kernel)
    if reason is not None:
        raise KernelUnavailableError(f"{kernel}: {reason}")
    variant = KERNELS[kernel].variant(detect(), built_variants())
    if variant is None:
        raise KernelUnavailableError(f"{kernel}: the built kernel library ({', '.join(built_variants())}) holds no "
                                     f"variant this CPU runs; use cpu_int4")
    return variant.name


def vector_variant() -> str | None:
    """The variant for the library's other vector loops (Code2Wav's SnakeBeta) on this CPU, or None where the
    int8 kernels cannot run (their callers then keep their PyTorch operators: same results, slower)."""
    try:
        return require("cpu-w4a8")
    except KernelUnavailableError:
        return None


@functools.lru_cache(maxsize=1)
def built_variants() -> tuple[str, ...]:
    """The ISA variants in the library, loading it (and building it first if needed)."""
    library = native_build.library_path()
    if not library.exists():
        native_build.build(library)
    torch.ops.load_library(str(library))
    return tuple(torch.ops.edge_infer.isa_variants())


@functools.lru_cache(maxsize=1)
def bf16_attention_available() -> bool:
    """True when edge-infer's bf16 attention runs here: the CPU (masks included) has what it needs and the
    library, loaded (built first if needed), holds it."""
    from edge_infer.hardware.kernels import BF16_ATTENTION

    if BF16_ATTENTION.missing(detect()) is not None or native_build.missing_toolchain() is not None:
        return False
    built_variants()  # loads the library
    return bool(torch.ops.edge_infer.segment_attention_built())


def bf16_attention_preferred() -> bool:
    """True when bf16 attention should take edge-infer's kernel: it runs here and the capability model prefers
    it (not on a CPU with AMX-BF16: ``hardware.kernels.bf16_attention_route``)."""
    from edge_infer.hardware.kernels import bf16_attention_route

    return bf16_attention_available() and bf16_attention_route(detect())[0]


def enable_native_ops(dtype: torch.dtype) -> None:
    """Before a model of ``dtype`` runs: its bf16 attention and SwiGLU on edge-infer's kernels
    (models/layers/native_ops.py) in this process, where they run here (attention where preferred). Never turns
    them off: they take only bf16 rows, so another model's fp32 leaves them as they were."""
    from edge_infer.models.layers import native_ops

    if dtype == torch.bfloat16:
        native_ops.enable(bf16_attention_preferred(), vector_variant())


def cache_large_blocks(min_bytes: int, budget: int) -> bool:
    """PyTorch's CPU tensors of ``min_bytes`` or more, for the rest of this process, from blocks kept by size
    for reuse (csrc/block_cache.cpp: cached bytes beyond the live bytes' high-water mark at most ``budget``)
    until ``release_cached_blocks``. False, changing nothing, where the library can be neither loaded nor
    built: each large block is then mapped on its own."""
    if native_build.missing_toolchain() is not None:
        return False
    built_variants()  # loads the library
    return bool(torch.ops.edge_infer.cache_large_blocks(min_bytes, budget))


def release_cached_blocks() -> int:
    """Unmap every block the cache holds free; the bytes given back (0 without a cache)."""
    return int(torch.ops.edge_infer.release_cached_blocks())
