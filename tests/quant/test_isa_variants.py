"""Each ISA variant of the int8 kernels against the scalar reference, in the standalone harness (native/harness.cpp).

No PyTorch in the loop: the same objects the library links, compiled by the same rules (quant.native_build), into
a small program that checks every variant bit for bit against the reference and the reference against the exact
products. Natively for the variants this CPU runs; AVX-VNNI, where the CPU lacks it but has AVX512-VNNI, through
an EVEX-encoded stand-in of the same source; ARM NEON cross-compiled and run under qemu-aarch64 -cpu max.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from testutil import runnable_variants

from edge_infer.hardware.cpu import detect
from edge_infer.quant.native_build import CSRC, ISA_SOURCES, IsaSource, arch, compile_isa_objects, compiler

HARNESS = Path(__file__).with_name("native") / "harness.cpp"
ARM_CXX, QEMU = "aarch64-linux-gnu-g++", "qemu-aarch64"
# The AVX-VNNI source with vpdpbusd in its AVX512-VL encoding: same code, runs on AVX512-VNNI CPUs.
_VNNI = next(s for s in ISA_SOURCES["x86_64"] if s.variant == "avx-vnni")
VNNI_STAND_IN = IsaSource("avx-vnni", _VNNI.source, (*(f for f in _VNNI.flags if f != "-mavxvnni"), "-mavx512f",
                                                     "-mavx512vl", "-mavx512vnni", "-DEDGE_INFER_VNNI_EVEX"))


def build_harness(out: Path, sources: tuple[IsaSource, ...], cxx: str, link: tuple[str, ...] = ()) -> tuple[Path, list[str]]:
    """The harness linked with the variants of ``sources`` that compile: (executable, those variants)."""
    objects, built = compile_isa_objects(out / "obj", sources, cxx)
    exe = out / "harness"
    # The binding's floating-point flags (native_build.BINDING_FLAGS): pack_math.h compiles here as in the loader.
    subprocess.run([cxx, "-O3", "-std=c++17", "-ffp-contract=off", "-fno-trapping-math", f"-I{CSRC}", str(HARNESS),
                    *map(str, objects), *link, "-o", str(exe)], check=True, capture_output=True, text=True)
    return exe, built


def run_variant(harness: tuple[Path, list[str]], variant: str, runner: tuple[str, ...] = ()) -> str:
    exe, built = harness
    if variant not in built:
        pytest.skip(f"the {variant} variant does not compile with this compiler (it lacks the variant's flags)")
    return run_harness([*runner, str(exe), variant])


def run_harness(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def checksum(output: str) -> str:
    return re.search(r"reference checksum (\w+)", output).group(1)


@pytest.fixture(scope="module")
def native_harness(tmp_path_factory) -> tuple[Path, list[str]]:
    if shutil.which(compiler()) is None or arch() not in ISA_SOURCES:
        pytest.skip(f"no C++ compiler ({compiler()}) or no kernels for {arch()}")
    sources = ISA_SOURCES[arch()]
    cpu = detect()
    if arch() == "x86_64" and not cpu.has("avx_vnni") and cpu.has("avx512vl", "avx512_vnni"):
        sources = tuple(VNNI_STAND_IN if s.variant == "avx-vnni" else s for s in sources)
    return build_harness(tmp_path_factory.mktemp("harness"), sources, compiler())


NATIVE = [v for v in runnable_variants() if v != "scalar"]


@pytest.mark.parametrize("variant", NATIVE)
def test_a_variant_this_cpu_runs_equals_the_reference(native_harness, variant):
    out = run_variant(native_harness, variant)
    assert f"ok {variant}:" in out and "bit-identical" in out and "ok scalar:" in out, out


def test_avx_vnni_equals_the_reference_natively_or_through_its_evex_stand_in(native_harness):
    cpu = detect()
    if cpu.arch != "x86_64" or not (cpu.has("avx2", "fma", "avx_vnni") or cpu.has("avx512vl", "avx512_vnni")):
        pytest.skip("needs avx_vnni, or avx512vl + avx512_vnni for the EVEX-encoded stand-in of the same source")
    out = run_variant(native_harness, "avx-vnni")
    assert "ok avx-vnni:" in out, out


def test_the_tile_units_panels_equal_the_reference(native_harness):
    """AMX-INT8 panels (prompt rows in blocks of 16) give the scalar reference's bits, as its tile kernels do."""
    if "amx-int8" not in NATIVE:
        pytest.skip("needs amx_int8 (Intel Xeon, Sapphire Rapids on), which this CPU lacks or the mask hides")
    out = run_variant(native_harness, "amx-int8")
    found = re.search(r"ok amx-int8: \d+ matrix cases, (\d+) of them also in blocks of 16 on the tile unit", out)
    assert found and int(found.group(1)) > 0, out


@pytest.fixture(scope="module")
def arm_output(tmp_path_factory) -> str:
    if arch() == "aarch64":
        pytest.skip("this machine is ARM: the native harness test covers NEON")
    missing = [tool for tool in (ARM_CXX, QEMU) if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (Debian: g++-aarch64-linux-gnu, qemu-user)")
    harness = build_harness(tmp_path_factory.mktemp("arm"), ISA_SOURCES["aarch64"], ARM_CXX, link=("-static",))
    return run_variant(harness, "neon-dotprod", runner=(QEMU, "-cpu", "max"))


def test_neon_dotprod_equals_the_reference_under_qemu(arm_output):
    assert "ok neon-dotprod:" in arm_output and "ok scalar:" in arm_output, arm_output


def test_the_reference_gives_the_same_bits_on_x86_and_arm(native_harness, arm_output):
    """The scalar reference (and so every variant) computes identical outputs on both architectures."""
    assert checksum(run_variant(native_harness, "scalar")) == checksum(arm_output)
