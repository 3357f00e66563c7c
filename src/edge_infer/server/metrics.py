"""Prometheus metrics of a server: what every served model shares, and a text model's own.

One ``SharedMetrics`` per server (its own registry, so that several servers
can live in one process, as tests run them): HTTP requests by path and
status, ended requests by reason, admission refusals, and the RssAnon of the
whole process tree, workers included. Each served model adds its own
collectors to that registry (``TextMetrics``; ``speech_metrics.SpeechMetrics``).
Counters and histograms are updated as requests run; gauges are set at
scrape time.
"""
from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from edge_infer.engine.protocol import CoreStats
from edge_infer.memory.measure import tree_rss_anon_bytes
from edge_infer.memory.plan import TextPlan

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
# Paths reported as themselves; anything else (404s, scanners, fuzzers) is "other", to bound label cardinality.
SHARED_PATHS = ("/v1/models", "/health", "/metrics")
TEXT_PATHS = ("/v1/chat/completions", "/v1/completions")
MODEL_PATH_PREFIX = "/v1/models/"


class SharedMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.paths: set[str] = set(SHARED_PATHS)  # served models add their routes
        self.requests = Counter("edge_infer_requests", "HTTP requests by path and status code", ["path", "status"], registry=r)
        self.finished = Counter("edge_infer_request_finish", "ended samples (text) or requests (speech) by reason",
                                ["reason"], registry=r)
        self.rejected = Counter("edge_infer_admission_rejections", "requests refused with 429: admission queue full", registry=r)
        self.rss_anon = Gauge("edge_infer_memory_rss_anon_bytes", "RssAnon measured over the server's process tree", registry=r)

    def count_request(self, path: str, status: int) -> None:
        label = "/v1/models/{id}" if path.startswith(MODEL_PATH_PREFIX) else path if path in self.paths else "other"
        self.requests.labels(label, str(status)).inc()

    def render(self) -> bytes:
        self.rss_anon.set(tree_rss_anon_bytes(os.getpid()))
        return generate_latest(self.registry)


class TextMetrics:
    """A text model's metrics, in the server's shared registry."""

    def __init__(self, shared: SharedMetrics, plan: TextPlan):
        self.shared = shared
        shared.paths.update(TEXT_PATHS)
        r = shared.registry
        self.finished, self.rejected = shared.finished, shared.rejected
        self.prompt_tokens = Counter("edge_infer_prompt_tokens", "prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("edge_infer_generation_tokens", "tokens generated", registry=r)
        self.ttft = Histogram(
            "edge_infer_time_to_first_token_seconds", "from submission to the first token", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "edge_infer_inter_token_latency_seconds", "between consecutive tokens of a request", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.e2e = Histogram("edge_infer_request_latency_seconds", "from submission to the end", buckets=_LATENCY_BUCKETS, registry=r)
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
        self.in_flight = Gauge("edge_infer_sequences_in_flight", "sequences admitted by the server and not yet ended", registry=r)
        self.queue_depth = Gauge("edge_infer_queue_depth", "sequences waiting in the engine for a slot", registry=r)
        self.running = Gauge("edge_infer_sequences_running", "sequences the engine is decoding", registry=r)
        self.kv_used = Gauge("edge_infer_kv_blocks_used", "KV cache blocks in use", registry=r)
        self.kv_free = Gauge("edge_infer_kv_blocks_free", "KV cache blocks free", registry=r)
        self.kv_total = Gauge("edge_infer_kv_blocks_total", "KV cache blocks allocated", registry=r)
        self.preemptions = Gauge("edge_infer_preemptions", "sequences preempted for KV space since the worker started", registry=r)
        self.prefix_queries = Gauge("edge_infer_prefix_cache_query_tokens", "tokens of admitted sequences looked up in "
                                    "the prefix cache since the worker started", registry=r)
        self.prefix_hits = Gauge("edge_infer_prefix_cache_hit_tokens", "of those, tokens found cached (not computed)", registry=r)
        self.prefix_evictions = Gauge("edge_infer_prefix_cache_evictions", "cached KV blocks reused for other tokens", registry=r)
        self.kv_cached = Gauge("edge_infer_kv_blocks_cached", "KV cache blocks findable by prefix (held or not)", registry=r)
        self.media_sequences = Gauge("edge_infer_media_sequences", "sequences in the engine holding media (inputs or "
                                     "embeddings); at most --max-num-seqs", registry=r)
        self.media_sequences_peak = Gauge("edge_infer_media_sequences_peak", "the most sequences holding media at once "
                                          "since the worker started", registry=r)
        self.media_waiting = Gauge("edge_infer_media_waiting", "sequences of requests with media waiting for room in "
                                   "the engine, their media not yet decoded", registry=r)
        self.plan_bytes = Gauge("edge_infer_memory_plan_bytes", "bytes the memory plan predicts", ["phase"], registry=r)
        self.plan_bytes.labels("steady").set(plan.steady_bytes)
        self.plan_bytes.labels("load_peak").set(plan.load_peak_bytes)
        self.plan_bytes.labels("kv_cache").set(plan.item("kv cache"))

    def refresh(self, stats: CoreStats | None, in_flight: int, media_waiting: int = 0) -> None:
        """The gauges; ``stats`` None: the engine is down (its gauges read 0, not stale values)."""
        self.in_flight.set(in_flight)
        self.media_waiting.set(media_waiting)
        self.engine_up.set(0 if stats is None else 1)
        stats = stats or CoreStats()
        self.queue_depth.set(stats.num_waiting)
        self.running.set(stats.num_running)
        self.kv_used.set(stats.kv_blocks_used)
        self.kv_free.set(stats.kv_blocks_total - stats.kv_blocks_used)
        self.kv_total.set(stats.kv_blocks_total)
        self.preemptions.set(stats.num_preemptions)
        self.prefix_queries.set(stats.prefix_cache_query_tokens)
        self.prefix_hits.set(stats.prefix_cache_hit_tokens)
        self.prefix_evictions.set(stats.prefix_cache_evictions)
        self.kv_cached.set(stats.kv_blocks_cached)
        self.media_sequences.set(stats.media_sequences)
        self.media_sequences_peak.set(stats.media_sequences_peak)
