"""``--encoder-quantization``: the weight path of a multimodal thinker's towers, applied to its plan (torch-free).

The towers' linears load dense in the engine's dtype unless asked otherwise:
``same`` gives them the decoder's quantized kernel, a method name (cpu_int4,
cpu_w4a8, cpu_w8a8) that one. ``plan_text_session`` sizes the towers with the
model's weights, dense (their specs are in ``models.weights.weight_specs``);
this step, run on the plan it returns, refuses a kernel this CPU cannot run
(as the decoder's is refused, with the nearest that runs), lists the towers'
kernel beside the others, sizes their linears as that kernel holds them, and
puts the setting into the ``EngineConfig``. It belongs inside the plan once
the plan takes the setting itself.
"""
from __future__ import annotations

from dataclasses import replace

from edge_infer.config import ENCODER_QUANTIZATION_CHOICES, encoder_quant_config
from edge_infer.errors import InvalidRequestError
from edge_infer.hardware.cpu import detect
from edge_infer.hardware.kernels import QUANT_KERNELS, encoder_kernels
from edge_infer.memory.plan import TextPlan
from edge_infer.models.encoder_weights import tower_weight_specs

# The native kernels (edge-infer's own, built on first use).
NATIVE = ("cpu_w4a8", "cpu_w8a8")


def apply_encoder_quantization(plan: TextPlan, choice: str | None) -> TextPlan:
    """``plan`` with the towers' weight path ``choice`` (None: none) resolved, checked and sized."""
    choice = choice or "none"
    if choice not in ENCODER_QUANTIZATION_CHOICES:
        raise InvalidRequestError(f"encoder_quantization {choice!r} is not supported; use one of "
                                  f"{', '.join(ENCODER_QUANTIZATION_CHOICES)}")
    cfg = plan.model_config
    if cfg is None or cfg.multimodal is None:
        if choice != "none":
            plan.notes.append(f"--encoder-quantization {choice} does nothing: {plan.settings.get('architecture')} "
                              "has no media encoders")
        return plan
    plan.settings["encoder_quantization"] = choice
    method = _method(plan, choice)
    engine = plan.engine_config
    selection = encoder_kernels(plan.cpu or detect(), plan.settings["dtype"], method,
                                engine.weight_backend if engine is not None else "auto", _built(plan))
    if method in NATIVE and not selection.refusals:
        from edge_infer.quant import native_build

        why = native_build.missing_toolchain()
        if why is not None:
            selection.refusals.append(f"--encoder-quantization {method}: {why}")
    if plan.kernels is not None:
        plan.kernels.choices.append(selection.choices[0])
        plan.kernels.refusals += selection.refusals
    plan.notes += selection.notes
    if selection.refusals:
        plan.reasons += selection.refusals
        plan.admitted, plan.engine_config = False, None
        return plan
    if engine is not None:
        _size_towers(plan, encoder_quant_config(choice, engine.quant))
        plan.engine_config = replace(engine, encoder_quantization=choice)
    return plan


def _method(plan: TextPlan, choice: str) -> str | None:
    """The method name the towers run (None: dense); ``same`` reads the decoder's kernel."""
    if choice == "none":
        return None
    if choice != "same":
        return choice
    decoder = plan.kernels.kernel_for("decoder linears") if plan.kernels is not None else None
    return {kernel: name for name, kernel in QUANT_KERNELS.items()}.get(decoder)


def _built(plan: TextPlan) -> tuple[str, ...] | None:
    """The ISA variants of the built kernel library, when the plan is for this CPU (any may run elsewhere)."""
    if plan.cpu is not None and plan.cpu != detect():
        return None
    from edge_infer.quant import native_build

    return native_build.built_variants()


def _size_towers(plan: TextPlan, quant) -> None:
    """The weights item with the towers' linears as ``quant`` holds them (the plan sized them dense)."""
    if quant is None:
        return
    from edge_infer.quant.sizes import linear_nbytes

    mm = plan.model_config.multimodal
    dtype_bytes = 2 if plan.settings["dtype"] == "bfloat16" else 4
    saved = sum(spec.numel * dtype_bytes - linear_nbytes(spec, quant, dtype_bytes)
                for spec in tower_weight_specs(mm.vision, mm.audio) if spec.is_linear)
    weights = next(item for item in plan.items if item.name == "weights")
    weights.bytes -= saved
    weights.note += f"; media towers' linears {quant.name} g{quant.group_size}"
