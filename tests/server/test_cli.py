"""``edge-infer serve`` as a command: the plan comes first, the ready banner tells how to call it."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_a_plan_that_does_not_fit_is_printed_and_refused_before_loading(served_model):
    cmd = [sys.executable, "-m", "edge_infer.cli", "serve", str(served_model), "--kv-cache-memory-bytes", "1000"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "REFUSED" in out.stderr and "kv cache" in out.stderr and "levers" in out.stderr
    assert "is serving" not in out.stderr + out.stdout


def test_ready_banner_prints_the_url_and_a_curl_example(server):
    output = server.output()
    assert f"{server.base_url}/v1" in output
    assert f"curl {server.base_url}/v1/chat/completions" in output
    assert "memory plan:" in output
