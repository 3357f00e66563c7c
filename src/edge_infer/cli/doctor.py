"""``edge-infer doctor``: what this machine can run, which kernel each choice would use, and why."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from edge_infer.hardware.cpu import PROFILES, CpuCapabilities, detect, profile
from edge_infer.hardware.kernels import auto_dtype, bf16_attention_route, select_kernels

MiB = 1 << 20
# The choices a user makes, as (label, quantization, quantize_head); shown for a tied bf16 checkpoint (the common
# small one).
CHOICES = (("unquantized", None, False), ("cpu_int4", "cpu_int4", False), ("cpu_int4 --quantize-head", "cpu_int4", True),
           ("cpu_w4a16", "cpu_w4a16", False), ("cpu_w4a8", "cpu_w4a8", False), ("cpu_w4a8 --quantize-head", "cpu_w4a8", True), ("cpu_w8a8", "cpu_w8a8", False))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpu", default=None, metavar="PROFILE", help=f"describe another CPU: {', '.join(PROFILES)}")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def report(cpu: CpuCapabilities, runtime: bool) -> dict[str, Any]:
    """The CPU, memory and, per choice, the auto dtype, kernels and refusals; ``runtime`` adds PyTorch's view."""
    from edge_infer.hardware.memory import available_memory_bytes, meminfo, transparent_huge_pages

    from edge_infer.quant import native_build  # torch-free

    # Which variants the built library holds and whether it can be built: only this machine's own business.
    built = native_build.built_variants() if runtime else None
    toolchain = native_build.missing_toolchain() if runtime else None
    choices = {}
    for label, quant, head in CHOICES:
        dtype, why = auto_dtype(cpu, quant)
        sel = select_kernels(cpu, dtype, quant, quantize_head=head, tied=True, stored_16bit="bfloat16",
                             built_variants=built)
        if toolchain is not None and not sel.refusals and sel.choices[0].variant is not None:
            if quant is None:  # the 16-bit path is an optimisation: the plan falls back to float32 weights
                sel.notes.append(f"the 16-bit path cannot be built here ({toolchain}): float32 weights, twice the bytes")
            else:
                sel.refusals.append(f"--quantization {quant}: {toolchain}")
        choices[label] = {"runs": not sel.refusals, "dtype_auto": dtype, "dtype_why": why, **sel.to_dict()}
    out: dict[str, Any] = {"cpu": cpu.to_dict(), "choices": choices,
                           "bf16_attention": bf16_attention_route(cpu)[1]}
    if runtime:
        from edge_infer.models.weight_arena import huge_pages_available

        out["memory"] = {"total_bytes": meminfo().get("MemTotal"), "available_bytes": available_memory_bytes(),
                         "transparent_huge_pages": transparent_huge_pages(),
                         "packed_weights_on_huge_pages": huge_pages_available()}
        out["torch"] = _torch_view()
    return out


def _torch_view() -> dict[str, Any]:
    """What the installed PyTorch dispatches to here (imports torch: only the doctor does this)."""
    import torch

    from edge_infer.models.layers.linear import onednn_bf16_available
    from edge_infer.quant.kernel import tile_rows

    return {"version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "int4_tile_rows": tile_rows(), "onednn_bf16": onednn_bf16_available(), "threads": torch.get_num_threads()}


def render(rep: dict[str, Any]) -> str:
    cpu = rep["cpu"]
    lines = [f"cpu      {cpu['model']} ({cpu['source']})", f"isa      {cpu['arch']} {' '.join(cpu['features']) or '-'}"]
    if cpu["masked"]:
        lines.append(f"masked   {' '.join(cpu['masked'])}")
    if cpu["usable_cpus"] is not None:
        lines.append(f"cores    {cpu['usable_cpus']} usable of {cpu['logical_cpus']} logical, {cpu['physical_cores']} physical")
    if cpu["caches"]:
        caches = ", ".join(f"L{c['level']}{c['kind'][0].lower() if c['level'] == 1 else ''} {c['bytes'] // 1024} KiB"
                           for c in cpu["caches"])
        lines.append(f"caches   {caches} (per instance)")
    if "memory" in rep:
        mem = rep["memory"]
        lines.append(f"memory   {mem['available_bytes'] / MiB:,.0f} MiB available of {(mem['total_bytes'] or 0) / MiB:,.0f} MiB; "
                     f"packed weights on {'2 MiB' if mem['packed_weights_on_huge_pages'] else '4 KiB'} pages "
                     f"(transparent huge pages: {mem['transparent_huge_pages'] or 'none'})")
    if "torch" in rep:
        t = rep["torch"]
        lines.append(f"torch    {t['version']}: dispatches to {t['cpu_capability']}, int4 tiles of {t['int4_tile_rows']} rows, "
                     f"oneDNN bf16 {'yes' if t['onednn_bf16'] else 'no'}")
    lines.append(f"attention bf16 models: {rep['bf16_attention']}")
    lines.append("")
    for label, c in rep["choices"].items():
        lines.append(f"{label:<26} {'runs here' if c['runs'] else 'REFUSED'}  (dtype auto -> {c['dtype_auto']}: {c['dtype_why']})")
        for kind, k in c["kernels"].items():
            kernel = f"{k['kernel']} [{k['variant']}]" if k["variant"] else k["kernel"]
            lines.append(f"    {kind:<18} {kernel:<24} {k['why']}")
        lines += [f"    refused: {r}" for r in c["refusals"]]
        lines += [f"    note: {n}" for n in c["notes"]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        cpu = profile(args.cpu) if args.cpu else detect()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rep = report(cpu, runtime=args.cpu is None)
    print(json.dumps(rep, indent=2) if args.json else render(rep))
    return 0
