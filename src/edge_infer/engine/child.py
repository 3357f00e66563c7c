"""Child processes: the engine core's worker and each omni stage run in one.

A child is a fresh interpreter, ``python -m edge_infer.engine.child
module:function fd...``, that calls ``function(fd...)`` with the pipe ends it
inherits. It gets the parent's module search path as PYTHONPATH (edge_infer's
root first), so what the parent imports (an executor's ``module:Class``) it
imports too; unlike ``multiprocessing``'s spawn it never re-imports the
parent's ``__main__``, so scripts need no ``if __name__ == "__main__":``
guard. It ignores SIGINT (Ctrl-C reaches the whole process group; when a child
stops is its parent's decision). The parent holds a pidfd of the child,
readable the moment it exits.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class Child:
    """A running child: ``target`` ("module:function") called with ``fds``, which it inherits."""

    def __init__(self, target: str, fds: Sequence[int]):
        path = dict.fromkeys([_PACKAGE_ROOT, *(os.path.abspath(p) for p in sys.path)])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []  # nothing in front of that path
        argv = [sys.executable, *safe_path, "-m", __name__, target, *map(str, fds)]
        self.popen = subprocess.Popen(argv, pass_fds=tuple(fds), env=env)
        self.pid = self.popen.pid
        self.pidfd: int | None = os.pidfd_open(self.pid)

    @property
    def exitcode(self) -> int | None:
        """None while it runs; negative: the signal that killed it."""
        return self.popen.poll()

    def describe_exit(self) -> str:
        code = self.exitcode
        if code is None:
            return "is still running"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def wait(self, timeout_s: float | None = None) -> bool:
        """Reap it; False if it still runs after ``timeout_s``."""
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()

    def close(self) -> None:
        """Release the pidfd (the process is left as it is)."""
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import importlib

    module, _, function = sys.argv[1].partition(":")
    getattr(importlib.import_module(module), function)(*map(int, sys.argv[2:]))
