"""Measuring memory must not change what is measured."""
from __future__ import annotations

import subprocess

from edge_infer.memory import measure


def test_malloc_trim_starts_no_process(monkeypatch):
    """The loader trims after every tensor: a fork of the loading process would count its weights twice."""
    measure._malloc_trim_function.cache_clear()

    def no_process(*args, **kwargs):
        raise AssertionError(f"malloc_trim started a process: {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    for _ in range(3):
        assert measure.malloc_trim() >= 0



def test_the_sampler_finds_the_tree_rarely_and_counts_a_child_started_after_it(monkeypatch):
    """Finding the process tree scans all of /proc: doing it at every 10 ms sample would slow the engine being
    measured. A child started later (an engine worker) is still counted by the next scan or mark."""
    import sys
    import time

    scans = []
    real_tree_pids = measure.tree_pids
    monkeypatch.setattr(measure, "tree_pids", lambda pid=None: scans.append(pid) or real_tree_pids(pid))
    sampler = measure.PeakSampler(interval_s=0.01, rescan_s=10.0).start()
    before = sampler.mark("before")
    child = subprocess.Popen([sys.executable, "-c", "import sys; b = bytearray(96 << 20); sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while measure.rss_anon_bytes(child.pid) < (90 << 20):
            assert time.monotonic() < deadline, "the child did not allocate"
            time.sleep(0.05)
        time.sleep(0.2)  # 20 samples
        assert len(scans) == 2  # start and the first mark: samples reuse the tree
        after = sampler.mark("after")
        assert sampler.max_procs == 2 and after.rss_anon_bytes - before.rss_anon_bytes >= (90 << 20)
    finally:
        child.communicate(b"")
        sampler.stop()
