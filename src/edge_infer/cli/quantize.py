"""``edge-infer quantize SRC DST``: write a cpu_int4 (4-bit) or cpu_int8 (8-bit) checkpoint that loads directly."""
from __future__ import annotations

import argparse
import sys

from edge_infer.quant.sizes import ROW_GROUP, TENSOR_GROUP

SIMULATED_GROUPS = {"row": ROW_GROUP, "tensor": TENSOR_GROUP}


def _group_size(text: str) -> int:
    if text in SIMULATED_GROUPS:
        return SIMULATED_GROUPS[text]
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"group size must be an integer, 'row' or 'tensor', not {text!r}") from None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="bf16/fp32/fp16 Hugging Face checkpoint directory")
    parser.add_argument("dst", help="new directory for the quantized checkpoint (must not exist or be empty)")
    parser.add_argument("--bits", type=int, choices=(4, 8), default=4,
                        help="4 (cpu_int4: loads on cpu_int4, cpu_w4a16 or cpu_w4a8) or 8 (cpu_int8, symmetric: loads on "
                             "cpu_w8a8)")
    parser.add_argument("--group-size", type=_group_size, default=128, help="input columns per scale: 32, 64, 128 or 256 (default 128)")
    parser.add_argument("--asym", action="store_true", help="asymmetric: a zero point per group (default symmetric)")
    parser.add_argument("--quantize-head", action="store_true", help="quantize the output head too (a tied head is the embedding table)")
    parser.add_argument("--towers", action="store_true",
                        help="a thinker (Qwen2.5-Omni, Qwen2.5-VL): store its media towers' linears as codes too, in the "
                        "same format (they then run on the decoder's kernel: --encoder-quantization same); by default "
                        "they are copied as they are and quantized on load if asked")
    parser.add_argument(
        "--simulate", action="store_true",
        help="write dequantized float weights instead (any --group-size, 'row' for one group per row, "
        "'tensor' for one per matrix): "
        "a float checkpoint that behaves like that quantizer, for `edge-infer bench fidelity`",
    )
    parser.add_argument("--shard-bytes", type=int, default=2 << 30, help="split the output into shards of at most this size")


def run(args: argparse.Namespace) -> int:
    from edge_infer.config import QuantConfig
    from edge_infer.errors import EdgeInferError
    from edge_infer.quant.export import quantize_checkpoint

    names = {v: k for k, v in SIMULATED_GROUPS.items()}
    if args.group_size in names and not args.simulate:
        print(f"error: --group-size {names[args.group_size]} is only possible with --simulate "
              f"(the int4 kernel needs 32, 64, 128 or 256)", file=sys.stderr)
        return 2
    if args.bits == 8 and args.asym:
        print("error: 8-bit weights are symmetric; drop --asym", file=sys.stderr)
        return 2
    quant = QuantConfig(bits=args.bits, group_size=args.group_size, symmetric=not args.asym,
                        quantize_head=args.quantize_head, kernel="int8" if args.bits == 8 else "tinygemm")

    def progress(done: int, total: int) -> None:
        print(f"\r{done}/{total} tensors", end="\n" if done == total else "", file=sys.stderr, flush=True)

    try:
        result = quantize_checkpoint(
            args.src, args.dst, quant, simulate=args.simulate, shard_bytes=args.shard_bytes,
            progress=progress if sys.stderr.isatty() else None, towers=args.towers,
        )
    except EdgeInferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    group = names.get(args.group_size, f"g{args.group_size}")
    kind = "simulated (dequantized float)" if args.simulate else quant.method
    head = (" +head" if args.quantize_head else "") + (" +towers" if args.towers else "")
    print(
        f"wrote {kind} {group} {'asym' if args.asym else 'sym'}{head} checkpoint to {result.out_dir}: "
        f"{result.quantized_tensors} tensors quantized, {result.copied_tensors} copied, "
        f"{result.source_bytes / 2**20:,.1f} MiB -> {result.written_bytes / 2**20:,.1f} MiB"
    )
    return 0
