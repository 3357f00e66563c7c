"""Device profiles (cpu / igpu / npu) and the memory pools they draw from.

``detect_machine`` reads what this machine says about itself: MemTotal and
MemAvailable, the cgroup memory limit, the CPUs this process may use and
their instruction-set flags, and whether an iGPU render node or an NPU
accelerator node exists (an absent device is kept, marked absent, with the
reason). ``load_profile`` reads a YAML profile that describes a target
machine, or (``detect: true``) corrects the detected one; bundled profiles
(e.g. ``laptop``: CPU, iGPU and NPU sharing one RAM pool) load by name.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError

from edge_infer.hardware.cpu import detect
from edge_infer.hardware.memory import cgroup_memory, meminfo

PROFILE_DIR = Path(__file__).resolve().parent.parent / "runtime" / "profiles"
DEVICE_CLASSES = ("cpu", "igpu", "npu")


@dataclass(frozen=True)
class MemoryPool:
    name: str
    total_bytes: int
    available_bytes: int  # what may be reserved now
    headroom_bytes: int = 0  # kept free for the OS and everything else
    source: str = ""

    @property
    def capacity_bytes(self) -> int:
        return max(0, self.available_bytes - self.headroom_bytes)


@dataclass(frozen=True)
class ComputeTraits:
    cores: int | None = None  # CPU cores usable, iGPU compute units, NPU tiles
    isa: tuple[str, ...] = ()
    bf16: bool | None = None
    peak_tops: float | None = None
    memory_bandwidth_gbs: float | None = None


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    present: bool
    pool: str
    compute: ComputeTraits = field(default_factory=ComputeTraits)
    note: str = ""


@dataclass(frozen=True)
class MachineProfile:
    name: str
    pools: tuple[MemoryPool, ...]
    devices: tuple[DeviceProfile, ...]
    source: str

    def device(self, name: str) -> DeviceProfile:
        for dev in self.devices:
            if dev.name == name:
                return dev
        return DeviceProfile(name, present=False, pool="", note=f"machine profile {self.name!r} does not describe a {name}")

    def pool(self, name: str) -> MemoryPool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"machine profile {self.name!r} has no memory pool {name!r}")

    def devices_on(self, pool: str) -> list[str]:
        return [d.name for d in self.devices if d.pool == pool and d.present]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- detection --------------------------------------------------------------


def _nodes(directory: str, prefix: str) -> list[str]:
    path = Path(directory)
    return sorted(str(p) for p in path.glob(f"{prefix}*")) if path.is_dir() else []


def detect_machine() -> MachineProfile:
    info = meminfo()
    total = info.get("MemTotal", 0)
    available = info.get("MemAvailable", total)
    limit, usage, where = cgroup_memory()
    source = "MemTotal/MemAvailable from /proc/meminfo"
    if limit is not None:
        total = min(total, limit)
        available = min(available, max(0, limit - (usage or 0)))
        source += f"; capped by the cgroup limit {where}"
    else:
        source += f"; {where}"
    ram = MemoryPool("ram", total, available, source=source)

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    caps = detect()
    isa = tuple(caps.to_dict()["features"])
    cpu = DeviceProfile("cpu", True, "ram", ComputeTraits(cores=cpus, isa=isa, bf16=caps.native_bf16), note=f"{cpus} CPUs in this process's affinity")
    render = _nodes("/dev/dri", "renderD")
    igpu = (
        DeviceProfile("igpu", True, "ram", note=f"render node {render[0]}; assumed integrated (draws on RAM) - describe a discrete GPU in a profile file")
        if render else DeviceProfile("igpu", False, "ram", note="absent: no GPU render node under /dev/dri")
    )
    accel = _nodes("/dev/accel", "accel")
    npu = (
        DeviceProfile("npu", True, "ram", note=f"accelerator node {accel[0]} (draws on RAM)")
        if accel else DeviceProfile("npu", False, "ram", note="absent: no accelerator node under /dev/accel")
    )
    return MachineProfile("detected", (ram,), (cpu, igpu, npu), source="read from this machine")


# --- profile files ----------------------------------------------------------


class _PoolEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    total_bytes: ByteSize | None = None
    available_bytes: ByteSize | None = None
    headroom_bytes: ByteSize | None = None


class _DeviceEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern="^(cpu|igpu|npu)$")
    present: bool | None = None
    pool: str | None = None
    cores: int | None = Field(default=None, ge=1)
    isa: list[str] | None = None
    bf16: bool | None = None
    peak_tops: float | None = Field(default=None, gt=0)
    memory_bandwidth_gbs: float | None = Field(default=None, gt=0)
    note: str | None = None


class _ProfileFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    detect: bool = False  # start from this machine's detected profile and correct it
    pools: list[_PoolEntry] = []
    devices: list[_DeviceEntry] = []


def bundled_profiles() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PROFILE_DIR.glob("*.yaml"))}


def _apply_pool(base: MemoryPool | None, entry: _PoolEntry, file: str) -> MemoryPool:
    if base is None and entry.total_bytes is None:
        raise ValueError(f"{file}: pools[{entry.name}].total_bytes is required for a pool the machine does not report")
    total = int(entry.total_bytes) if entry.total_bytes is not None else base.total_bytes  # type: ignore[union-attr]
    if entry.available_bytes is not None:
        available = int(entry.available_bytes)
    else:
        available = total if base is None or entry.total_bytes is not None else base.available_bytes
    headroom = int(entry.headroom_bytes) if entry.headroom_bytes is not None else (base.headroom_bytes if base else 0)
    return MemoryPool(entry.name, total, min(available, total), headroom, source=f"{file}" + (f" over {base.source}" if base else ""))


def _apply_device(base: DeviceProfile | None, entry: _DeviceEntry, file: str) -> DeviceProfile:
    corrected = base is not None
    base = base or DeviceProfile(entry.name, present=True, pool="ram")
    traits = base.compute
    updates = {k: getattr(entry, k) for k in ("cores", "bf16", "peak_tops", "memory_bandwidth_gbs") if getattr(entry, k) is not None}
    if entry.isa is not None:
        updates["isa"] = tuple(entry.isa)
    return DeviceProfile(
        entry.name,
        present=base.present if entry.present is None else entry.present,
        pool=entry.pool or base.pool,
        compute=replace(traits, **updates),
        note=entry.note if entry.note is not None else (f"{base.note} (corrected by {file})" if corrected else ""),
    )


def load_profile(source: str | os.PathLike[str]) -> MachineProfile:
    """A machine profile from a YAML file, or a bundled one by name (``laptop``)."""
    path = Path(source)
    if not path.is_file():
        bundled = bundled_profiles().get(str(source))
        if bundled is None:
            raise FileNotFoundError(f"machine profile {str(source)!r} not found; bundled profiles: {', '.join(bundled_profiles())}")
        path = bundled
    try:
        doc = _ProfileFile.model_validate(yaml.safe_load(path.read_text()) or {})
    except (yaml.YAMLError, ValidationError) as exc:
        raise ValueError(f"{path}: invalid machine profile: {exc}") from None
    base = detect_machine() if doc.detect else None
    pools = {p.name: p for p in (base.pools if base else ())}
    devices = {d.name: d for d in (base.devices if base else ())}
    for entry in doc.pools:
        pools[entry.name] = _apply_pool(pools.get(entry.name), entry, str(path))
    for dev in doc.devices:
        devices[dev.name] = _apply_device(devices.get(dev.name), dev, str(path))
    for dev in devices.values():
        if dev.present and dev.pool not in pools:
            raise ValueError(f"{path}: device {dev.name} draws on pool {dev.pool!r}, which the profile does not define; add it under pools:")
    return MachineProfile(doc.name, tuple(pools.values()), tuple(devices.values()), source=str(path) + (" over the detected machine" if base else ""))


def machine_profile(profile: str | os.PathLike[str] | MachineProfile | None = None) -> MachineProfile:
    """The profile to plan against: a given one, a file or bundled name, or this machine."""
    if isinstance(profile, MachineProfile):
        return profile
    return detect_machine() if profile is None else load_profile(profile)
