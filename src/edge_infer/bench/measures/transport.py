"""`edge-infer bench transport`: cost of moving one payload between stage processes.

For each payload size, a producer in this process exports a chunk with the
omni runtime's own transport (``runtime.transport``), a consumer process
copies it out and acknowledges, and the producer releases it — the full
life of one chunk between stages. Two paths per size: inline (pickled
through the pipe) and shared memory. Reported: microseconds per chunk
(median of repeats) and the effective bandwidth. One JSON line, so it works
as a grid arm.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

DEFAULT_SIZES = "256,4096,65536,1048576,8388608"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="payload sizes in bytes, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per size and path (median reported)")
    parser.add_argument("--budget-s", type=float, default=0.2, help="time spent per repeat (sets the chunk count)")
    parser.add_argument("--out", default=None, help="also write the result with provenance to this file")


def _consumer(conn) -> None:
    from edge_infer.runtime.transport import receive

    while True:
        ref = conn.recv()
        if ref is None:
            return
        receive(ref)
        conn.send(ref.seq)


def _round_trips(conn, buffers, payload, count: int) -> float:
    t0 = time.perf_counter()
    for _ in range(count):
        ref = buffers.export(payload)
        conn.send(ref)
        buffers.release([conn.recv()])
    return (time.perf_counter() - t0) / count


def measure(sizes: list[int], repeats: int, budget_s: float) -> dict[str, float]:
    import multiprocessing as mp

    import numpy as np

    from edge_infer.runtime.contracts import Payload
    from edge_infer.runtime.transport import OutboundBuffers, new_pipeline_prefix

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_consumer, args=(child,), daemon=True)
    proc.start()
    prefix = new_pipeline_prefix() + "bench_"
    metrics: dict[str, float] = {}
    try:
        for size in sizes:
            payload = Payload("pcm_audio/1", np.zeros(size // 4, dtype=np.float32), {"sample_rate": 24000, "channels": 1})
            for path, threshold in (("inline", 1 << 62), ("shm", 0)):
                buffers = OutboundBuffers(prefix, threshold, max_unacked=1)
                one = _round_trips(parent, buffers, payload, 3)  # warm-up, and the chunk count for the budget
                count = max(3, int(budget_s / max(one, 1e-6)))
                times = [_round_trips(parent, buffers, payload, count) for _ in range(repeats)]
                us = statistics.median(times) * 1e6
                metrics[f"{path}_{size}_us"] = round(us, 2)
                metrics[f"{path}_{size}_gbps"] = round(payload.nbytes / (us * 1e-6) / 1e9, 3)
                buffers.release_all()
    finally:
        parent.send(None)
        proc.join(5)
    return metrics


def run(args: argparse.Namespace) -> int:
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        print(f"error: --sizes must be integers, got {args.sizes!r}", file=sys.stderr)
        return 2
    if not sizes or min(sizes) < 4 or args.repeats < 1 or args.budget_s <= 0:
        print("error: sizes must be >= 4 bytes, --repeats >= 1, --budget-s > 0", file=sys.stderr)
        return 2
    metrics = measure(sizes, args.repeats, args.budget_s)
    for size in sizes:
        print(
            f"{size:>10} B  inline {metrics[f'inline_{size}_us']:>10.1f} us   shm {metrics[f'shm_{size}_us']:>10.1f} us",
            file=sys.stderr,
        )
    if args.out:
        from edge_infer.bench.harness.provenance import collect

        doc = {"benchmark": "transport", "metrics": metrics, "provenance": collect([]).model_dump()}
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(metrics))
    return 0
