"""`edge-infer bench kernels`: every weight kernel this CPU runs, per activation dtype, at one and many tokens.

The facts behind ``hardware.kernels`` (which dtype ``auto`` picks for which
kernel, which paths are slow where) come from this table. Each case is a
linear of the Qwen2.5-0.5B MLP (``--rows`` x ``--cols``, default gate/up
9728 x 896) through the engine's own ``WeightKernel`` classes, for ``--m``
rows of activations (1 = a decode step, 64 = a prefill chunk). Cases are
interleaved and rotated over ``--passes`` (benchmarks/README.md, the grid); each pass times
repeated calls for at least ``--min-time`` seconds and keeps the median call.
Run it once per ISA level (``EDGE_INFER_CPU_FEATURES`` and PyTorch's
``ATEN_CPU_CAPABILITY`` are in the provenance).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edge_infer.bench.harness.arm_output import emit, stamp
from edge_infer.bench.harness.provenance import now_utc

if TYPE_CHECKING:
    import torch


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=9728, help="output features of the measured linear (default 9728)")
    parser.add_argument("--cols", type=int, default=896, help="input features (default 896)")
    parser.add_argument("--m", type=int, action="append", default=None, help="activation rows (repeatable; default 1 and 64)")
    parser.add_argument("--passes", type=int, default=3, help="rotated passes over all cases (default 3)")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of calls per case and pass (default 0.3)")
    parser.add_argument("--num-threads", type=int, default=None, help="compute threads (default: this process's CPUs)")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--kernel", action="append", default=None, metavar="NAME",
                        help="measure only this kernel, as the table names it (repeatable; e.g. dense, "
                             "cpu-w4a8[avx512-vnni]); default: every kernel this CPU runs")
    parser.add_argument("--out", type=Path, default=None, help="also write the result JSON here")


def _cases(rows: int, cols: int, group: int, ms: list[int]) -> list[tuple[str, str, Callable[[], Any]]]:
    """(kernel, dtype, builder) for every kernel and activation dtype this CPU can run; edge-infer's tile
    kernels once per ISA variant this CPU runs (e.g. avx2 beside avx512-vnni), named ``kernel[variant]``."""
    import torch

    from edge_infer.hardware.cpu import detect
    from edge_infer.hardware.kernels import KERNELS
    from edge_infer.models.layers.linear import DenseKernel, OneDnnBf16Kernel, onednn_bf16_available
    from edge_infer.quant.kernel import Int4Kernel
    from edge_infer.quant.quantize import quantize_rows

    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0)) / cols**0.5
    quantized = {bits: quantize_rows(weight, group, True, bits) for bits in (4, 8)}

    def packed(kernel_class, dtype, bits=4, **kw):
        q = quantized[bits]

        def build():
            kernel = kernel_class(rows, cols, group, dtype, **kw)
            kernel.write_rows(0, q.codes, q.scales, q.zeros)
            return kernel
        return build

    cases = [("dense", "float32", lambda: DenseKernel(weight.clone())),
             ("dense", "bfloat16", lambda: DenseKernel(weight.to(torch.bfloat16)))]
    if onednn_bf16_available():
        cases.append(("onednn-bf16", "bfloat16", lambda: OneDnnBf16Kernel(weight.to(torch.bfloat16))))
    if onednn_int8_exact():
        cases.append((OneDnnInt8Reference.name, "float32", lambda: OneDnnInt8Reference(weight, max(ms))))
    cases += [("cpu-int4", "bfloat16", packed(Int4Kernel, torch.bfloat16)),
              ("cpu-int4", "float32", packed(Int4Kernel, torch.float32))]
    from edge_infer.quant.native import built_variants, missing_requirement

    if missing_requirement() is None:
        from edge_infer.quant.int8_kernels import W4A8Kernel, W4A16Kernel, W8A8Kernel

        from edge_infer.quant.widened import W16A32Kernel

        def widened(variant: str):
            def build():
                kernel = W16A32Kernel(rows, cols, torch.bfloat16, variant=variant)
                kernel.write_rows(0, weight.to(torch.bfloat16))
                return kernel
            return build

        cpu = detect()
        for variant in KERNELS["cpu-w4a8"].variants:
            if not (variant.arch == cpu.arch and cpu.has(*variant.needs) and variant.name in built_variants()):
                continue
            for kernel_class, bits in ((W4A8Kernel, 4), (W8A8Kernel, 8), (W4A16Kernel, 4)):
                cases += [(f"{kernel_class.name}[{variant.name}]", dtype,
                           packed(kernel_class, getattr(torch, dtype), bits, variant=variant.name))
                          for dtype in ("bfloat16", "float32")]
            cases.append((f"cpu-w16a32[{variant.name}]", "float32", widened(variant.name)))  # bf16 weights, fp32 math
    return cases


class OneDnnInt8Reference:
    """A library's int8 product to compare edge-infer's with: 8-bit weights with one scale per output row
    (no groups along the input, so the sums never leave the integer unit), activations quantized per row, on
    oneDNN's u8 x s8 matmul through PyTorch's x86 quantization op. Not an engine kernel: the bench's measure of
    what the tile unit or VNNI reach without per-group float steps. Offered only with VNNI or AMX-INT8: without
    them oneDNN sums pairs of products in saturating 16-bit lanes (10% off on an AVX2 Zen 3; exact with 7-bit
    weights, which shows the rest of this class is)."""

    name = "onednn-w8a8-row"

    def __init__(self, weight: torch.Tensor, m: int):
        import torch

        self.scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
        codes = torch.round(weight / self.scales[:, None]).to(torch.int8)
        self.packed = torch.ops.onednn.qlinear_prepack(codes, [m, weight.shape[1]])
        self.nbytes = codes.numel() + self.scales.numel() * 4
        self.ones = torch.ones(weight.shape[0])
        self.zeros = torch.zeros(weight.shape[0], dtype=torch.long)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        x = x.float()
        row_scales = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
        shifted = (torch.round(x / row_scales) + 128).to(torch.uint8)  # u8 with zero point 128: the codes - 128
        sums = torch.ops.onednn.qlinear_pointwise(shifted, 1.0, 128, self.packed, self.ones, self.zeros, None, 1.0,
                                                  0, torch.float32, "none", [], "")
        return sums * row_scales * self.scales


def onednn_int8_exact() -> bool:
    """True when oneDNN's u8 x s8 products run here and are exact: VNNI or AMX-INT8 (as hardware.cpu reports it),
    and a PyTorch built with oneDNN's quantized ops."""
    import torch

    from edge_infer.hardware.cpu import detect

    cpu = detect()
    if not any(cpu.has(feature) for feature in ("avx_vnni", "avx512_vnni", "amx_int8")):
        return False
    try:
        OneDnnInt8Reference(torch.ones(16, 16), 1)(torch.ones(1, 16))
        return True
    except (RuntimeError, NotImplementedError, AttributeError):  # a build without them
        return False


def _time_call(fn: Callable[[], Any], min_time: float) -> float:
    """Median seconds per call over at least ``min_time`` seconds (after one warm-up call)."""
    fn()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_time or len(times) < 3:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from edge_infer.engine.core import configure_threads

    threads = configure_threads(args.num_threads)
    ms = args.m or [1, 64]
    runnable = _cases(args.rows, args.cols, args.group_size, ms)
    unknown = set(args.kernel or ()) - {name for name, _, _ in runnable}
    if unknown:
        raise ValueError(f"--kernel {', '.join(sorted(unknown))}: this CPU runs "
                         f"{', '.join(sorted({name for name, _, _ in runnable}))}")
    built = [(name, dtype, builder()) for name, dtype, builder in runnable if not args.kernel or name in args.kernel]
    bytes_of = {(name, dtype): kernel.nbytes for name, dtype, kernel in built}  # resident weight bytes read per call
    inputs = {(dtype, m): torch.randn(m, args.cols).to(getattr(torch, dtype)) for _, dtype, _ in built for m in ms}
    cases = [(name, dtype, kernel, m) for name, dtype, kernel in built for m in ms]
    seconds: dict[tuple[str, str, int], list[float]] = {(n, d, m): [] for n, d, _, m in cases}
    for p in range(args.passes):
        for i in range(len(cases)):
            name, dtype, kernel, m = cases[(i + p) % len(cases)]  # pass p starts at case p (rotation)
            x = inputs[(dtype, m)]
            seconds[(name, dtype, m)].append(_time_call(lambda: kernel(x), args.min_time))
    results = []
    for (name, dtype, m), ts in seconds.items():
        med = statistics.median(ts)
        results.append({
            "kernel": name, "dtype": dtype, "m": m, "median_us": round(med * 1e6, 2),
            "spread": round((max(ts) - min(ts)) / med, 3), "passes_us": [round(t * 1e6, 2) for t in ts],
            "g_weight_mults_per_s": round(args.rows * args.cols * m / med / 1e9, 2),
            "weight_gb_per_s": round(bytes_of[(name, dtype)] / med / 1e9, 2),
        })
    # Top-level rates are what a grid arm reports (harness/arm_output.py): one per case.
    rates = {f"{_key(r['kernel'])}_{r['dtype']}_m{r['m']}_gmult_per_s": r["g_weight_mults_per_s"] for r in results}
    return {**rates, "benchmark": "kernels", "shape": [args.rows, args.cols], "group_size": args.group_size,
            "num_threads": threads, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cases": results, "ratios": _ratios(results)}


def _key(kernel: str) -> str:
    """``cpu-w4a8[avx2]`` -> ``cpu_w4a8_avx2``: a metric name."""
    return kernel.replace("[", "_").replace("]", "").replace("-", "_")


def _ratios(results: list[dict[str, Any]]) -> dict[str, float]:
    """The comparisons hardware.kernels relies on, as time ratios (> 1: the second is slower)."""
    t = {(r["kernel"], r["dtype"], r["m"]): r["median_us"] for r in results}
    out = {}
    for m in sorted({r["m"] for r in results}):
        pairs = {f"cpu-int4 fp32 / bf16 activations, m={m}": (("cpu-int4", "float32", m), ("cpu-int4", "bfloat16", m)),
                 f"dense bf16 / fp32, m={m}": (("dense", "bfloat16", m), ("dense", "float32", m))}
        for label, (slow, fast) in pairs.items():
            if slow in t and fast in t:
                out[label] = round(t[slow] / t[fast], 2)
    return out


def run(args: argparse.Namespace) -> int:
    started_at = now_utc()
    if args.passes < 1 or args.min_time <= 0:
        print("edge-infer bench kernels: error: --passes must be at least 1 and --min-time positive", file=sys.stderr)
        return 2
    try:
        result = measure(args)
    except ValueError as exc:
        print(f"edge-infer bench kernels: error: {exc}", file=sys.stderr)
        return 2
    result["provenance"] = stamp(started_at)
    emit(result, args.out)
    return 0
