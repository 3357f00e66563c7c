"""Prometheus metrics of a speech server (its own registry).

Per request: time to first audio packet (TTFP), real-time factor (wall
time to the last chunk / audio duration), end-to-end latency, audio
produced, and each stage's time on it (``time_in_stage_s``, from its first
input to its last output) and queue wait. At scrape time: each stage's
reservation from the deploy plan, whether its worker is up, and the RssAnon
of the server's process tree (stage processes included).
"""
from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from edge_infer.memory.measure import tree_rss_anon_bytes
from edge_infer.runtime.deploy_plan import DeployPlan
from edge_infer.runtime.messages import StageMetrics
from edge_infer.runtime.orchestrator import PipelineHealth
from edge_infer.tts.timing import SpeechTiming

_LATENCY_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
KNOWN_PATHS = ("/v1/audio/speech", "/v1/audio/voices", "/v1/models", "/health", "/metrics")


class SpeechMetrics:
    def __init__(self, plan: DeployPlan, stage_names: dict[int, str]):
        self.registry = r = CollectorRegistry()
        self.stage_names = stage_names
        self.requests = Counter("edge_infer_requests", "HTTP requests by path and status code", ["path", "status"], registry=r)
        self.ttfp = Histogram("edge_infer_tts_time_to_first_packet_seconds", "from submission to the first audio chunk",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.rtf = Histogram("edge_infer_tts_real_time_factor", "wall time to the last audio chunk / audio duration",
                             buckets=_RTF_BUCKETS, registry=r)
        self.e2e = Histogram("edge_infer_tts_request_latency_seconds", "from submission to the end", buckets=_LATENCY_BUCKETS, registry=r)
        self.audio_seconds = Counter("edge_infer_tts_audio_seconds", "seconds of audio produced", registry=r)
        self.frames = Counter("edge_infer_tts_frames", "codec frames produced by the Talker", registry=r)
        self.stage_time = Histogram("edge_infer_tts_stage_time_seconds", "a stage's time on a request (first input to last output)",
                                    ["stage"], buckets=_LATENCY_BUCKETS, registry=r)
        self.stage_wait = Histogram("edge_infer_tts_stage_queue_wait_seconds", "from sending a request's first input to the stage reading it",
                                    ["stage"], buckets=_LATENCY_BUCKETS, registry=r)
        self.finished = Counter("edge_infer_request_finish", "ended requests by outcome", ["reason"], registry=r)
        self.rejected = Counter("edge_infer_admission_rejections", "requests refused with 429: admission queue full", registry=r)
        self.in_flight = Gauge("edge_infer_requests_in_flight", "speech requests admitted and not yet ended", registry=r)
        self.stage_up = Gauge("edge_infer_stage_up", "1 while the stage's worker runs", ["stage"], registry=r)
        self.reserved = Gauge("edge_infer_memory_reserved_bytes", "each stage's reservation in the shared-RAM ledger", ["stage"], registry=r)
        self.rss_anon = Gauge("edge_infer_memory_rss_anon_bytes", "RssAnon measured over the server's process tree", registry=r)
        for stage in plan.stages:
            self.reserved.labels(self.stage_names[stage.stage_id]).set(stage.reservation.total_bytes)

    def count_request(self, path: str, status: int) -> None:
        self.requests.labels(path if path in KNOWN_PATHS else "other", str(status)).inc()

    def observe(self, timing: SpeechTiming, outcome: str, stages: dict[int, StageMetrics], frames: int) -> None:
        self.finished.labels(outcome).inc()
        self.e2e.observe(timing.elapsed_s)
        self.frames.inc(frames)
        if timing.ttfp_s is not None:
            self.ttfp.observe(timing.ttfp_s)
            self.audio_seconds.inc(timing.duration_s)
        if outcome == "finished" and timing.rtf is not None:
            self.rtf.observe(timing.rtf)
        for sid, stage in stages.items():
            name = self.stage_names.get(sid, str(sid))
            self.stage_time.labels(name).observe(stage.time_in_stage_s)
            self.stage_wait.labels(name).observe(stage.queue_wait_s)

    def render(self, health: PipelineHealth | None, in_flight: int) -> bytes:
        self.in_flight.set(in_flight)
        for stage in health.stages if health is not None else ():
            self.stage_up.labels(self.stage_names.get(stage.stage_id, str(stage.stage_id))).set(1 if stage.state == "running" else 0)
        self.rss_anon.set(tree_rss_anon_bytes(os.getpid()))
        return generate_latest(self.registry)
