"""What a body of many tiny JSON items costs `edge-infer serve` (docs/serving.md, "Large and hostile bodies").

    python benchmarks/hostile_shapes.py --out benchmarks/results/hostile-shapes.json [--before-src DIR]

Each shape is a chat body of many tiny items, in two sizes: just under the server's default --max-body-items
(parsed, then refused for the request's item counts or its length) and of 2^20 items (1.5-10 MB: far over it,
under --max-body-bytes), each sent to a fresh demo server while a client polls /health. Reported per shape: the answer's status and time, the worst /health latency meanwhile
(the event loop's stall) and the server process's peak RSS gain (VmHWM after less RSS before, in MiB and per
body byte). A server that has not answered within ``--timeout-s`` is killed and reported as such. ``--before-src``
runs the same against another source tree in the same run.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import httpx

from serve_hostile import REPO, Server, before_after_parser, provenance_stamp, write_result

MiB = 1 << 20
USER = {"role": "user", "content": "a"}


def shapes(items: int) -> dict[str, bytes]:
    """Bodies of about ``items`` JSON items (http.json_items), each of one kind of tiny item."""
    def body(**fields) -> bytes:
        return json.dumps({"max_tokens": 2, **fields}, separators=(",", ":")).encode()

    return {
        "numbers as messages": body(messages=[1] * items),
        "empty objects as messages": body(messages=[{}] * (items // 2)),
        "one-letter messages": body(messages=[USER] * (items // 3)),
        "numbers in an unknown field": body(messages=[USER], extra=[0.5] * items),
        "a text that cannot fit": body(messages=[{"role": "user", "content": "word, " * items}]),
    }


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))


def one(src: Path, data: bytes, timeout_s: float) -> dict:
    server = Server(src, [])
    try:
        server.small()  # warm
        before = status_kib(server.proc.pid, "VmRSS:")
        worst, done = [0.0], threading.Event()

        def probe() -> None:
            while not done.is_set():
                t = time.monotonic()
                try:
                    httpx.get(server.url + "/health", timeout=timeout_s)
                except httpx.HTTPError:
                    pass
                worst[0] = max(worst[0], time.monotonic() - t)
                time.sleep(0.05)

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        t = time.monotonic()
        try:
            r = httpx.post(server.url + "/v1/chat/completions", content=data, timeout=timeout_s,
                           headers={"Content-Type": "application/json"})
            answer = {"status": r.status_code, "message": r.json()["error"]["message"][:160] if r.status_code >= 400
                      else "", "answered_s": round(time.monotonic() - t, 3)}
        except httpx.TimeoutException:
            answer = {"status": None, "message": f"no answer within {timeout_s} s", "answered_s": None}
        gained = (status_kib(server.proc.pid, "VmHWM:") - before) * 1024
        done.set()
        prober.join(timeout_s)  # a frozen server answers the prober only once it is killed
        return {**answer, "health_worst_s": round(worst[0], 3), "peak_rss_gain_mib": round(gained / MiB, 1),
                "peak_rss_gain_per_body_byte": round(gained / len(data), 2)}
    finally:
        server.proc.kill()
        server.proc.wait()


def main() -> int:
    parser = before_after_parser(__doc__)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args()
    stamp = provenance_stamp()
    from edge_infer.server.limits import DEFAULT_MAX_BODY_ITEMS

    sizes = {"under --max-body-items": shapes(DEFAULT_MAX_BODY_ITEMS - 1024), "2^20 items": shapes(1 << 20)}
    result = {"benchmark": "hostile-shapes", "model": "the embedded demo model", "timeout_s": args.timeout_s,
              "body_bytes": {size: {name: len(data) for name, data in bodies.items()} for size, bodies in sizes.items()},
              "arms": {}}
    arms = [("after", REPO / "src")] + ([("before", args.before_src)] if args.before_src is not None else [])
    for label, src in arms:
        result["arms"][label] = {"src": str(src)}
        for size, bodies in sizes.items():
            for name, data in bodies.items():
                print(f"== {label}: {name}, {size}", file=sys.stderr)
                result["arms"][label].setdefault(size, {})[name] = one(src, data, args.timeout_s)
    write_result(args.out, result, stamp)
    print(json.dumps(result["arms"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
