"""Process start times on the kernel's own clock.

`/proc/PID/stat` gives a process's start as clock ticks since boot. Turning
that into wall-clock time needs the boot time, which `/proc/stat` rounds to
whole seconds and which drifts from `time.time()` as the clock is
adjusted: a process age computed that way can be off by most of a second.
Comparing with `CLOCK_BOOTTIME` — the clock the start ticks count on —
avoids both errors; the remaining resolution is one clock tick (10 ms).
"""
from __future__ import annotations

import os
import time

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def since_boot_s() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def started_since_boot_s(pid: int | str = "self") -> float:
    """When process `pid` started, in seconds since boot; FileNotFoundError if it is gone."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[19]) * TICK_S  # field 22 overall: starttime


def process_age_s(pid: int | str = "self") -> float:
    """Seconds since process `pid` was created (for this process: interpreter start-up included)."""
    return since_boot_s() - started_since_boot_s(pid)
