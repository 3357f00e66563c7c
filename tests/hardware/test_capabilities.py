"""The CPU capability model: detection, masks, and the plan admitting only what a CPU can run."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edge_infer import plan_text_session
from edge_infer.hardware import cpu as cpu_mod
from edge_infer.hardware.cpu import MASK_ENV, PROFILES, CpuCapabilities, detect, profile
from edge_infer.hardware.kernels import KERNELS, auto_dtype, select_kernels
from edge_infer.hardware.memory import transparent_huge_pages

X86_CPUINFO = "processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512vnni avxvnni\n"
ARM_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 asimddp i8mm bf16\nCPU part\t: 0xd0b\n"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge_infer.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_cpuinfo_spellings_map_onto_one_vocabulary():
    assert {"avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni"} <= cpu_mod._cpuinfo_flags(X86_CPUINFO)
    assert {"asimd", "dotprod", "i8mm", "bf16"} <= cpu_mod._cpuinfo_flags(ARM_CPUINFO)
    assert cpu_mod._cpuinfo_field(X86_CPUINFO, "model name") == "Test CPU"


def test_this_machine_is_described_with_cores_and_caches():
    caps = detect()
    assert caps.arch in cpu_mod.FEATURES and caps.features <= set(cpu_mod.FEATURES[caps.arch])
    assert caps.usable_cpus == len(os.sched_getaffinity(0))
    assert all(c.bytes > 0 and c.level >= 1 for c in caps.caches)
    assert caps.isa_summary.startswith(caps.arch)


def detect_in_child(mask: str | None) -> dict:
    """detect() in a fresh process, with ``mask`` as EDGE_INFER_CPU_FEATURES (None: unmasked)."""
    code = ("import json, os; from edge_infer.hardware.cpu import detect; c = detect(); "
            "print(json.dumps({**c.to_dict(), 'aten': os.environ.get('ATEN_CPU_CAPABILITY'), "
            "'mkl': os.environ.get('MKL_ENABLE_INSTRUCTIONS'), 'onednn': os.environ.get('ONEDNN_MAX_CPU_ISA')}))")
    env = {k: v for k, v in os.environ.items() if k != MASK_ENV}
    if mask is not None:
        env[MASK_ENV] = mask
    return json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout)


def test_a_mask_only_takes_features_away_and_tells_pytorch_too():
    masked, real = detect_in_child("avx2"), detect_in_child(None)
    assert set(masked["features"]) == set(real["features"]) & set(PROFILES["avx2"][1])
    assert set(masked["masked"]) == set(real["features"]) - set(PROFILES["avx2"][1])
    if real["arch"] == "x86_64":
        assert masked["aten"] == os.environ.get("ATEN_CPU_CAPABILITY", "avx2")
        assert masked["mkl"] == os.environ.get("MKL_ENABLE_INSTRUCTIONS", "AVX2")
        assert masked["onednn"] == os.environ.get("ONEDNN_MAX_CPU_ISA", "AVX2")


def test_an_avx_vnni_mask_keeps_onednn_on_its_vnni_paths():
    real = detect_in_child(None)
    if real["arch"] != "x86_64" or "avx_vnni" not in real["features"]:
        pytest.skip("this CPU lacks avx_vnni, which the avx-vnni profile keeps")
    masked = detect_in_child("avx-vnni")
    assert "avx_vnni" in masked["features"] and "avx512f" not in masked["features"]
    assert masked["onednn"] == os.environ.get("ONEDNN_MAX_CPU_ISA", "AVX2_VNNI")


def test_a_mask_naming_an_unknown_feature_is_an_error_that_lists_the_known_ones():
    done = run_cli("doctor", env={MASK_ENV: "avx2,warp_drive"})
    assert done.returncode == 2 and "warp_drive" in done.stderr and "Traceback" not in done.stderr


# The int8 kernels' variant each profile runs (None: refused).
INT8_VARIANT_OF = {"avx2": "avx2", "avx-vnni": "avx-vnni", "avx512": "avx512-vnni", "avx512-bf16": "avx512-vnni",
                   "amx": "amx-int8", "arm-nodotprod": None, "arm-dotprod": "neon-dotprod", "arm-i8mm": "neon-dotprod"}


@pytest.mark.parametrize("name", sorted(PROFILES))
@pytest.mark.parametrize("method", ["cpu_w4a8", "cpu_w8a8"])
def test_the_plan_runs_the_int8_kernels_wherever_a_variant_does_and_names_it(tiny_model, name, method):
    plan = plan_text_session(tiny_model, max_model_len=256, quantization=method, cpu=profile(name))
    variant = INT8_VARIANT_OF[name]
    if variant is not None:
        assert not any(r.startswith("--quantization") for r in plan.reasons), plan.reasons
        assert plan.kernels.choices[0].variant == variant and f"[{variant}]" in plan.table()
        return
    assert not plan.admitted and plan.engine_config is None
    [reason] = [r for r in plan.reasons if r.startswith(f"--quantization {method}")]
    assert "needs dotprod (its neon-dotprod variant)" in reason and "slowly" in reason  # tinygemm is scalar on ARM


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_auto_never_picks_a_scalar_or_emulated_path_when_a_fast_one_runs(name):
    cpu = profile(name)
    dense, _ = auto_dtype(cpu, None)
    assert dense == ("bfloat16" if cpu.arch == "x86_64" and cpu.native_bf16 else "float32")
    int4, _ = auto_dtype(cpu, "cpu_int4")
    # tinygemm's vectorized path is bf16-only (fp32 runs its scalar loop, ~15-35x slower).
    assert int4 == ("bfloat16" if KERNELS["cpu-int4"].slow_path(cpu) is None else "float32")


def test_explicit_slow_choices_run_but_say_so():
    avx2 = profile("avx2")
    sel = select_kernels(avx2, "float32", "cpu_int4")
    assert not sel.refusals and any("scalar loop" in n and "drop --dtype" in n for n in sel.notes)
    sel = select_kernels(avx2, "bfloat16", None, dtype_explicit=True)
    assert not sel.refusals and any("emulated" in n for n in sel.notes)
    assert sel.kernel_for("decoder linears") == "dense"  # no oneDNN bf16 without AVX-512


def test_plan_cli_for_another_cpu_exits_1_with_the_alternative(tiny_model):
    done = run_cli("plan", str(tiny_model), "--max-model-len", "256", "--quantization", "cpu_w4a8", "--cpu", "arm-nodotprod")
    assert done.returncode == 1, done.stderr
    assert "REFUSED" in done.stdout and "use --quantization cpu_int4" in done.stdout
    assert "cpu aarch64 asimd (profile arm-nodotprod)" in done.stdout
    done = run_cli("plan", str(tiny_model), "--max-model-len", "256", "--quantization", "cpu_w4a8", "--cpu", "avx2")
    assert done.returncode == 0 and "cpu x86_64 avx2 fma f16c (profile avx2)" in done.stdout
    assert "cpu-w4a8 [avx2]" in done.stdout
    listing = json.loads(run_cli("plan", str(tiny_model), "--max-model-len", "256", "--json", "--cpu", "arm-dotprod").stdout)
    assert listing["cpu"]["arch"] == "aarch64" and listing["kernels"]["kernels"]["decoder linears"]["kernel"] == "dense"


def test_doctor_reports_every_choice_and_refuses_by_name():
    rep = json.loads(run_cli("doctor", "--json", "--cpu", "avx2").stdout)
    assert rep["cpu"]["features"] == ["avx2", "fma", "f16c"]
    assert rep["choices"]["cpu_int4"]["runs"] and rep["choices"]["cpu_int4"]["dtype_auto"] == "bfloat16"
    w4a8 = rep["choices"]["cpu_w4a8"]
    assert w4a8["runs"] and w4a8["kernels"]["decoder linears"]["variant"] == "avx2"
    rep = json.loads(run_cli("doctor", "--json", "--cpu", "arm-nodotprod").stdout)
    assert not rep["choices"]["cpu_w8a8"]["runs"] and "dotprod" in rep["choices"]["cpu_w8a8"]["refusals"][0]
    here = run_cli("doctor")
    assert here.returncode == 0 and detect().isa_summary.split()[0] in here.stdout and "dispatches to" in here.stdout
    pages = "2 MiB" if transparent_huge_pages() in ("always", "madvise") else "4 KiB"
    assert f"packed weights on {pages} pages" in here.stdout
    assert "packed weights on 4 KiB pages" in run_cli("doctor", env={"EDGE_INFER_HUGE_PAGES": "0"}).stdout


@pytest.mark.parametrize("name, kernel", [("avx512-bf16", True), ("amx", False), ("avx2", False), ("arm-i8mm", False)])
def test_doctor_names_the_attention_bf16_models_take(name, kernel):
    """edge-infer's kernel where it runs and SDPA is not faster; SDPA on AMX-BF16 (its products on the tile
    unit) and where the kernel cannot run, each with the reason."""
    rep = json.loads(run_cli("doctor", "--json", "--cpu", name).stdout)
    assert rep["bf16_attention"].startswith("edge-infer's" if kernel else "PyTorch's SDPA: ")
    assert ("AMX-BF16" in rep["bf16_attention"]) == (name == "amx")


def test_an_unknown_profile_is_a_one_line_error():
    done = run_cli("plan", "--cpu", "pentium-ii")
    assert done.returncode == 2 and "unknown CPU profile" in done.stderr and "Traceback" not in done.stderr


def test_profiles_are_capabilities():
    for name in PROFILES:
        caps = profile(name)
        assert isinstance(caps, CpuCapabilities) and caps.features <= set(cpu_mod.FEATURES[caps.arch])
