"""The reliability report: one recorded outcome per behaviour, saved after each.

The report is rewritten atomically after every outcome, so a run that dies
half-way leaves its last complete snapshot (status `running`) rather than
nothing. `status` says whether the run finished (`completed`), could not
run its checks (`failed`), or was refused by the memory plan (`rejected`);
whether the engine behaved is `passed` — a completed run is not a pass.
"""
from __future__ import annotations

import contextlib
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Literal

from edge_infer.bench.harness.arm_output import write_json_atomic
from edge_infer.bench.harness.provenance import now_utc

OutcomeStatus = Literal["passed", "failed", "error", "skipped"]
REPORT_KIND = "edge-infer.bench.reliability"


@dataclass
class Outcome:
    name: str
    expected: str  # the promised behaviour, in words
    status: OutcomeStatus = "error"
    started_at: str = field(default_factory=now_utc)
    duration_s: float = 0.0
    timings: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why it failed, errored or was skipped

    def check(self, ok: bool, failure: str) -> bool:
        """Record a pass, or a failure with its reason."""
        self.status = "passed" if ok else "failed"
        self.error = None if ok else failure
        return ok


@dataclass
class ReliabilityReport:
    path: Path
    model: str
    settings: dict[str, Any]
    status: Literal["running", "completed", "failed", "rejected"] = "running"
    outcomes: list[Outcome] = field(default_factory=list)
    owned_processes_requiring_harness_cleanup: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    provenance: dict[str, Any] | None = None
    started_at: str = field(default_factory=now_utc)
    finished_at: str | None = None

    @property
    def passed(self) -> bool:
        return (
            self.status == "completed"
            and bool(self.outcomes)
            and all(o.status == "passed" for o in self.outcomes)
            and not self.owned_processes_requiring_harness_cleanup
        )

    def to_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for o in self.outcomes:
            counts[o.status] = counts.get(o.status, 0) + 1
        return {
            "kind": REPORT_KIND,
            "version": 1,
            "status": self.status,
            "passed": self.passed,
            "counts": counts,
            "model": self.model,
            "settings": self.settings,
            "outcomes": [asdict(o) for o in self.outcomes],
            "owned_processes_requiring_harness_cleanup": self.owned_processes_requiring_harness_cleanup,
            "notes": self.notes,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "provenance": self.provenance,
        }

    def save(self) -> None:
        write_json_atomic(self.path, self.to_dict())

    def skip(self, name: str, expected: str, reason: str) -> None:
        self.outcomes.append(Outcome(name, expected, status="skipped", error=reason))
        self.save()

    @contextlib.asynccontextmanager
    async def outcome(self, name: str, expected: str) -> AsyncIterator[Outcome]:
        """Run one check; an exception inside becomes an `error` outcome with its message."""
        o = Outcome(name, expected)
        t0 = time.perf_counter()
        try:
            yield o
        except Exception as exc:  # every failure mode of a check is a recorded outcome
            o.status = "error"
            o.error = f"{type(exc).__name__}: {exc}"
            o.evidence["traceback_tail"] = traceback.format_exc()[-1500:]
        finally:
            o.duration_s = round(time.perf_counter() - t0, 4)
            self.outcomes.append(o)
            self.save()
