"""Peak memory of `edge-infer serve` under a queue of image requests, against its memory plan (docs/multimodal.md).

    python benchmarks/queued_media.py --out benchmarks/results/queued-media-demo.json [--before-src DIR] [-- FLAGS]

The server runs the embedded demo model (or ``--model``) with its default settings plus FLAGS. As many
requests as it admits (``--max-num-seqs`` + ``--max-queue``, read from its plan and flags) are sent at once,
each with ``--images`` pictures of random pixels at the largest size the plan was sized for; the RssAnon of
the server's process tree (worker included) is sampled until every answer is in. Reported per arm: the
plan's steady bytes (``edge_infer_memory_plan_bytes``), RssAnon after loading and at its peak, the peak's
ratio to the plan, the answers' statuses and time, and the engine's most sequences holding media at once
(where the server reports it). ``--before-src`` runs the same against another source tree (a checkout of an
earlier commit) in the same run; ``--repeats`` runs of each arm, alternated.
"""
from __future__ import annotations

import base64
import json
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

from edge_infer.bench.harness.media_bench import noise_png
from serve_hostile import REPO, Server, before_after_parser, provenance_stamp, summarize, write_result

MiB = 1 << 20


def metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def one_run(src: Path, model: list[str], flags: list[str], requests: int, images: int, side: int) -> dict:
    from edge_infer.memory.measure import PeakSampler

    server = Server(src, model + flags)
    try:
        plan_steady = metrics(server.url)['edge_infer_memory_plan_bytes{phase="steady"}']
        content = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(noise_png(i, side, side)).decode()}} for i in range(images)]
        content.append({"type": "text", "text": "What is in these pictures?"})
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8, "ignore_eos": True}
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=300).raise_for_status()  # warm
        sampler = PeakSampler(pid=server.proc.pid, interval_s=0.01).start()
        (worker,) = psutil.Process(server.proc.pid).children()
        in_worker = PeakSampler(pid=worker.pid, interval_s=0.01).start()
        loaded = sampler.mark("loaded").rss_anon_bytes
        worker_loaded = in_worker.mark("loaded").rss_anon_bytes
        statuses: list[int] = []

        def ask() -> None:
            statuses.append(httpx.post(server.url + "/v1/chat/completions", json=body, timeout=600).status_code)

        threads = [threading.Thread(target=ask) for _ in range(requests)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.perf_counter() - start
        sampler.stop()
        in_worker.stop()
        m = metrics(server.url)
        return {"plan_steady_mib": round(plan_steady / MiB, 1), "rss_anon_loaded_mib": round(loaded / MiB, 1),
                "peak_rss_anon_mib": round(sampler.peak_bytes / MiB, 1),
                "peak_over_plan": round(sampler.peak_bytes / plan_steady, 3),
                "worker_rss_anon_loaded_mib": round(worker_loaded / MiB, 1),
                "worker_peak_rss_anon_mib": round(in_worker.peak_bytes / MiB, 1),
                "statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))}, "answered_s": round(took, 2),
                "media_sequences_peak": m.get("edge_infer_media_sequences_peak")}
    finally:
        server.close()


def main() -> int:
    parser = before_after_parser(__doc__)
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the embedded demo model)")
    parser.add_argument("--requests", type=int, default=36, help="sent at once (default: 4 running + 32 queued)")
    parser.add_argument("--images", type=int, default=4, help="pictures per request (default: the demo's limit)")
    parser.add_argument("--side", type=int, default=294, help="square pictures of this many pixels (the demo's "
                        "plan is sized for 113 tokens a picture: 294 x 294 is 110)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("flags", nargs="*", help="more `edge-infer serve` flags (after --)")
    args = parser.parse_args()
    stamp = provenance_stamp()
    model = [args.model] if args.model else []
    arms = [("after", REPO / "src")] + ([("before", args.before_src)] if args.before_src else [])
    runs: dict[str, list[dict]] = {label: [] for label, _ in arms}
    for _ in range(args.repeats):
        for label, src in arms:
            print(f"== {label}: {src}", file=sys.stderr)
            runs[label].append(one_run(src, model, args.flags, args.requests, args.images, args.side))
    result = {"benchmark": "queued-media", "model": args.model or "the embedded demo model", "flags": args.flags,
              "requests": args.requests, "images_per_request": args.images, "side_px": args.side,
              "repeats": args.repeats, "arms": {}}
    for label, src in arms:
        done = runs[label]
        result["arms"][label] = {
            "src": str(src),
            "peak_over_plan": summarize([r["peak_over_plan"] for r in done]),
            "peak_rss_anon_mib": summarize([r["peak_rss_anon_mib"] for r in done]),
            "answered_s": summarize([r["answered_s"] for r in done]),
            "runs": done,
        }
    write_result(args.out, result, stamp)
    print(json.dumps({k: {n: v for n, v in a.items() if n != "runs"} for k, a in result["arms"].items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
