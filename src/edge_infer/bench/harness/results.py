"""The records a grid run produces, and the JSON file that holds them.

`grid` writes a `GridResult`; `report` and `--check` read one back. Keeping
the schema in one place means a result file written today is validated the
same way when a later report or gate reads it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from edge_infer.bench.harness.provenance import Provenance

RESULT_KIND = "edge-infer.bench.grid"

Direction = Literal["max", "min"]
PassStatus = Literal["ok", "failed", "timeout", "error"]
CheckStatus = Literal["ok", "REGRESSION", "IMPROVED", "REPORTED", "MISSING", "NO_DIRECTION"]
# Check outcomes that make `grid --check` exit non-zero.
FAILING_CHECKS: frozenset[str] = frozenset({"REGRESSION", "MISSING", "NO_DIRECTION"})


class Arm(BaseModel):
    """One process to measure: a list runs directly, a string runs through /bin/sh -c."""

    tag: str
    command: list[str] | str
    env: dict[str, str] = Field(default_factory=dict)


class Observation(BaseModel):
    """One pass of one arm, kept whatever happened to it."""

    arm: str
    pass_index: int  # 1-based
    position: int  # 1-based place of this arm in its pass's order
    status: PassStatus
    exit_code: int | None
    under_load: bool
    started_at: str
    wall_s: float
    metrics: dict[str, float] = Field(default_factory=dict)  # empty unless status == "ok"
    output: dict[str, Any] | None = None  # the last JSON object the arm printed
    error: str | None = None
    stderr_tail: str = ""
    notes: list[str] = Field(default_factory=list)


class MetricSummary(BaseModel):
    """Median, best and spread of one metric of one arm over its successful passes."""

    arm: str
    metric: str
    direction: Direction | None
    n: int
    n_under_load: int
    values: list[float]
    median: float | None
    best: float | None  # None when n == 0 or the direction is unknown
    min: float | None
    max: float | None
    spread_pct: float | None  # (max - min) / |median| * 100; None when n == 0 or median == 0 < max - min


class ArmStatus(BaseModel):
    tag: str
    passes_ok: int
    passes_failed: int
    passes_under_load: int


class Flag(BaseModel):
    kind: str  # NOISY, SINGLE_PASS, NO_RESULT, FAILED_PASSES, UNDER_LOAD, NOT_A_RANKING, ...
    message: str
    arm: str | None = None
    metric: str | None = None


class CheckRow(BaseModel):
    arm: str
    metric: str
    expected: float
    band_pct: float
    median: float | None
    delta_pct: float | None  # (median - expected) / |expected| * 100
    spread_pct: float | None
    gated: bool
    status: CheckStatus


class LoadSample(BaseModel):
    """Utilisation of the target cores measured while no arm was running."""

    when: str  # "preflight" or "before pass N"
    per_core_pct: dict[int, float]
    stolen_pct: float  # mean busy share of the target cores
    busy: bool
    reason: str | None = None


class GridProvenance(Provenance):
    arms: list[Arm]  # each arm's command and environment, as run


class GridSettings(BaseModel):
    spec_path: str
    spec_sha256: str
    passes: int
    cores: list[int]
    headline_metric: str | None
    keys: list[str]
    directions: dict[str, Direction]  # explicit --direction overrides
    noise_threshold_pct: float
    max_stolen_pct: float
    max_core_busy_pct: float
    preflight_window_s: float
    allow_busy: bool
    lock: str | None  # lock file path, None with --no-lock
    settle_s: float
    timeout_s: float


class GridResult(BaseModel):
    kind: Literal["edge-infer.bench.grid"] = RESULT_KIND
    version: int = 1
    settings: GridSettings
    observations: list[Observation]
    arms: list[ArmStatus]
    summary: list[MetricSummary]
    ranking: str | None
    flags: list[Flag]
    checks: list[CheckRow]
    load: list[LoadSample]
    provenance: GridProvenance

    def row(self, arm: str, metric: str) -> MetricSummary | None:
        return next((r for r in self.summary if r.arm == arm and r.metric == metric), None)

    def metrics(self) -> list[str]:
        return list(dict.fromkeys(r.metric for r in self.summary))


class ResultFileError(ValueError):
    pass


def load_result(path: Path) -> GridResult:
    try:
        return GridResult.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise ResultFileError(f"cannot read result file {path}: {exc.strerror}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ResultFileError(
            f"{path} is not an `edge-infer bench grid` result ({where}: {first['msg']}); "
            "pass a file written by `edge-infer bench grid --out`"
        ) from exc


def save_result(result: GridResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(result.model_dump_json(indent=2) + "\n")
