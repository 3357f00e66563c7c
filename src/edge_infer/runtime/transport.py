"""Payload transport between stage processes.

Small payloads travel inline (pickled through the worker's pipe). A tensor
above the connector's ``inline_threshold_bytes`` is written to a
``multiprocessing.shared_memory`` segment; the consumer copies it out and
acknowledges, and only then does the producer close and unlink the segment.
A producer holds at most ``max_unacked`` payloads unacknowledged (inline ones
included) and stops stepping until some are released: back-pressure, never
dropping.

Segment names start with a per-pipeline prefix (``ei<pid>x<token>_``) and a
per-worker part (``s<stage>g<generation>_``), so the orchestrator can sweep
what a killed worker left behind, and a new pipeline can sweep what a killed
orchestrator left behind (its pid is in the name).

Python before 3.13 registers every create *and attach* with the
multiprocessing resource tracker, which then unlinks a consumer's "leaked"
segment at exit and complains about double unlinks. Ownership here is
explicit (ack-driven release plus prefix sweeps), so segments are kept out of
the tracker: ``track=False`` on 3.13+, registration suppressed before that.
"""
from __future__ import annotations

import os
import re
import secrets
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from edge_infer.runtime.contracts import Payload

SHM_DIR = Path("/dev/shm")
_PREFIX_RE = re.compile(r"^ei(\d+)x[0-9a-f]+_")


class TransportError(RuntimeError):
    pass


def new_pipeline_prefix() -> str:
    return f"ei{os.getpid()}x{secrets.token_hex(3)}_"


def worker_prefix(pipeline_prefix: str, stage_id: int, generation: int) -> str:
    return f"{pipeline_prefix}s{stage_id}g{generation}_"


_tracker_lock = threading.Lock()


@contextmanager
def _untracked() -> Iterator[None]:
    with _tracker_lock:
        register, unregister = resource_tracker.register, resource_tracker.unregister
        resource_tracker.register = resource_tracker.unregister = lambda *args, **kwargs: None  # type: ignore[assignment]
        try:
            yield
        finally:
            resource_tracker.register, resource_tracker.unregister = register, unregister


def _open(name: str, create: bool = False, size: int = 0) -> SharedMemory:
    if sys.version_info >= (3, 13):
        return SharedMemory(name, create=create, size=size, track=False)  # type: ignore[call-arg]
    with _untracked():
        return SharedMemory(name, create=create, size=size)


def _unlink(shm: SharedMemory) -> None:
    shm.close()
    try:
        if sys.version_info >= (3, 13):
            shm.unlink()
        else:
            with _untracked():
                shm.unlink()
    except FileNotFoundError:
        pass  # already swept


def unlink_segment(name: str) -> bool:
    """Unlink a segment by name (one whose producer is gone); False if it was not there."""
    try:
        shm = _open(name)
    except FileNotFoundError:
        return False
    _unlink(shm)
    return True


def list_segments(prefix: str) -> list[str]:
    if not SHM_DIR.is_dir():
        return []
    return sorted(p.name for p in SHM_DIR.iterdir() if p.name.startswith(prefix))


def sweep_segments(prefix: str, keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Unlink every segment whose name starts with ``prefix`` (except ``keep``)."""
    removed = []
    for name in list_segments(prefix):
        if name not in keep and unlink_segment(name):
            removed.append(name)
    return removed


def sweep_stale_pipelines() -> list[str]:
    """Segments of pipelines whose orchestrator process no longer exists."""
    removed = []
    for name in list_segments("ei"):
        match = _PREFIX_RE.match(name)
        if match and not _pid_alive(int(match.group(1))):
            if unlink_segment(name):
                removed.append(name)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class PayloadRef:
    """A payload in transit: the payload itself, or where to copy it from."""

    seq: int
    contract: str
    metadata: dict[str, Any]
    nbytes: int
    inline: Payload | None = None
    segment: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


def inline_ref(payload: Payload, seq: int = 0) -> PayloadRef:
    return PayloadRef(seq, payload.contract, payload.metadata, payload.nbytes, inline=payload)


def receive(ref: PayloadRef) -> Payload:
    """The consumer's copy of a payload; the caller acknowledges ``ref`` afterwards."""
    if ref.inline is not None:
        return ref.inline
    assert ref.segment is not None and ref.dtype is not None and ref.shape is not None
    try:
        shm = _open(ref.segment)
    except FileNotFoundError:
        raise TransportError(f"shared payload {ref.segment} is gone (its producer exited before it was read)") from None
    try:
        count = int(np.prod(ref.shape)) if ref.shape else 1
        view = np.frombuffer(shm.buf, dtype=np.dtype(ref.dtype), count=count)
        data = view.reshape(ref.shape).copy()
        del view  # the mapping cannot close while a view exports its buffer
    finally:
        shm.close()
    return Payload(ref.contract, data, dict(ref.metadata))


@dataclass
class OutboundBuffers:
    """The producer's side: exports payloads and holds them until released."""

    prefix: str
    inline_threshold_bytes: int
    max_unacked: int
    _seq: int = 0
    _unacked: set[int] = field(default_factory=set)
    _segments: dict[int, SharedMemory] = field(default_factory=dict)

    @property
    def can_send(self) -> bool:
        return len(self._unacked) < self.max_unacked

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    @property
    def segment_bytes(self) -> int:
        return sum(s.size for s in self._segments.values())

    def export(self, payload: Payload) -> PayloadRef:
        self._seq += 1
        seq = self._seq
        self._unacked.add(seq)
        data = payload.data
        if isinstance(data, str) or data.nbytes <= self.inline_threshold_bytes:
            return inline_ref(payload, seq)
        data = np.ascontiguousarray(data)
        name = f"{self.prefix}{seq}"
        shm = _open(name, create=True, size=data.nbytes)
        self._segments[seq] = shm  # recorded before writing: a kill mid-copy still leaves it known
        np.frombuffer(shm.buf, dtype=data.dtype, count=data.size)[:] = data.reshape(-1)
        return PayloadRef(seq, payload.contract, dict(payload.metadata), int(data.nbytes), segment=name, dtype=data.dtype.str, shape=tuple(data.shape))

    def release(self, seqs: list[int]) -> None:
        for seq in seqs:
            self._unacked.discard(seq)
            shm = self._segments.pop(seq, None)
            if shm is not None:
                _unlink(shm)

    def release_all(self) -> None:
        self.release(list(self._unacked | set(self._segments)))
