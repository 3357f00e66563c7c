"""Wall time and per-operator self time of a repeated step (the decode and speech-frame profiles)."""
from __future__ import annotations

import time
from typing import Callable


def time_and_profile(step: Callable[[], object], count: int) -> tuple[float, list[tuple[str, float, float]]]:
    """Run ``step`` ``count`` times unprofiled, then ``count`` times under torch.profiler.

    Returns the wall ms per step (without the profiler's own cost) and, per
    operator, (name, self ms per step, calls per step), the largest first.
    """
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    for _ in range(count):
        step()
    wall_ms = (time.perf_counter() - start) * 1e3 / count
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(count):
            step()
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return wall_ms, [(e.key, e.self_cpu_time_total / 1e3 / count, e.count / count) for e in ops]
