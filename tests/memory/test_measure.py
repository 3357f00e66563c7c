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

