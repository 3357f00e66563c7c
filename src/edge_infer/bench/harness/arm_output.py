"""How a single-run bench command reports: one JSON line, a file, provenance.

`init-memory`, `pp-tg` and `llamacpp pp-tg` are grid arms: the grid reads
the last line of stdout that starts with '{' and takes its top-level
numbers as metrics. So every top-level number a command prints must have a
direction the harness can read from its name (`*_tps`, `*_mb`, `*_s`);
counts, settings and verification figures go into nested objects.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from edge_infer.bench.harness import provenance

MiB = 1 << 20


def mib(n_bytes: int | float) -> float:
    """Bytes as MiB: the unit of every `*_mb` figure the bench commands print."""
    return round(n_bytes / MiB, 3)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stamp(started_at: str) -> dict[str, Any]:
    """Provenance of this process, collected after measuring (git and package
    metadata lookups would otherwise run inside the measured window)."""
    p = provenance.collect(sorted(os.sched_getaffinity(0)))
    p.started_at = started_at
    p.finished_at = provenance.now_utc()
    return p.model_dump()


def model_fingerprint(path: str | Path) -> dict[str, Any]:
    """SHA-256 of a model file, or of every file in a checkpoint directory.

    Part of provenance: the figure belongs to these exact bytes. Computed
    after measuring; it reads every weight once.
    """
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    digests: dict[str, str] = {}
    total = 0
    for f in files:
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
        digests[str(f.relative_to(path)) if path.is_dir() else f.name] = h.hexdigest()
        total += f.stat().st_size
    return {"path": str(path.resolve()), "total_bytes": total, "sha256": digests}


def emit(result: dict[str, Any], out: Path | None) -> None:
    """Print the result as one JSON line (what a grid arm reads) and write it to `out`."""
    print(json.dumps(result), flush=True)
    if out is not None:
        write_json_atomic(out, result)


def run_arm(command: str, measure: Callable[[], dict[str, Any]], tag: str | None, started_at: str,
            out: Path | None) -> int:
    """One arm: ``measure()``, then its JSON line with the tag, the model's fingerprint and provenance.

    The exit status is 1 when the measure fails (the error on stderr, no line) or when the engine did not load
    what its plan promised (``settings_mismatches``, named on stderr; the line is printed), else 0."""
    try:
        result = measure()
    except (ValueError, RuntimeError, ImportError, OSError) as exc:
        print(f"edge-infer bench {command}: error: {exc}", file=sys.stderr)
        return 1
    result["tag"] = tag
    result["model_fingerprint"] = model_fingerprint(result["model"])
    result["provenance"] = stamp(started_at)
    emit(result, out)
    if result.get("settings_mismatches"):
        print(f"edge-infer bench {command}: the engine did not load what the plan promised: "
              + "; ".join(result["settings_mismatches"]), file=sys.stderr)
        return 1
    return 0
