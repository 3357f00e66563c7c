"""--quantization auto --priority: a weight path this CPU runs, named with its reason in the plan; explicit choices win."""
from __future__ import annotations

import pytest

from edge_infer import plan_text_session
from edge_infer.config import QuantConfig
from edge_infer.hardware.cpu import PROFILES, profile
from edge_infer.hardware.kernels import KERNELS, QUANT_KERNELS
from edge_infer.memory.weight_path import CANDIDATES, PRIORITIES

SETTINGS = dict(max_model_len=256, kv_cache_memory_bytes=1 << 20)


@pytest.mark.parametrize("cpu_name", sorted(PROFILES))
@pytest.mark.parametrize("priority", PRIORITIES)
def test_each_priority_picks_a_path_this_cpu_runs_and_says_why(tiny_model, cpu_name, priority):
    cpu = profile(cpu_name)
    plan = plan_text_session(tiny_model, quantization="auto", priority=priority, cpu=cpu, **SETTINGS)
    assert plan.admitted, plan.reasons
    assert plan.settings["priority"] == priority
    chosen = plan.settings["quantization"]
    note = plan.notes[0]
    assert note.startswith(f"quantization auto, priority {priority} -> {chosen or 'unquantized'}: ")
    if chosen is not None:
        kernel = KERNELS[QUANT_KERNELS[chosen.split()[0]]]
        assert kernel.missing(cpu) is None
        if priority == "speed":
            assert kernel.slow_path(cpu) is None, "speed never picks a kernel's slow path"
    # The first candidate that runs here is the one taken (everything fits the default memory).
    runnable = [p for p in CANDIDATES[priority]
                if p.quantization is None or (KERNELS[QUANT_KERNELS[p.quantization]].missing(cpu) is None
                                               and (priority != "speed" or KERNELS[QUANT_KERNELS[p.quantization]].slow_path(cpu) is None))]
    assert (chosen or "unquantized").startswith(runnable[0].quantization or "unquantized")


def test_a_priority_alone_implies_auto_and_an_explicit_quantization_wins(tiny_model):
    implied = plan_text_session(tiny_model, priority="memory", cpu=profile("avx2"), **SETTINGS)
    assert implied.settings["quantization"] == "cpu_w4a8 g128 sym +head"
    explicit = plan_text_session(tiny_model, quantization="cpu_int4", priority="memory", cpu=profile("avx2"), **SETTINGS)
    assert explicit.settings["quantization"] == "cpu_int4 g128 sym"
    assert any("--priority memory does not apply" in n for n in explicit.notes)
    refused = plan_text_session(tiny_model, quantization="cpu_w4a8", priority="speed", cpu=profile("arm-nodotprod"), **SETTINGS)
    assert not refused.admitted and any("needs dotprod" in r for r in refused.reasons)


def test_fidelity_takes_the_closest_path_that_fits(tiny_model):
    full = plan_text_session(tiny_model, priority="fidelity", cpu=profile("avx2"), **SETTINGS)
    assert full.settings["quantization"] is None
    w8 = plan_text_session(tiny_model, quantization="cpu_w8a8", cpu=profile("avx2"), **SETTINGS)
    squeezed = plan_text_session(tiny_model, priority="fidelity", cpu=profile("avx2"), available_bytes=w8.peak_bytes, **SETTINGS)
    assert squeezed.admitted and squeezed.settings["quantization"] == "cpu_w8a8 g128 sym"
    assert "passed over: unquantized (peak" in squeezed.notes[0]
    nothing = plan_text_session(tiny_model, priority="fidelity", cpu=profile("avx2"), available_bytes=1 << 20, **SETTINGS)
    assert not nothing.admitted and nothing.reasons[0].startswith("quantization auto, priority fidelity: no weight path fits")


def test_a_quantized_checkpoint_limits_the_choice_to_its_format(tiny_model, tmp_path):
    from edge_infer.quant.export import quantize_checkpoint

    int8 = quantize_checkpoint(tiny_model, tmp_path / "q8", QuantConfig.named("cpu_w8a8")).out_dir
    for priority in PRIORITIES:
        plan = plan_text_session(int8, priority=priority, cpu=profile("avx2"), **SETTINGS)
        assert plan.settings["quantization"] == "cpu_w8a8 g128 sym", priority


def test_a_deploy_stage_and_the_cli_take_a_priority(tiny_model):
    import subprocess
    import sys

    from edge_infer.runtime.config import EngineSettings, StageConfig
    from edge_infer.runtime.text_executor import _plan

    stage = StageConfig(stage_id=0, kind="ar", executor="text", model=str(tiny_model),
                        engine=EngineSettings(max_model_len=256, quantization="auto", priority="fidelity"))
    assert _plan(stage).notes[0].startswith("quantization auto, priority fidelity -> unquantized")
    done = subprocess.run([sys.executable, "-m", "edge_infer.cli", "plan", str(tiny_model), "--max-model-len", "256",
                           "--quantization", "auto", "--priority", "speed", "--cpu", "avx2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "note: quantization auto, priority speed -> cpu_w4a8 g128 sym +head" in done.stdout
    assert "cpu-w4a8 [avx2]" in done.stdout


def test_the_talker_stage_takes_a_priority_too():
    from pathlib import Path

    from edge_infer.hardware.cpu import detect
    from edge_infer.memory.weight_path import first_runnable
    from edge_infer.runtime.config import EngineSettings, StageConfig
    from edge_infer.tts.planning import talker_engine_config

    tiny = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tts" / "tiny"
    stage = StageConfig(stage_id=0, kind="ar", executor="talker", model=str(tiny), engine=EngineSettings(priority="speed"))
    chosen = first_runnable("speed", detect()).quantization
    quant = talker_engine_config(stage).quant
    assert (quant.name if quant else None) == chosen
