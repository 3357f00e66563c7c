"""``edge-infer bench serve``: serving latency and throughput, and what HTTP costs per token.

For each concurrency level (1, 2, 4 clients by default) the same workload
runs twice with the same engine settings: first against the engine directly
(``AsyncEngine``, worker process, no HTTP: the offline numbers), then against
a real ``edge-infer serve`` process over streamed ``/v1/completions``. Each
client sends ``--requests`` requests one after another; prompts are fixed
token ids (exact length, no tokenizer in the way) and ``ignore_eos`` makes
every request generate ``--max-tokens`` tokens.

Measured at the consumer: time to first token (TTFT) and inter-token latency
(ITL, the gaps between token chunks) p50/p95, time per output token (TPOT:
first to last token of a request over its tokens, median over requests) and
output tokens/s over the level's wall time. Both sides ask for the sampled
token's logprob (``logprobs=0``): the server then streams a chunk for every
token, also one whose text is still empty (a byte of a longer character,
or, on a synthetic checkpoint, an id beyond its small tokenizer), so every
token is timed on both sides. The server's overhead per token
is its TPOT minus the engine's at the same level (TPOT, unlike ITL, does not
depend on how the network bunches chunks); the client runs in this process
in both cases, so that difference is HTTP, SSE and JSON on both ends.

This is one arm: a table goes to stderr and the metrics as one JSON line to
stdout, for ``edge-infer bench grid`` to repeat, rotate and stamp with
provenance.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field

from edge_infer.engine.cli_args import add_engine_args, engine_settings

WARMUP_TOKENS = 4
READY_TIMEOUT_S = 600
# Engine flags passed on to the server process: (attribute, flag).
_VALUE_FLAGS = (
    ("dtype", "--dtype"), ("max_model_len", "--max-model-len"), ("max_num_seqs", "--max-num-seqs"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"), ("kv_cache_memory_bytes", "--kv-cache-memory-bytes"),
    ("quantization", "--quantization"), ("group_size", "--group-size"), ("num_threads", "--num-threads"),
    ("weight_backend", "--weight-backend"),
)
_BOOL_FLAGS = (("asym", "--asym"), ("quantize_head", "--quantize-head"))


def configure(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    g = parser.add_argument_group("workload")
    g.add_argument("--concurrency", default="1,2,4", help="comma-separated numbers of concurrent clients (default 1,2,4)")
    g.add_argument("--requests", type=int, default=4, help="requests per client at each level (default 4)")
    g.add_argument("--prompt-tokens", type=int, default=32)
    g.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (ignore_eos)")


@dataclass
class Timeline:
    """Consumer-side times of one request."""

    sent: float
    tokens: list[float] = field(default_factory=list)  # arrival time of each token chunk
    count: int = 0  # tokens generated (usage), which a chunk may bundle


@dataclass
class LevelResult:
    ttft_ms: list[float]
    itl_ms: list[float]
    tpot_ms: list[float]
    tokens: int
    wall_s: float

    def metrics(self, prefix: str) -> dict[str, float]:
        def pct(values: list[float], q: int) -> float:
            return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 3) if len(values) > 1 else round(values[0], 3)

        return {
            f"{prefix}_ttft_p50_ms": pct(self.ttft_ms, 50), f"{prefix}_ttft_p95_ms": pct(self.ttft_ms, 95),
            f"{prefix}_itl_p50_ms": pct(self.itl_ms, 50), f"{prefix}_itl_p95_ms": pct(self.itl_ms, 95),
            f"{prefix}_tpot_p50_ms": pct(self.tpot_ms, 50),
            f"{prefix}_out_tps": round(self.tokens / self.wall_s, 3),
        }


def summarize(timelines: list[Timeline], wall_s: float) -> LevelResult:
    ttft = [(t.tokens[0] - t.sent) * 1000 for t in timelines if t.tokens]
    itl = [(b - a) * 1000 for t in timelines for a, b in zip(t.tokens, t.tokens[1:])]
    tpot = [(t.tokens[-1] - t.tokens[0]) * 1000 / (t.count - 1) for t in timelines if len(t.tokens) > 1 and t.count > 1]
    return LevelResult(ttft, itl, tpot, sum(t.count for t in timelines), wall_s)


async def run_level(one_request, clients: int, requests: int) -> LevelResult:
    """``clients`` loops of ``requests`` sequential requests each, all at once."""

    async def client(c: int) -> list[Timeline]:
        return [await one_request(c * requests + r) for r in range(requests)]

    t0 = time.perf_counter()
    per_client = await asyncio.gather(*(client(c) for c in range(clients)))
    return summarize([t for timelines in per_client for t in timelines], time.perf_counter() - t0)


def prompt_ids(i: int, n: int, vocab: int) -> list[int]:
    """A distinct prompt per request: no request shares a prefix with another."""
    return [(i * 7919 + k * 104729) % (vocab - 1) + 1 for k in range(n)]


async def engine_levels(args: argparse.Namespace, levels: list[int], vocab: int) -> dict[int, LevelResult]:
    from edge_infer.engine.async_engine import AsyncEngine
    from edge_infer.engine.frontend import Frontend, PreparedPrompt
    from edge_infer.engine.sampling_params import SamplingParams

    engine = AsyncEngine(Frontend.create(args.model, **engine_settings(args)), worker=args.worker)
    await engine.start()

    async def one(i: int, max_tokens: int = args.max_tokens) -> Timeline:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=0)
        tl = Timeline(time.perf_counter())
        async for event in engine.add_request(PreparedPrompt(None, prompt_ids(i, args.prompt_tokens, vocab)), params):
            if event.token_ids:
                tl.tokens.append(time.perf_counter())
                tl.count += len(event.token_ids)
        return tl

    try:
        await one(10**6, WARMUP_TOKENS)
        return {c: await run_level(one, c, args.requests) for c in levels}
    finally:
        await engine.close()


async def server_levels(base_url: str, args: argparse.Namespace, levels: list[int], vocab: int) -> dict[int, LevelResult]:
    import httpx

    async with httpx.AsyncClient(base_url=base_url, timeout=None, limits=httpx.Limits(max_connections=max(levels) + 1)) as http:

        async def one(i: int, max_tokens: int = args.max_tokens) -> Timeline:
            body = {"prompt": prompt_ids(i, args.prompt_tokens, vocab), "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "logprobs": 0, "stream": True, "stream_options": {"include_usage": True}}
            tl = Timeline(time.perf_counter())
            async with http.stream("POST", "/v1/completions", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        tl.count = chunk["usage"]["completion_tokens"]
                    elif chunk["choices"] and chunk["choices"][0].get("logprobs"):
                        tl.tokens.append(time.perf_counter())
            return tl

        await one(10**6, WARMUP_TOKENS)
        return {c: await run_level(one, c, args.requests) for c in levels}


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "edge_infer.cli", "serve", *([args.model] if args.model else []), "--port", str(port)]
    for attr, flag in _VALUE_FLAGS:
        value = getattr(args, attr)
        if value is not None:
            cmd += [flag, str(value)]
    cmd += [flag for attr, flag in _BOOL_FLAGS if getattr(args, attr)]
    return cmd + ["--worker", args.worker, "--max-queue", "0"]


def start_server(args: argparse.Namespace):
    import socket
    import subprocess

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(server_command(args, port), stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the server did not become ready (exit status {proc.poll()})")


def stop_server(proc) -> None:
    import signal
    import subprocess

    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def table(levels: list[int], engine: dict[int, LevelResult], server: dict[int, LevelResult]) -> str:
    lines = [f"{'clients':>7} {'arm':<7} {'TTFT p50':>9} {'p95':>8} {'ITL p50':>8} {'p95':>8} {'TPOT p50':>9} {'out tok/s':>10}"]
    for c in levels:
        for name, res in (("engine", engine[c]), ("server", server[c])):
            m = res.metrics("x")
            lines.append(
                f"{c:>7} {name:<7} {m['x_ttft_p50_ms']:>7.1f}ms {m['x_ttft_p95_ms']:>6.1f}ms {m['x_itl_p50_ms']:>6.2f}ms "
                f"{m['x_itl_p95_ms']:>6.2f}ms {m['x_tpot_p50_ms']:>7.2f}ms {m['x_out_tps']:>10.2f}"
            )
        overhead = server[c].metrics("x")["x_tpot_p50_ms"] - engine[c].metrics("x")["x_tpot_p50_ms"]
        lines.append(f"{'':>7} server overhead per token (TPOT p50): {overhead:+.3f} ms")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from edge_infer.engine.frontend import resolve_model
    from edge_infer.errors import EdgeInferError
    from edge_infer.models.config import ModelConfig

    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not levels or min(levels) < 1 or args.requests < 1 or args.prompt_tokens < 1 or args.max_tokens < 2:
        print("error: --concurrency needs positive counts; --requests, --prompt-tokens >= 1; --max-tokens >= 2", file=sys.stderr)
        return 2
    if args.max_num_seqs is not None and args.max_num_seqs < max(levels):
        print(f"error: --max-num-seqs {args.max_num_seqs} is below the highest concurrency {max(levels)}", file=sys.stderr)
        return 2
    try:
        vocab = ModelConfig.from_dir(resolve_model(args.model)).vocab_size
        engine = asyncio.run(engine_levels(args, levels, vocab))
    except EdgeInferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    proc, base = start_server(args)
    try:
        server = asyncio.run(server_levels(base, args, levels, vocab))
    finally:
        stop_server(proc)
    print(table(levels, engine, server), file=sys.stderr)
    metrics: dict[str, float] = {}
    for c in levels:
        metrics |= engine[c].metrics(f"c{c}_engine") | server[c].metrics(f"c{c}_server")
        metrics[f"c{c}_overhead_tpot_ms"] = round(metrics[f"c{c}_server_tpot_p50_ms"] - metrics[f"c{c}_engine_tpot_p50_ms"], 3)
    print(json.dumps(metrics))
    return 0
