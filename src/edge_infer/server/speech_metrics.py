"""Prometheus metrics of a speech model, in the server's shared registry (``metrics.SharedMetrics``).

Per request: time to first audio packet (TTFP), real-time factor (wall
time to the last chunk / audio duration), end-to-end latency, audio
produced, and each stage's time on it (``time_in_stage_s``, from its first
input to its last output) and queue wait. At scrape time: each stage's
reservation from the deploy plan and whether its worker is up.
"""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from edge_infer.runtime.deploy_plan import DeployPlan
from edge_infer.runtime.messages import StageMetrics
from edge_infer.runtime.orchestrator import PipelineHealth
from edge_infer.server.metrics import SharedMetrics
from edge_infer.tts.timing import SpeechTiming

_LATENCY_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
SPEECH_PATHS = ("/v1/audio/speech", "/v1/audio/voices")


class SpeechMetrics:
    def __init__(self, shared: SharedMetrics, plan: DeployPlan, stage_names: dict[int, str]):
        self.shared = shared
        shared.paths.update(SPEECH_PATHS)
        r = shared.registry
        self.finished, self.rejected = shared.finished, shared.rejected
        self.stage_names = stage_names
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
        self.in_flight = Gauge("edge_infer_requests_in_flight", "speech requests admitted and not yet ended", registry=r)
        self.stage_up = Gauge("edge_infer_stage_up", "1 while the stage's worker runs", ["stage"], registry=r)
        self.stage_restarts = Counter("edge_infer_stage_restarts", "stage workers replaced after dying", ["stage"], registry=r)
        self.reserved = Gauge("edge_infer_memory_reserved_bytes", "each stage's reservation in the shared-RAM ledger", ["stage"], registry=r)
        for stage in plan.stages:
            self.reserved.labels(self.stage_names[stage.stage_id]).set(stage.reservation.total_bytes)

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

    def refresh(self, health: PipelineHealth | None, in_flight: int) -> None:
        self.in_flight.set(in_flight)
        for stage in health.stages if health is not None else ():
            self.stage_up.labels(self.stage_names.get(stage.stage_id, str(stage.stage_id))).set(1 if stage.state == "running" else 0)
