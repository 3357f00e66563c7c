"""Building edge-infer's library: a build that fails is refused by name, and not run again by the same process
(cpu_int4 asks for the library once per linear and falls back to PyTorch operators without it)."""
from __future__ import annotations

import subprocess

import pytest

from edge_infer.errors import KernelUnavailableError
from edge_infer.quant import native_build


def test_a_failed_build_is_refused_by_name_and_not_run_again(monkeypatch, tmp_path):
    runs = []

    def failing(cmd, **kwargs):
        runs.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "c++: fatal error: no input files")

    monkeypatch.setattr(native_build, "_failed_build", None)
    monkeypatch.setattr(native_build.subprocess, "run", failing)
    for _ in range(3):
        with pytest.raises(KernelUnavailableError, match="(?s)building edge-infer's int8 kernels failed.*no input files"):
            native_build.build(tmp_path / "libedge_infer.so")
    assert len(runs) == 1
