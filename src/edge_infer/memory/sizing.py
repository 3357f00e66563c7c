"""Bytes of a text session's items, from the config and checkpoint headers alone (torch-free).

Weights as they will be resident (per kernel), one step's activations
(shape-derived tensors times a factor measured per kernel), RoPE tables, the
load transient, and the measured per-process overheads in overhead.json
(scripts/measure_overhead.py). ``memory.plan`` puts them together.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from edge_infer.config import DTYPES, QuantConfig
from edge_infer.errors import InvalidRequestError
from edge_infer.hardware.cpu import CpuCapabilities, detect
from edge_infer.hardware.kernels import auto_dtype
from edge_infer.models.config import ModelConfig
from edge_infer.models.encoder_weights import is_tower_spec
from edge_infer.models.weights import weight_specs

MiB = 1 << 20
# Bytes copied per step while loading (models.loader.BLOCK_BYTES).
LOAD_BLOCK_BYTES = 16 * MiB
CHECKPOINT_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


@lru_cache(maxsize=1)
def runtime_overhead() -> dict[str, Any]:
    """Per-process baselines measured once on this machine class (scripts/measure_overhead.py)."""
    return json.loads((Path(__file__).with_name("overhead.json")).read_text())


def request_bodies_bytes(in_flight: int) -> int:
    """What a server process holds for ``in_flight`` bytes of request bodies (raw and parsed), measured."""
    return int(runtime_overhead()["server_bytes_per_body_byte"] * in_flight)


def resolve_dtype(requested: str | None, notes: list[str], quantization: str | None = None,
                  cpu: CpuCapabilities | None = None) -> str:
    """The engine dtype; ``auto`` picks what is fast for the kernel ``quantization`` runs on, on ``cpu``."""
    if requested in (None, "auto"):
        dtype, why = auto_dtype(cpu or detect(), quantization)
        notes.append(f"dtype auto -> {dtype}: {why}")
        return dtype
    aliases = {"bf16": "bfloat16", "fp32": "float32", "float": "float32"}
    dtype = aliases.get(requested, requested)
    if dtype not in DTYPES:
        raise InvalidRequestError(f"dtype {requested!r} is not supported; use one of auto, {', '.join(DTYPES)}")
    return dtype


def weight_bytes(cfg: ModelConfig, dtype_bytes: int, quant: QuantConfig | None, widened: bool = False) -> tuple[int, int]:
    """(resident weight bytes, largest linear repacked from its row-major form while loading) of the text decoder
    (a thinker's towers are items of their own: memory/media_plan.py); ``widened``: a 16-bit checkpoint on the
    W16A32 kernel (packed a block of rows at a time: no linear is held whole)."""
    total = 0
    largest_linear = 0
    for spec in weight_specs(cfg):
        if is_tower_spec(spec):
            continue
        plain = spec.numel * dtype_bytes
        if widened:
            from edge_infer.quant.sizes import widened_spec_nbytes

            total += widened_spec_nbytes(spec, dtype_bytes, cfg.tie_word_embeddings)
            continue
        if quant is None:
            total += plain
            largest_linear = max(largest_linear, plain if spec.is_linear else 0)
            continue
        from edge_infer.quant.sizes import is_quantized, spec_nbytes

        total += spec_nbytes(spec, quant, dtype_bytes, cfg.tie_word_embeddings)
        if spec.is_linear and not is_quantized(spec, quant, cfg.tie_word_embeddings):
            largest_linear = max(largest_linear, plain)  # e.g. an unquantized output head
    return total, largest_linear


def activation_tensor_bytes(cfg: ModelConfig, dtype_bytes: int) -> int:
    """Bytes per token of the tensors a step keeps alive at once, by shape alone.

    The residual stream and its normed copy, q/k/v and their rotated copies,
    the attention output, gate/up, the activated product and the down
    projection. Kernels add scratch on top (oneDNN accumulates in fp32,
    RMSNorm works in fp32, the allocator rounds up): the measured factor
    ``activation_per_token_factor`` in overhead.json scales this to what a
    step really takes.
    """
    h, i = cfg.hidden_size, cfg.intermediate_size
    return dtype_bytes * (4 * h + 3 * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size + 4 * i)


def activation_calibration(quantization: str | None) -> tuple[float, int, float]:
    """(per-token factor, fixed bytes, bytes per attention-mask element) measured for the linears'
    kernel: dense/oneDNN, or the quantized kernels' (measured with cpu_int4: the int8 kernels allocate the
    same tensors, plus int8 copies of their inputs that are smaller than those)."""
    calib = runtime_overhead()
    prefix = "cpu_int4_" if quantization else ""
    return (calib[prefix + "activation_per_token_factor"], int(calib[prefix + "activation_fixed_bytes"]),
            calib["activation_mask_bytes_per_element"])


def activation_bytes(
    cfg: ModelConfig, dtype_bytes: int, tokens: int, max_num_seqs: int, max_model_len: int,
    quantization: str | None = None,
) -> int:
    """Transient bytes of one step of ``tokens`` tokens, calibrated by measurement.

    Per token: the shape-derived tensors times the measured kernel factor.
    Attention: the fused kernel works in blocks; what scales is the mask of
    one chunk against the context (booleans, which attention turns into a
    float bias: the measured bytes per element). Logits: fp32 rows for every sequence that
    samples, plus the sampler's working copies of one row. Fixed: the
    measured allocator and thread scratch of a step.
    """
    factor, fixed, mask_element = activation_calibration(quantization)
    per_token = int(factor * activation_tensor_bytes(cfg, dtype_bytes))
    chunk = min(tokens, max_model_len)
    mask = int(mask_element * chunk * max_model_len * (cfg.num_attention_heads // cfg.num_key_value_heads))
    logits = 4 * cfg.vocab_size * (max_num_seqs + 4)
    return per_token * tokens + mask + logits + fixed


def load_transient_bytes(cfg: ModelConfig, quant: QuantConfig | None, widened: bool, largest_linear: int,
                         src_bytes: int, dtype_bytes: int) -> int:
    """The loader's peak beyond the weights: one block being converted plus the largest linear held twice while
    it is repacked; quantized and 16-bit linears are packed a block of rows at a time instead."""
    transient = min(LOAD_BLOCK_BYTES, largest_linear * src_bytes // dtype_bytes) + largest_linear
    if quant is not None:
        from edge_infer.quant.sizes import repack_transient_bytes

        transient = max(transient, repack_transient_bytes(weight_specs(cfg), quant, cfg.tie_word_embeddings, src_bytes))
    if widened:
        from edge_infer.quant.sizes import widened_transient_bytes

        transient = max(transient, widened_transient_bytes(weight_specs(cfg)))
    return transient
