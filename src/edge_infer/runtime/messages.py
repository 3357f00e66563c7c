"""Messages between the orchestrator and a stage process (pickled through a pipe)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edge_infer.runtime.transport import PayloadRef

# A worker is identified by its stage and its generation (replacements count up).
WorkerKey = tuple[int, int]


@dataclass
class StageMetrics:
    """What one stage did for one request, as seen by the stage process.

    ``queue_wait_s``: from the orchestrator sending the request's first input
    to the stage process reading it. ``time_in_stage_s``: from that read to
    the stage's latest output. Tokens count token ids and codec frames.
    """

    stage_id: int
    chunks_in: int = 0
    chunks_out: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    queue_wait_s: float = 0.0
    time_in_stage_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# orchestrator -> worker


@dataclass
class Open:
    request_id: str
    params: dict[str, Any]


@dataclass
class Input:
    request_id: str
    ref: PayloadRef
    producer: WorkerKey | None  # None: the prompt, nothing to acknowledge
    sent_at: float  # time.monotonic() in the orchestrator


@dataclass
class EndInput:
    request_id: str


@dataclass
class Abort:
    request_id: str


@dataclass
class Release:
    seqs: list[int]


@dataclass
class Shutdown:
    pass


# worker -> orchestrator


@dataclass
class Ready:
    pid: int


@dataclass
class StartFailed:
    error: str


@dataclass
class Output:
    request_id: str
    ref: PayloadRef | None
    finished: bool
    metrics: StageMetrics


@dataclass
class RequestFailed:
    request_id: str
    error: str
    metrics: StageMetrics


@dataclass
class Acked:
    refs: list[tuple[WorkerKey, int]] = field(default_factory=list)


@dataclass
class AbortDone:
    request_id: str


@dataclass
class Fatal:
    error: str


@dataclass
class Heartbeat:
    """Sent every HEARTBEAT_INTERVAL_S from a thread of the worker's own, whatever its steps take."""


HEARTBEAT_INTERVAL_S = 0.5
