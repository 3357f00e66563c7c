"""Prometheus metrics of one server (its own registry, so several can live in one process).

Counters and histograms are updated as requests run; gauges of the engine
(queue, KV blocks) and of memory (the plan's prediction and the RssAnon
measured over this process tree, worker included) are read at scrape time.
"""
from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from edge_infer.engine.protocol import CoreStats
from edge_infer.memory.measure import tree_rss_anon_bytes
from edge_infer.memory.plan import TextPlan

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
# Paths reported as themselves; anything else (404s, scanners, fuzzers) is "other", to bound label cardinality.
KNOWN_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")


class ServerMetrics:
    def __init__(self, plan: TextPlan):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("edge_infer_requests", "HTTP requests by path and status code", ["path", "status"], registry=r)
        self.prompt_tokens = Counter("edge_infer_prompt_tokens", "prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("edge_infer_generation_tokens", "tokens generated", registry=r)
        self.ttft = Histogram(
            "edge_infer_time_to_first_token_seconds", "from submission to the first token", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "edge_infer_inter_token_latency_seconds", "between consecutive tokens of a request", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.e2e = Histogram("edge_infer_request_latency_seconds", "from submission to the end", buckets=_LATENCY_BUCKETS, registry=r)
        self.finished = Counter("edge_infer_request_finish", "ended samples by finish reason", ["reason"], registry=r)
        self.tool_call_recoveries = Counter(
            "edge_infer_tool_call_recoveries", "malformed tool calls: repaired (recovered) or kept as text",
            ["parser", "outcome"], registry=r,
        )
        self.format_checks = Counter(
            "edge_infer_response_format_checks", "response_format json_object outputs checked", ["valid"], registry=r
        )
        self.engine_restarts = Counter("edge_infer_engine_restarts", "engine workers restarted after dying", registry=r)
        self.engine_up = Gauge("edge_infer_engine_up", "1 while the engine worker serves, 0 while it is dead, "
                               "unresponsive or restarting", registry=r)
        self.rejected = Counter("edge_infer_admission_rejections", "requests refused with 429: admission queue full", registry=r)
        self.in_flight = Gauge("edge_infer_sequences_in_flight", "sequences admitted by the server and not yet ended", registry=r)
        self.queue_depth = Gauge("edge_infer_queue_depth", "sequences waiting in the engine for a slot", registry=r)
        self.running = Gauge("edge_infer_sequences_running", "sequences the engine is decoding", registry=r)
        self.kv_used = Gauge("edge_infer_kv_blocks_used", "KV cache blocks in use", registry=r)
        self.kv_free = Gauge("edge_infer_kv_blocks_free", "KV cache blocks free", registry=r)
        self.kv_total = Gauge("edge_infer_kv_blocks_total", "KV cache blocks allocated", registry=r)
        self.preemptions = Gauge("edge_infer_preemptions", "sequences preempted for KV space since the worker started", registry=r)
        self.plan_bytes = Gauge("edge_infer_memory_plan_bytes", "bytes the memory plan predicts", ["phase"], registry=r)
        self.rss_anon = Gauge("edge_infer_memory_rss_anon_bytes", "RssAnon measured over the server's process tree", registry=r)
        self.plan_bytes.labels("steady").set(plan.steady_bytes)
        self.plan_bytes.labels("load_peak").set(plan.load_peak_bytes)
        self.plan_bytes.labels("kv_cache").set(plan.item("kv cache"))

    def count_request(self, path: str, status: int) -> None:
        self.requests.labels(path if path in KNOWN_PATHS else "other", str(status)).inc()

    def render(self, stats: CoreStats | None, in_flight: int) -> bytes:
        """The registry as text; ``stats`` None: the engine is down (its gauges read 0, not stale values)."""
        self.in_flight.set(in_flight)
        self.engine_up.set(0 if stats is None else 1)
        stats = stats or CoreStats()
        self.queue_depth.set(stats.num_waiting)
        self.running.set(stats.num_running)
        self.kv_used.set(stats.kv_blocks_used)
        self.kv_free.set(stats.kv_blocks_total - stats.kv_blocks_used)
        self.kv_total.set(stats.kv_blocks_total)
        self.preemptions.set(stats.num_preemptions)
        self.rss_anon.set(tree_rss_anon_bytes(os.getpid()))
        return generate_latest(self.registry)
