"""``--quantization auto --priority speed|fidelity|memory``: the weight path chosen among what this CPU runs.

Each priority lists the weight paths in the order the measurements rank them
(docs/quantization.md: the fidelity table on the trained demo model and the
decode rates of ``bench pp-tg``/``bench kernels``). The first path whose
kernel this CPU runs (and, for speed, runs on its fast path) and whose plan
fits the memory available is taken; the plan's first note names it, why,
and what was passed over. An explicit ``--quantization`` always wins.
A quantized checkpoint limits the choice to the kernels of its format.
Torch-free, like the planner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from edge_infer.config import PRIORITIES, QuantConfig
from edge_infer.hardware.cpu import CpuCapabilities
from edge_infer.hardware.kernels import KERNELS, QUANT_KERNELS

DEFAULT_PRIORITY = "speed"
# The formats' kernels, for quantized checkpoints (config.json's quant_method).
FORMAT_KERNELS = {"cpu_int4": ("cpu_w4a8", "cpu_w4a16", "cpu_int4"), "cpu_int8": ("cpu_w8a8",)}


@dataclass(frozen=True)
class WeightPath:
    quantization: str | None  # a --quantization name; None: unquantized
    quantize_head: bool
    why: str  # the measured fact the ranking rests on

    @property
    def label(self) -> str:
        if self.quantization is None:
            return "unquantized"
        return f"{self.quantization} g128{' +head' if self.quantize_head else ''}"


_W4A8_SPEED = ("4-bit weights on edge-infer's int8 kernels decode at memory speed with the fewest bytes per token "
               "(the head too: on small models it is the largest tensor read every token)")
CANDIDATES: dict[str, tuple[WeightPath, ...]] = {
    "speed": (
        WeightPath("cpu_w4a8", True, _W4A8_SPEED),
        WeightPath("cpu_w8a8", True, "8-bit weights on the int8 kernels: twice W4A8's bytes, still faster than tinygemm"),
        WeightPath("cpu_int4", True, "PyTorch's int4 kernel: compute-bound at one token, but a quarter of bf16's bytes"),
        WeightPath(None, False, "no quantized kernel runs fast here"),
    ),
    "fidelity": (
        WeightPath(None, False, "the checkpoint's own weights"),
        WeightPath("cpu_w8a8", False, "8-bit weights: mean KL 0.0002 against bf16 on the demo model, 29x below 4-bit"),
        WeightPath("cpu_w4a8", False, "4-bit g128, head unquantized: mean KL 0.0058 on the demo model"),
        WeightPath("cpu_int4", False, "4-bit g128, head unquantized: mean KL 0.0058 on the demo model"),
    ),
    "memory": (
        WeightPath("cpu_w4a8", True, "4-bit weights, head included: the fewest resident bytes, on the faster kernel"),
        WeightPath("cpu_int4", True, "4-bit weights, head included: the fewest resident bytes"),
        WeightPath("cpu_w8a8", True, "8-bit weights, head included: about half of bf16's bytes"),
        WeightPath(None, False, "no quantized kernel runs here"),
    ),
}


def skip_reason(path: WeightPath, priority: str, cpu: CpuCapabilities, stored_format: str | None) -> str | None:
    """Why ``path`` is not a candidate on ``cpu`` for a checkpoint of ``stored_format`` (None: a float checkpoint)."""
    if stored_format is not None and path.quantization not in FORMAT_KERNELS.get(stored_format, ()):
        return f"the checkpoint holds {stored_format} weights"
    if path.quantization is None:
        return None
    kernel = KERNELS[QUANT_KERNELS[path.quantization]]
    if (reason := kernel.missing(cpu)) is not None:
        return reason
    if priority == "speed" and (slow := kernel.slow_path(cpu)) is not None:
        return slow
    return None


def first_runnable(priority: str | None, cpu: CpuCapabilities) -> WeightPath:
    """The first path of ``priority`` this CPU runs, for a float checkpoint, without a memory plan (the Talker's
    stage reserves what its settings need)."""
    return next(p for p in CANDIDATES[_checked(priority)] if skip_reason(p, _checked(priority), cpu, None) is None)


def _checked(priority: str | None) -> str:
    priority = priority or DEFAULT_PRIORITY
    if priority not in PRIORITIES:
        from edge_infer.errors import InvalidRequestError

        raise InvalidRequestError(f"priority {priority!r} is not one of {', '.join(PRIORITIES)}")
    return priority


def plan_auto(plan_fn: Callable, model: str, priority: str | None, cpu: CpuCapabilities, stored_format: str | None,
              **settings):
    """The plan of the first weight path of ``priority`` that runs here and fits (``plan_fn``: plan_text_session)."""
    priority = _checked(priority)
    passed_over: list[str] = []
    plan = None
    for path in CANDIDATES[priority]:
        if (reason := skip_reason(path, priority, cpu, stored_format)) is not None:
            passed_over.append(f"{path.label} ({reason})")
            continue
        if stored_format is not None:  # the checkpoint's own settings (group size, head) apply
            quantization = path.quantization
        else:
            quantization = QuantConfig.named(path.quantization, quantize_head=path.quantize_head) if path.quantization else "none"
        plan = plan_fn(model, quantization=quantization, cpu=cpu, **settings)
        if plan.admitted:
            chosen = plan.settings["quantization"] or "unquantized"
            note = f"quantization auto, priority {priority} -> {chosen}: {path.why}"
            if passed_over:
                note += f"; passed over: {'; '.join(passed_over)}"
            plan.notes.insert(0, note)
            plan.settings["priority"] = priority
            return plan
        passed_over.append(f"{path.label} ({plan.reasons[0]})")
    assert plan is not None, "every priority ends with a path that always runs"
    plan.reasons.insert(0, f"quantization auto, priority {priority}: no weight path fits; tried {'; '.join(passed_over)}")
    plan.settings["priority"] = priority
    return plan
