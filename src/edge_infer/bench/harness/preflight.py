"""Are the target cores free? Per-core utilisation from /proc/stat.

Each core's busy share is measured over several short windows and the
minimum is kept: a one-off burst (a shell prompt, a cron tick) does not
block a run, while a sustained load shows in every window. Two verdicts
make a core set busy: the mean busy share of the target cores (capacity
another process is taking from the benchmark) above `max_stolen_pct`, or
any single core above `max_core_busy_pct`.
"""
from __future__ import annotations

import time

from edge_infer.bench.harness.results import LoadSample

PROC_STAT = "/proc/stat"


def read_cpu_times(path: str = PROC_STAT) -> dict[int, tuple[int, int]]:
    """core -> (busy jiffies, total jiffies) since boot."""
    times: dict[int, tuple[int, int]] = {}
    with open(path) as f:
        for line in f:
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu":
                continue
            # user nice system idle iowait irq softirq steal [guest guest_nice];
            # guest time is already inside user/nice, so it is left out.
            values = [int(v) for v in fields[:8]]
            idle = values[3] + values[4]
            total = sum(values)
            times[int(name[3:])] = (total - idle, total)
    return times


def busy_over_window(cores: list[int], window_s: float) -> dict[int, float]:
    before = read_cpu_times()
    time.sleep(window_s)
    after = read_cpu_times()
    shares: dict[int, float] = {}
    for core in cores:
        busy = after[core][0] - before[core][0]
        total = after[core][1] - before[core][1]
        shares[core] = 100.0 * busy / total if total > 0 else 0.0
    return shares


def measure_busy(cores: list[int], window_s: float, windows: int = 2) -> dict[int, float]:
    """Each core's minimum busy percentage over `windows` consecutive windows."""
    samples = [busy_over_window(cores, window_s) for _ in range(windows)]
    return {core: min(s[core] for s in samples) for core in cores}


def assess(per_core_pct: dict[int, float], max_stolen_pct: float, max_core_busy_pct: float, when: str) -> LoadSample:
    stolen = sum(per_core_pct.values()) / len(per_core_pct)
    reasons = []
    if stolen > max_stolen_pct:
        reasons.append(f"{stolen:.1f}% of the target cores' capacity is in use (limit {max_stolen_pct:g}%)")
    hot = {c: p for c, p in per_core_pct.items() if p > max_core_busy_pct}
    if hot:
        listed = ", ".join(f"core {c} at {p:.0f}%" for c, p in sorted(hot.items()))
        reasons.append(f"{listed} (limit {max_core_busy_pct:g}% per core)")
    return LoadSample(
        when=when,
        per_core_pct={c: round(p, 1) for c, p in per_core_pct.items()},
        stolen_pct=round(stolen, 1),
        busy=bool(reasons),
        reason="; ".join(reasons) or None,
    )


def check_cores(cores: list[int], window_s: float, max_stolen_pct: float, max_core_busy_pct: float, when: str) -> LoadSample:
    return assess(measure_busy(cores, window_s), max_stolen_pct, max_core_busy_pct, when)


def parse_cores(text: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]."""
    cores: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                first, last = (int(x) for x in part.split("-", 1))
                if last < first:
                    raise ValueError
                cores.update(range(first, last + 1))
            else:
                cores.add(int(part))
    except ValueError:
        raise ValueError(f"cores {text!r}: expected a list like 0-3,6") from None
    return sorted(cores)
