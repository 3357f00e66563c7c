"""What memory this machine offers (cgroup-aware), read from /proc and /sys."""
from __future__ import annotations

from pathlib import Path

_UNLIMITED = 1 << 62  # cgroup v1 reports "no limit" as a huge number


def meminfo() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" else int(text)


def cgroup_memory() -> tuple[int | None, int | None, str]:
    """(limit, usage, where) of the tightest memory cgroup limit over this process's ancestry."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None, "no cgroup information"
    root = Path("/sys/fs/cgroup")
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            files, bases = ("memory.max", "memory.current"), [root, root / "unified"]
        elif "memory" in controllers.split(","):
            files, bases = ("memory.limit_in_bytes", "memory.usage_in_bytes"), [root / "memory"]
        else:
            continue
        for base in bases:
            best: tuple[int, int | None, str] | None = None
            node = base / rel.lstrip("/")
            for directory in [node, *node.parents]:
                if not str(directory).startswith(str(base)):
                    break
                limit = _read_int(directory / files[0])
                if limit is not None and limit < _UNLIMITED and (best is None or limit < best[0]):
                    best = (limit, _read_int(directory / files[1]), str(directory / files[0]))
            if best is not None:
                return best
    return None, None, "no cgroup memory limit"


def available_memory_bytes() -> int:
    """Memory a new process can still claim: MemAvailable, capped by the cgroup's headroom."""
    info = meminfo()
    avail = info.get("MemAvailable", info.get("MemTotal", 0))
    limit, usage, _ = cgroup_memory()
    if limit is not None:
        avail = min(avail, max(0, limit - (usage or 0)))
    return avail


def transparent_huge_pages() -> str | None:
    """The kernel's transparent huge page mode ("always", "madvise" or "never"); None where there is none."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None
