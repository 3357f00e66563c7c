"""Engine settings shared by the commands that load a text model (serve, generate, chat, plan)."""
from __future__ import annotations

import argparse
from typing import Any

from edge_infer.config import (
    ENCODER_QUANTIZATION_CHOICES, KV_CACHE_DTYPES, PRIORITIES, QUANT_METHODS, QUANTIZATION_CHOICES, QuantConfig,
)


def add_engine_args(parser: argparse.ArgumentParser, model_optional: bool = True,
                    default_model: str = "the embedded demo model, which can see pictures") -> None:
    parser.add_argument(
        "model", nargs="?" if model_optional else None, default=None,
        help=f"Hugging Face checkpoint directory (default: {default_model})",
    )
    g = parser.add_argument_group("engine")
    g.add_argument("--dtype", default="auto", help="auto (what is fast for the chosen kernel on this CPU: edge-infer doctor), bfloat16 or float32")
    g.add_argument("--max-model-len", type=int, default=None, help="context length (prompt + output) per sequence")
    g.add_argument("--max-num-seqs", type=int, default=None, help="sequences decoded together")
    g.add_argument("--max-num-batched-tokens", type=int, default=None, help="tokens per step (prefill chunk size)")
    g.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="exact KV cache budget in bytes")
    g.add_argument("--quantization", default=None, choices=QUANTIZATION_CHOICES,
                   help="quantized weights: cpu_int4 (4-bit, bf16 activations, PyTorch's kernel), cpu_w4a16 (the same "
                        "on edge-infer's kernels: faster), cpu_w4a8 (4-bit, int8 activations: fastest) or cpu_w8a8 "
                        "(8-bit, int8 activations: near-lossless); edge-infer's kernels run on AVX2, AVX-VNNI, AVX-512 "
                        "and ARM dotprod and are built on first use; auto: chosen by --priority among what this CPU "
                        "runs (edge-infer plan shows the choice and why)")
    g.add_argument("--priority", default=None, choices=PRIORITIES,
                   help="what --quantization auto optimizes (implied when only --priority is given): speed (default), "
                        "fidelity or memory")
    g.add_argument("--group-size", type=int, default=None, help="quantization group size (32, 64, 128 or 256)")
    g.add_argument("--asym", action="store_true", help="4-bit weights with zero points (asymmetric)")
    g.add_argument("--quantize-head", action="store_true", help="quantize the output head too")
    g.add_argument("--packed-head", action="store_true",
                   help="tied models: keep a second, packed copy of the output head (faster decode, vocab x hidden more bytes)")
    g.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                   help="auto: the compute dtype; int8: int8 codes with a scale per token and head, nearly twice the "
                        "tokens in the same memory (decode then runs without the fused W4A8 layer)")
    g.add_argument("--no-prefix-cache", action="store_true",
                   help="do not keep and share the KV blocks of common prompt prefixes (on by default: a request "
                        "resending a conversation or a system prompt computes only its new tokens)")
    g.add_argument("--num-threads", type=int, default=None, help="compute threads (default: the CPUs this process may use)")
    g.add_argument("--encoder-threads", type=int, default=None,
                   help="threads of the image and audio encoders of a multimodal model (default: --num-threads)")
    g.add_argument("--encoder-quantization", default="auto", choices=ENCODER_QUANTIZATION_CHOICES,
                   help="weights of the image and audio encoders of a multimodal model: none (dense, in --dtype), "
                        "same (the decoder's --quantization) or a method as for --quantization; refused where this "
                        "CPU cannot run it. auto (default): none, or same where dense bf16 towers would be "
                        "emulated (no native bf16) beside an int8-activation decoder")
    g.add_argument("--weight-backend", default="auto", choices=["auto", "onednn", "dense", "w16"], help=argparse.SUPPRESS)
    g.add_argument("--worker", default="process", choices=["process", "thread"], help=argparse.SUPPRESS)
    _add_media_limit_args(parser)


def _add_media_limit_args(parser: argparse.ArgumentParser) -> None:
    """One flag per media limit (media/limits.py names them in its refusals); unset ones keep the plan's default."""
    from dataclasses import fields

    from edge_infer.media.limits import LIMITS, MIN_IMAGE_PIXELS_LIMIT, MediaLimits

    g = parser.add_argument_group(
        "media limits per request (multimodal models; the plan sizes the encoders for them; by default the "
        "checkpoint's, lowered where a request at every limit would not fit --max-model-len)")
    defaults = MediaLimits()
    how = {"max_image_pixels": ", decoded (a larger picture is refused; a larger JPEG is decoded at a reduced scale)",
           "max_image_tokens": ": a larger picture is scaled down to it (a very thin one may take more)"}
    for f in fields(MediaLimits):
        default = {"max_image_pixels": f"the checkpoint's max_pixels, at least {MIN_IMAGE_PIXELS_LIMIT:,}",
                   "max_image_tokens": "the checkpoint's max_pixels in tokens"}.get(
            f.name, f"{getattr(defaults, f.name):g}")
        g.add_argument(LIMITS[f.name].flag, dest=f.name, type=float if f.type == "float" else int, default=None,
                       metavar="N", help=f"{LIMITS[f.name].unit}{how.get(f.name, '')} (default {default})")


def media_limit_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """The media limits given on the command line, or None (the plan's defaults)."""
    from edge_infer.media.limits import LIMITS

    given = {name: getattr(args, name) for name in LIMITS if getattr(args, name, None) is not None}
    return given or None


def engine_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for plan_text_session / LLM from parsed flags."""
    quant: Any = args.quantization
    if quant in QUANT_METHODS and (args.group_size or args.asym or args.quantize_head):
        quant = QuantConfig.named(quant, group_size=args.group_size or 128, symmetric=not args.asym,
                                  quantize_head=args.quantize_head)
    return dict(
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        quantization=quant,
        priority=args.priority,
        num_threads=args.num_threads,
        encoder_threads=args.encoder_threads,
        encoder_quantization=args.encoder_quantization,
        weight_backend=args.weight_backend,
        packed_head=args.packed_head,
        prefix_caching=not args.no_prefix_cache,
        kv_cache_dtype=args.kv_cache_dtype,
        **({"media_limits": limits} if (limits := media_limit_settings(args)) else {}),
    )
