"""What hostile input and a dying worker cost other clients of `edge-infer serve` (docs/serving.md).

    python benchmarks/serve_hostile.py --out benchmarks/results/serve-hostile.json [--before-src DIR]

For each body (1 MB and 8 MB prompts, alone and four at once) the big
requests are sent while a client keeps sending 2-token completions back to
back; reported are the worst of those small requests' latencies beside the
median and worst of 20 sent alone (the excess is the time the big bodies
took from everyone else). Then
the worker is SIGKILLed and the time until `/health` answers 200 and a
request succeeds again is measured. `--before-src` runs the same against
another source tree (a checkout of an earlier commit) in the same run, so
the two are compared side by side. Every figure is the median of
`--repeats` with its spread; provenance as the bench harness stamps it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
SMALL = {"prompt": "Hello", "max_tokens": 2}
RECOVERY_WAIT_S = 30  # a server that is not healthy again by then counts as not recovered


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, src: Path, extra: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(src)}
        self.proc = subprocess.Popen([sys.executable, "-m", "edge_infer.cli", "serve", "--port", str(self.port), *extra],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.wait_healthy(120)

    def wait_healthy(self, timeout_s: float) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"not healthy within {timeout_s} s")

    def small(self) -> float:
        t = time.perf_counter()
        r = httpx.post(self.url + "/v1/completions", json=SMALL, timeout=120)
        r.raise_for_status()
        return time.perf_counter() - t

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def stall(server: Server, body: bytes, concurrent: int) -> dict:
    """Big requests in threads; small ones back to back until they are all answered."""
    results: list[tuple[int, float]] = []

    def big() -> None:
        t = time.perf_counter()
        r = httpx.post(server.url + "/v1/completions", content=body, headers={"Content-Type": "application/json"}, timeout=300)
        results.append((r.status_code, time.perf_counter() - t))

    threads = [threading.Thread(target=big) for _ in range(concurrent)]
    for th in threads:
        th.start()
    smalls = []
    while any(th.is_alive() for th in threads) or not smalls:
        smalls.append(server.small())
    for th in threads:
        th.join()
    return {"small_worst_s": round(max(smalls), 4), "big_status": sorted({s for s, _ in results}),
            "big_answered_s": round(max(t for _, t in results), 4)}


def recovery(server: Server) -> dict:
    workers = [c.pid for c in psutil.Process(server.proc.pid).children(recursive=True)]
    if not workers:
        return {"recovered": False, "why": "no engine worker to kill: the one killed before was not restarted"}
    (worker,) = workers
    killed = time.monotonic()
    os.kill(worker, signal.SIGKILL)
    time.sleep(0.05)
    try:
        healthy = server.wait_healthy(RECOVERY_WAIT_S)
    except (TimeoutError, RuntimeError) as exc:
        return {"recovered": False, "why": str(exc)}
    server.small()
    return {"recovered": True, "healthy_after_s": round(healthy + 0.05, 3), "serving_after_s": round(time.monotonic() - killed, 3)}


def before_after_parser(doc: str) -> argparse.ArgumentParser:
    """The flags of every benchmark here that compares this tree with an earlier one."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--before-src", type=Path, default=None, help="an earlier source tree's src/ to compare with")
    return parser


def provenance_stamp():
    """This tree's edge_infer on the path, and the provenance stamp it starts (bench/harness/provenance.py)."""
    sys.path.insert(0, str(REPO / "src"))
    from edge_infer.bench.harness.provenance import collect

    return collect(sorted(os.sched_getaffinity(0)))


def write_result(out: Path, result: dict, stamp) -> None:
    from edge_infer.bench.harness.provenance import now_utc

    stamp.finished_at = now_utc()
    result["provenance"] = stamp.model_dump()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def summarize(samples: list[float]) -> dict:
    med = statistics.median(samples)
    return {"median": round(med, 4), "spread": round((max(samples) - min(samples)) / med, 3) if med else 0.0,
            "samples": [round(s, 4) for s in samples]}


def measure(src: Path, repeats: int, extra: list[str]) -> dict:
    server = Server(src, extra)
    try:
        for _ in range(3):
            server.small()  # warm
        alone = [server.small() for _ in range(20)]
        out: dict = {"small_alone_median_s": round(statistics.median(alone), 4), "small_alone_worst_s": round(max(alone), 4),
                     "stalls": {}}
        for mb in (1, 8):
            body = json.dumps({"prompt": "word " * (mb * (1 << 20) // 5), "max_tokens": 2}).encode()
            for concurrent in (1, 4):
                runs = [stall(server, body, concurrent) for _ in range(repeats)]
                out["stalls"][f"{mb}MB x{concurrent}"] = {
                    "small_worst_s": summarize([r["small_worst_s"] for r in runs]),
                    "big_answered_s": summarize([r["big_answered_s"] for r in runs]),
                    "big_status": sorted({s for r in runs for s in r["big_status"]}),
                }
        runs = [recovery(server) for _ in range(repeats)]
        ok = [r for r in runs if r["recovered"]]
        out["sigkill_recovery"] = {
            "recovered": f"{len(ok)} of {len(runs)}",
            "serving_after_s": summarize([r["serving_after_s"] for r in ok]) if ok else None,
            "failures": [r["why"] for r in runs if not r["recovered"]],
        }
        return out
    finally:
        server.close()


def main() -> int:
    parser = before_after_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    stamp = provenance_stamp()
    result = {"benchmark": "serve-hostile", "model": "the embedded demo model", "repeats": args.repeats, "arms": {}}
    arms = [("after", REPO / "src", ["--max-restarts", str(args.repeats + 1)])]
    if args.before_src is not None:
        arms.insert(0, ("before", args.before_src, []))
    for label, src, extra in arms:
        print(f"== {label}: {src}", file=sys.stderr)
        result["arms"][label] = {"src": str(src), **measure(src, args.repeats, extra)}
    write_result(args.out, result, stamp)
    print(json.dumps(result["arms"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
