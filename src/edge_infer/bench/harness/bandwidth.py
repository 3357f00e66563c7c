"""How fast decode reads weights, against how fast this machine can read memory.

Batch-1 decode is bound by memory: each step reads every weight the step
uses once. So the figure that says how close a kernel is to the hardware is
the read rate it sustains (weight bytes per token x tokens per second), set
beside the machine's own read bandwidth measured in the same process, with
the same threads, right after the arm ran.

The machine figure is a reduction (`torch.sum`) over a buffer far larger
than any last-level cache: a plain streaming read, the best of several
passes. It is a floor, not the machine's peak: on the AVX-512 host every
PyTorch reduction stopped near 30-33 GB/s while decode arms streamed up to
42 GB/s (docs/performance.md), so compare arms by their read rates and take
the fastest of them as the least the machine can do. The KV cache a tg step
reads (at most `tg` tokens of context) is not counted; on the published
shapes it is under 1% of the weights.
"""
from __future__ import annotations

import time
from typing import Any

BUFFER_BYTES = 1 << 30
PASSES = 5


def machine_read_bytes_per_s(threads: int, buffer_bytes: int = BUFFER_BYTES, passes: int = PASSES) -> float:
    """Best-of-`passes` rate at which `threads` threads stream-read a buffer of `buffer_bytes`."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        buf = torch.ones(buffer_bytes // 4, dtype=torch.float32)  # written once, so every page is resident
        float(buf.sum())  # warm-up: page tables, the thread pool
        best = float("inf")
        for _ in range(passes):
            start = time.perf_counter()
            float(buf.sum())
            best = min(best, time.perf_counter() - start)
        del buf
    finally:
        torch.set_num_threads(previous)
    return buffer_bytes / best


def read_rates(tg_tps: float, decode_read_bytes: int, threads: int) -> dict[str, Any]:
    """The top-level metrics of a pp-tg arm: decode's weight read rate and the machine's, in GB/s."""
    return {
        "tg_read_gb_per_s": round(tg_tps * decode_read_bytes / 1e9, 3),
        "mem_read_gb_per_s": round(machine_read_bytes_per_s(threads) / 1e9, 3),
    }
