"""The CPU capability model: what this machine's CPU can run, detected once.

Every kernel names the instruction-set features it needs (``hardware.kernels``)
and the planner admits only what ``detect()`` reports. Features use one
spelling across architectures (``FEATURES``); ``/proc/cpuinfo``'s own names
(``asimddp``, ``amx_tile`` ...) are mapped onto it.

``EDGE_INFER_CPU_FEATURES`` masks features for testing and for comparing
paths: a profile name (``avx2``) or a comma-separated feature list. It can
only take features away. When it hides AVX-512, PyTorch's, oneDNN's and MKL's
own dispatch are told too (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``,
``MKL_ENABLE_INSTRUCTIONS``, unless already set), so a process started
afterwards runs as it would on that CPU.

``PROFILES`` describes common edge CPUs, to plan for a machine other than
this one (``edge-infer plan --cpu PROFILE``) and to test refusals.
Torch-free: planning must not import torch.
"""
from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, field, replace
from pathlib import Path

MASK_ENV = "EDGE_INFER_CPU_FEATURES"

# The features the project's paths care about, per architecture, in the order shown.
FEATURES = {
    "x86_64": ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
               "avx512_bf16", "amx_bf16", "amx_int8"),
    "aarch64": ("asimd", "dotprod", "i8mm", "sve", "bf16"),
}
# /proc/cpuinfo spellings that differ from ours.
_CPUINFO_ALIASES = {"asimddp": "dotprod", "avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni"}

PROFILES: dict[str, tuple[str, tuple[str, ...], str]] = {
    # name: (arch, features, examples)
    "avx2": ("x86_64", ("avx2", "fma", "f16c"), "AMD Zen 2/3, Intel Skylake-Comet Lake desktops"),
    "avx-vnni": ("x86_64", ("avx2", "fma", "f16c", "avx_vnni"), "Intel N100/N150/N305, Alder/Raptor Lake"),
    "avx512": ("x86_64", ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"),
               "Intel Ice/Tiger Lake, Cascade Lake servers"),
    "avx512-bf16": ("x86_64", ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
                               "avx512_bf16"), "AMD Zen 4/5, Intel Cooper Lake"),
    "amx": ("x86_64", ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
                       "avx512_bf16", "amx_bf16", "amx_int8"), "Intel Xeon Sapphire Rapids and later"),
    "arm-nodotprod": ("aarch64", ("asimd",), "Raspberry Pi 4 (Cortex-A72)"),
    "arm-dotprod": ("aarch64", ("asimd", "dotprod"), "Raspberry Pi 5 (Cortex-A76), Jetson Orin"),
    "arm-i8mm": ("aarch64", ("asimd", "dotprod", "i8mm", "bf16"), "Apple M2+, Snapdragon X, Graviton 3"),
}


@dataclass(frozen=True)
class Cache:
    level: int
    kind: str  # Data | Instruction | Unified
    bytes: int
    shared_by: int  # logical CPUs sharing one instance


@dataclass(frozen=True)
class CpuCapabilities:
    arch: str
    features: frozenset[str]
    model: str = "unknown"
    source: str = "detected"  # or the profile / mask it came from
    masked: tuple[str, ...] = ()  # features this CPU has but EDGE_INFER_CPU_FEATURES hides
    logical_cpus: int | None = None
    usable_cpus: int | None = None  # this process's affinity
    physical_cores: int | None = None
    caches: tuple[Cache, ...] = field(default=())

    def has(self, *names: str) -> bool:
        return all(n in self.features for n in names)

    def missing(self, names: tuple[str, ...]) -> list[str]:
        return [n for n in names if n not in self.features]

    @property
    def native_bf16(self) -> bool:
        """bf16 arithmetic in hardware (otherwise bf16 is converted to fp32 and back, i.e. emulated)."""
        return bool({"avx512_bf16", "amx_bf16", "bf16"} & self.features)

    @property
    def isa_summary(self) -> str:
        """The features in their canonical order, e.g. ``x86_64 avx2 fma f16c``."""
        known = [f for f in FEATURES.get(self.arch, ()) if f in self.features]
        return " ".join([self.arch, *known]) if known else f"{self.arch} (none of the listed features)"

    def to_dict(self) -> dict:
        return {
            "arch": self.arch,
            "model": self.model,
            "features": [f for f in FEATURES.get(self.arch, ()) if f in self.features],
            "source": self.source,
            "masked": list(self.masked),
            "logical_cpus": self.logical_cpus,
            "usable_cpus": self.usable_cpus,
            "physical_cores": self.physical_cores,
            "caches": [{"level": c.level, "kind": c.kind, "bytes": c.bytes, "shared_by": c.shared_by} for c in self.caches],
        }


def profile(name: str) -> CpuCapabilities:
    """A named edge CPU (``PROFILES``), for planning another machine or testing refusals."""
    if name not in PROFILES:
        raise ValueError(f"unknown CPU profile {name!r}; known: {', '.join(PROFILES)}")
    arch, features, examples = PROFILES[name]
    return CpuCapabilities(arch, frozenset(features), model=examples, source=f"profile {name}")


@functools.lru_cache(maxsize=1)
def detect() -> CpuCapabilities:
    """This machine's CPU, with ``EDGE_INFER_CPU_FEATURES`` applied."""
    arch = _normalize_arch(platform.machine())
    cpuinfo = _read("/proc/cpuinfo")
    flags = _cpuinfo_flags(cpuinfo)
    detected = frozenset(f for f in FEATURES.get(arch, ()) if f in flags)
    caps = CpuCapabilities(
        arch=arch,
        features=detected,
        model=_cpuinfo_field(cpuinfo, "model name") or _cpuinfo_field(cpuinfo, "Model") or "unknown",
        logical_cpus=os.cpu_count(),
        usable_cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        physical_cores=_physical_cores(),
        caches=_caches(),
    )
    mask = os.environ.get(MASK_ENV, "").strip()
    return _apply_mask(caps, mask) if mask else caps


def mask_features(mask: str, arch: str) -> frozenset[str]:
    """The features a mask keeps where the CPU has them: a profile's, or the listed ones."""
    if mask in PROFILES:
        return frozenset(PROFILES[mask][1])
    allowed = frozenset(_CPUINFO_ALIASES.get(f, f) for f in mask.replace(" ", ",").split(",") if f)
    unknown = sorted(allowed - set(FEATURES.get(arch, ())))
    if unknown:
        raise ValueError(
            f"{MASK_ENV}={mask!r} names {', '.join(unknown)}, not features of {arch}; use a profile "
            f"({', '.join(PROFILES)}) or features from: {', '.join(FEATURES.get(arch, ()))}"
        )
    return allowed


def _apply_mask(caps: CpuCapabilities, mask: str) -> CpuCapabilities:
    kept = caps.features & mask_features(mask, caps.arch)
    hidden = tuple(f for f in FEATURES.get(caps.arch, ()) if f in caps.features - kept)
    if caps.arch == "x86_64" and "avx512f" not in kept:
        # Tell PyTorch's and oneDNN's dispatch too, for processes that have not started them yet.
        os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2" if "avx2" in kept else "default")
        os.environ.setdefault("ONEDNN_MAX_CPU_ISA", _onednn_isa(kept))
        # MKL (PyTorch's fp32 matmul) dispatches on its own: on an Intel CPU it would keep its AVX-512 paths.
        os.environ.setdefault("MKL_ENABLE_INSTRUCTIONS", "AVX2" if "avx2" in kept else "SSE4_2")
    return replace(caps, features=kept, masked=hidden, source=f"detected, masked by {MASK_ENV}={mask}")


def _onednn_isa(kept: frozenset[str]) -> str:
    """oneDNN's ceiling for a CPU without AVX-512: AVX-VNNI boxes get its VEX int8 paths, as they would natively."""
    if "avx2" not in kept:
        return "SSE41"
    return "AVX2_VNNI" if "avx_vnni" in kept else "AVX2"


def _normalize_arch(machine: str) -> str:
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine.lower())


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cpuinfo_flags(text: str) -> frozenset[str]:
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(_CPUINFO_ALIASES.get(f, f) for f in line.partition(":")[2].split())
    return frozenset()


def _cpuinfo_field(text: str, key: str) -> str | None:
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key and value.strip():
            return value.strip()
    return None


def _physical_cores() -> int | None:
    """Distinct (package, core) pairs in sysfs topology; None where it is not readable."""
    cores = set()
    for cpu in Path("/sys/devices/system/cpu").glob("cpu[0-9]*"):
        package = _read(str(cpu / "topology" / "physical_package_id")).strip()
        core = _read(str(cpu / "topology" / "core_id")).strip()
        if package and core:
            cores.add((package, core))
    return len(cores) or None


def _caches() -> tuple[Cache, ...]:
    """cpu0's caches from sysfs (on a VM these are what the hypervisor reports)."""
    out = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index[0-9]*")):
        size = _parse_size(_read(str(index / "size")).strip())
        level = _read(str(index / "level")).strip()
        if size is None or not level.isdigit():
            continue
        shared = _read(str(index / "shared_cpu_list")).strip()
        out.append(Cache(int(level), _read(str(index / "type")).strip() or "Unified", size, _count_cpus(shared)))
    return tuple(out)


def _parse_size(text: str) -> int | None:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in units and text[:-1].isdigit():
        return int(text[:-1]) * units[text[-1]]
    return int(text) if text.isdigit() else None


def _count_cpus(cpu_list: str) -> int:
    n = 0
    for part in filter(None, cpu_list.split(",")):
        lo, _, hi = part.partition("-")
        n += int(hi) - int(lo) + 1 if hi else 1
    return max(n, 1)
