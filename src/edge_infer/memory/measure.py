"""Measured memory: RssAnon of a process tree, a peak sampler, malloc_trim.

Budgets are compared with ``RssAnon`` (allocated memory), never ``VmRSS``,
which also counts file pages of memory-mapped checkpoints that come and go
with the page cache. The engine may live in a worker process, so figures are
summed over the whole process tree. There is no kernel high-water mark for
``RssAnon``: the sampler polls, and its peak is a lower bound.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable


def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def rss_anon_bytes(pid: int | None = None) -> int:
    return _status_kb(pid or os.getpid(), "RssAnon:") * 1024


def rss_file_bytes(pid: int | None = None) -> int:
    return _status_kb(pid or os.getpid(), "RssFile:") * 1024


def tree_pids(pid: int | None = None) -> list[int]:
    """``pid`` and all its live descendants."""
    import psutil

    root = pid or os.getpid()
    try:
        return [root] + [c.pid for c in psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss_anon_bytes(pid: int | None = None) -> int:
    return sum(rss_anon_bytes(p) for p in tree_pids(pid))


def tree_rss_file_bytes(pid: int | None = None) -> int:
    return sum(rss_file_bytes(p) for p in tree_pids(pid))


@dataclass
class PhaseMark:
    phase: str
    t_s: float
    rss_anon_bytes: int
    peak_so_far_bytes: int


@dataclass
class PeakSampler:
    """Background thread polling the tree's RssAnon; ``mark()`` records phases.

    The tree's processes are looked up every ``rescan_s`` (and at every mark), not at every sample: finding
    them scans all of /proc (1.6 ms in Python, 25x reading two status files), and a sampler that took 8% of
    a core every 20 ms slowed the 2-thread engine it measured (a Qwen2.5-Omni-3B image encode: 6.5 s beside
    it, 5.3 s beside one that sampled once a second)."""

    pid: int | None = None
    interval_s: float = 0.02
    rescan_s: float = 0.5
    peak_bytes: int = 0
    max_procs: int = 0
    marks: list[PhaseMark] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _t0: float = field(default_factory=time.monotonic, repr=False)
    _pids: list[int] = field(default_factory=list, repr=False)
    _scanned_at: float = field(default=float("-inf"), repr=False)

    def _sample(self, rescan: bool = False) -> int:
        now = time.monotonic()
        if rescan or now - self._scanned_at >= self.rescan_s:
            self._pids, self._scanned_at = tree_pids(self.pid), now
        pids = self._pids
        self.max_procs = max(self.max_procs, len(pids))
        value = sum(rss_anon_bytes(p) for p in pids)
        self.peak_bytes = max(self.peak_bytes, value)
        return value

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> "PeakSampler":
        self._sample(rescan=True)
        self._thread = threading.Thread(target=self._run, name="rss-anon-sampler", daemon=True)
        self._thread.start()
        return self

    def mark(self, phase: str) -> PhaseMark:
        value = self._sample(rescan=True)
        m = PhaseMark(phase, round(time.monotonic() - self._t0, 4), value, self.peak_bytes)
        self.marks.append(m)
        return m

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample(rescan=True)


@functools.lru_cache(maxsize=1)
def _malloc_trim_function() -> Any:
    """glibc's malloc_trim from the libraries this process already has loaded, or None (musl, macOS).

    Not ctypes.util.find_library: it runs ``ldconfig`` in a subprocess, and the loader trims after every
    tensor; a fork of a process holding the weights counts them twice in the tree's RssAnon until exec.
    """
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


# Caches of freed blocks held outside glibc's heap, released with it (a thinker's worker adds its block cache:
# engine/worker.py, quant/native.cache_large_blocks).
RELEASE_HOOKS: list[Callable[[], object]] = []


def malloc_trim() -> int:
    """Return freed heap arenas (and the blocks RELEASE_HOOKS cache) to the OS; the RssAnon bytes released
    (0 if unavailable)."""
    trim = _malloc_trim_function()
    if trim is None and not RELEASE_HOOKS:
        return 0
    before = rss_anon_bytes()
    for release in RELEASE_HOOKS:
        release()
    if trim is not None:
        trim(0)
    return max(0, before - rss_anon_bytes())



# glibc's mallopt parameter for the size from which blocks are mapped on their own.
_M_MMAP_THRESHOLD = -3
# Blocks of this size or more are mapped directly once pin_mmap_threshold has run.
MMAP_THRESHOLD = 256 << 10


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Serve every allocation of ``threshold`` bytes or more from its own mapping, returned to the OS when
    freed, for the rest of this process; False where there is no glibc (nothing changes).

    Call it before anything large is allocated. By default glibc raises its mmap threshold to the largest
    block freed so far (up to 32 MiB) and serves smaller blocks from the heap, where freed blocks stay
    resident and are handed out again in other sizes. A media encode allocates and frees tensors of many
    sizes, a few MiB each at the released shapes: at the Qwen2.5-Omni-3B ViT shape its RssAnon grew 1.0x to
    3.1x its live tensors depending on the image size (3.1x at 256 patches, 2.3x at 1024, 1.0x at 16384,
    where every tensor is above 32 MiB), and stayed there after the encode. With the threshold pinned from
    the start it grows by its live tensors plus a fixed part (1.02-1.10x at 1024-9216 patches), which the
    plan sizes, and gives them back when it ends. Setting it pins glibc's trim threshold too. A thinker's
    engine worker calls it before loading (engine/worker.py), with PyTorch's large blocks reused by size
    (quant/native.cache_large_blocks) so that they are not faulted in afresh each time; text engines keep
    glibc's default.
    """
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    return bool(mallopt is not None and mallopt(_M_MMAP_THRESHOLD, threshold))
