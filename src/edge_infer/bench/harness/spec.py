"""The grid spec file: which arms to run, optionally on which cores and metric.

    {"arms": [{"tag": "eager", "command": ["python", "bench.py"], "env": {"OMP_NUM_THREADS": "2"}},
              {"tag": "compiled", "command": "python bench.py --compile"}],
     "cores": "0-1", "metric": "tg_tps", "directions": {"mean_kl": "min"}}

``directions`` names the better direction of metrics whose names do not
say it; ``--direction`` on the command line still wins.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from edge_infer.bench.harness.results import Arm


class SpecError(ValueError):
    pass


class _ArmIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tag: str
    command: list[str] | str
    env: dict[str, str | int | float] = {}

    @field_validator("tag")
    @classmethod
    def _tag(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("an arm's tag must not be empty")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | str) -> list[str] | str:
        if not v or (isinstance(v, str) and not v.strip()):
            raise ValueError("an arm's command must not be empty")
        return v


class _SpecIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    arms: list[_ArmIn]
    cores: str | list[int] | None = None  # "0-1,4" or [0, 1, 4]
    metric: str | None = None
    directions: dict[str, Literal["max", "min"]] = {}


@dataclass(frozen=True)
class GridSpec:
    arms: list[Arm]
    cores: str | None
    metric: str | None
    sha256: str
    directions: dict[str, str] = field(default_factory=dict)


def load_spec(path: Path) -> GridSpec:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read spec {path}: {exc.strerror}") from exc
    try:
        parsed = _SpecIn.model_validate(json.loads(raw))
    except ValueError as exc:  # JSONDecodeError and ValidationError are both ValueErrors
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "top level"
            detail = f"{where}: {first['msg']}"
        else:
            detail = str(exc)
        raise SpecError(
            f"spec {path} is invalid ({detail}); expected "
            '{"arms": [{"tag": ..., "command": [...] or "...", "env": {...}}], "cores": ..., "metric": ..., "directions": {metric: "max" | "min"}}'
        ) from None
    if not parsed.arms:
        raise SpecError(f"spec {path} has no arms; add at least one under \"arms\"")
    tags = [a.tag for a in parsed.arms]
    duplicates = sorted({t for t in tags if tags.count(t) > 1})
    if duplicates:
        raise SpecError(f"spec {path}: arm tags must be unique, repeated: {', '.join(duplicates)}")
    arms = [Arm(tag=a.tag, command=a.command, env={k: str(v) for k, v in a.env.items()}) for a in parsed.arms]
    cores = ",".join(map(str, parsed.cores)) if isinstance(parsed.cores, list) else parsed.cores
    return GridSpec(arms=arms, cores=cores or None, metric=parsed.metric, sha256=hashlib.sha256(raw).hexdigest(),
                    directions=dict(parsed.directions))
