"""``edge-infer serve`` as a command: the plan comes first, the ready banner tells how to call it."""
from __future__ import annotations

import json
import re
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


@pytest.mark.parametrize("flags, says", [
    (["--max-body-bytes", "4096", "--max-body-bytes-in-flight", "2048"],
     "--max-body-bytes-in-flight must be at least --max-body-bytes"),
    (["--max-body-items", "100"], "--max-body-items must be at least 1024"),
    (["--body-timeout-s", "0"], "--header-timeout-s, --body-timeout-s and --send-timeout-s must be positive"),
    (["--send-timeout-s", "nan"], "--header-timeout-s, --body-timeout-s and --send-timeout-s must be positive"),
    (["--max-connections-per-client", "-1"], "--max-connections-per-client must not be negative"),
])
def test_body_limits_that_refuse_ordinary_requests_are_refused_before_loading(served_model, flags, says):
    cmd = [sys.executable, "-m", "edge_infer.cli", "serve", str(served_model), *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and says in out.stderr


def test_plan_with_server_is_the_plan_serve_admits(server, served_model):
    """`edge-infer plan --server` with the serve flags: the same steady bytes the server printed (its process and
    request bodies included), more than the library's plan."""
    flags = [str(served_model), "--max-num-seqs", "4", "--max-model-len", "512", "--dtype", "float32", "--num-threads", "1",
             "--json"]

    def steady_mib(*extra: str) -> tuple[str, set[str]]:
        out = subprocess.run([sys.executable, "-m", "edge_infer.cli", "plan", *flags, *extra], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        plan = json.loads(out.stdout)
        return f"{plan['steady_bytes'] / 2**20:,.1f}", {item["name"] for item in plan["items"]}

    served, served_items = steady_mib("--server")
    library, library_items = steady_mib()
    assert re.search(r"memory plan: steady ([\d,.]+) MiB", server.output()).group(1) == served
    assert served_items - library_items == {"request bodies"} and float(library.replace(",", "")) < float(served.replace(",", ""))


def test_ready_banner_prints_the_url_and_a_curl_example(server):
    output = server.output()
    assert f"{server.base_url}/v1" in output
    assert f"curl {server.base_url}/v1/chat/completions" in output
    assert "memory plan:" in output


def test_the_server_process_never_loads_torch(server):
    """torch lives in the engine worker; the server process is planned without it (memory/overhead.json's
    server_frontend_bytes, ~150 MiB less than with it), so answering a request must not load it there."""
    from pathlib import Path

    client = server.client()
    model = client.models.list().data[0].id
    assert client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2).choices
    assert "libtorch" not in Path(f"/proc/{server.proc.pid}/maps").read_text()


def test_plan_takes_serve_s_body_flags_by_their_whole_names(served_model):
    """A review found `plan --max-body-bytes N` read as --max-body-bytes-in-flight (argparse's abbreviations) and
    planned half the bodies serve then admitted (serve takes twice --max-body-bytes in flight)."""
    def plan(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "edge_infer.cli", "plan", str(served_model), "--max-model-len", "512",
                               "--server", "--json", *flags], capture_output=True, text=True, timeout=120)

    by_body = json.loads(plan("--max-body-bytes", str(64 << 20)).stdout)["steady_bytes"]
    by_flight = json.loads(plan("--max-body-bytes-in-flight", str(128 << 20)).stdout)["steady_bytes"]
    default = json.loads(plan().stdout)["steady_bytes"]
    assert by_body == by_flight > default
    short = plan("--max-body", "4096")
    assert short.returncode == 2 and "unrecognized arguments: --max-body" in short.stderr
