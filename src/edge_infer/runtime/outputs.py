"""What a caller receives: output events (carried by engine.streams.RequestStream, unbounded)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from edge_infer.runtime.contracts import Payload, to_wire
from edge_infer.runtime.messages import StageMetrics

EventKind = Literal["output", "finished", "aborted", "error"]


@dataclass
class OmniOutput:
    """One event of a request.

    ``kind == "output"``: a chunk from a final-output stage (``payload`` may be
    None on the event that only says the stage finished). The stream then
    ends with exactly one ``finished``, ``aborted`` or ``error`` event.
    ``metrics`` holds, per stage id, what that stage reported so far.
    """

    request_id: str
    kind: EventKind
    stage_id: int | None = None
    payload: Payload | None = None
    finished: bool = False
    metrics: dict[int, StageMetrics] = field(default_factory=dict)
    error: str | None = None

    @property
    def terminal(self) -> bool:
        return self.kind != "output"

    @property
    def contract(self) -> str | None:
        return self.payload.contract if self.payload is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "kind": self.kind,
            "stage_id": self.stage_id,
            "contract": self.contract,
            "payload": to_wire(self.payload) if self.payload is not None else None,
            "finished": self.finished,
            "metrics": {str(k): v.to_dict() for k, v in self.metrics.items()},
            "error": self.error,
        }


@dataclass
class OmniRequestOutput:
    """A request's events, collected (``Omni.generate``)."""

    request_id: str
    status: Literal["finished", "aborted", "error"]
    outputs: list[OmniOutput]
    metrics: dict[int, StageMetrics]
    error: str | None = None

    def payloads(self, stage_id: int) -> list[Payload]:
        return [o.payload for o in self.outputs if o.stage_id == stage_id and o.payload is not None]

    def joined(self, stage_id: int) -> np.ndarray | str:
        """A stage's chunks concatenated (text joined)."""
        chunks = self.payloads(stage_id)
        if chunks and isinstance(chunks[0].data, str):
            return "".join(str(c.data) for c in chunks)
        return np.concatenate([c.data for c in chunks]) if chunks else np.zeros(0)
