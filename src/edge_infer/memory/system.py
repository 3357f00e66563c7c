"""What this machine offers: available memory (cgroup-aware) and CPU traits."""
from __future__ import annotations

import functools
from pathlib import Path


def _meminfo_bytes(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _cgroup_headroom_bytes() -> int | None:
    """memory.max - memory.current of this process's cgroup (v2), if limited."""
    try:
        rel = Path("/proc/self/cgroup").read_text().strip().split("::", 1)[1]
        base = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((base / "memory.current").read_text())
    except (OSError, IndexError, ValueError):
        return None


def available_memory_bytes() -> int:
    """Memory a new process can still claim: MemAvailable, capped by the cgroup's headroom."""
    avail = _meminfo_bytes("MemAvailable")
    headroom = _cgroup_headroom_bytes()
    return min(avail, headroom) if headroom is not None else avail


def total_memory_bytes() -> int:
    return _meminfo_bytes("MemTotal")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_bf16() -> bool:
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"
