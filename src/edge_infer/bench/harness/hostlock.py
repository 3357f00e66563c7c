"""One benchmark at a time on a host: an exclusive `flock` on a lock file.

The kernel releases a `flock` when its holder exits, however it exits, so a
crashed benchmark never leaves a stale lock behind. The holder writes its
pid, command line and start time into the file so that a refused run can
say who is in the way.
"""
from __future__ import annotations

import fcntl
import json
import os
import sys
import tempfile
from pathlib import Path

from edge_infer.bench.harness.provenance import now_utc

LOCK_ENV = "EDGE_INFER_BENCH_LOCK"


def default_lock_path() -> Path:
    return Path(os.environ.get(LOCK_ENV) or Path(tempfile.gettempdir()) / "edge-infer-bench.lock")


class LockHeld(RuntimeError):
    pass


def describe_holder(path: Path) -> str:
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        holder = {}
    if "pid" not in holder:
        return "an unknown process (it has not written its pid yet)"
    command = " ".join(holder.get("argv", []))
    return f"pid {holder['pid']} (`{command}`, since {holder.get('since', '?')})"


class HostLock:
    def __init__(self, path: Path, wait: bool = False) -> None:
        self.path = path
        self.wait = wait
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            writable = True
        except PermissionError:
            # Created by another user: locking works on a read-only descriptor too.
            fd = os.open(self.path, os.O_RDONLY)
            writable = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = describe_holder(self.path)
            if not self.wait:
                os.close(fd)
                raise LockHeld(
                    f"another benchmark holds the host lock {self.path}: {holder}. "
                    "Two benchmarks must not share cores: wait for it to finish, pass --wait-lock "
                    "to queue behind it, or --no-lock only if it runs on other cores."
                ) from None
            print(f"waiting for the host lock {self.path}, held by {holder}", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        self._fd = fd
        if writable:
            record = json.dumps({"pid": os.getpid(), "argv": sys.argv, "since": now_utc()})
            os.ftruncate(fd, 0)
            os.pwrite(fd, record.encode(), 0)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass  # read-only descriptor: the next holder overwrites the record
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "HostLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
