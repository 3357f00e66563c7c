"""The thinker worker's block cache (quant/csrc/block_cache.cpp) as PyTorch's CPU allocator, in a fresh process
(it replaces the allocator for the rest of the process): freed large blocks are handed out again by size, the
cached bytes stay within the live high-water mark or the budget, small tensors are left to glibc, release gives
everything cached back, and tensors computed through it are right."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edge_infer.quant.native_build import missing_toolchain

pytestmark = pytest.mark.skipif(missing_toolchain() is not None, reason=str(missing_toolchain()))

PROBE = r"""
import json, torch
from edge_infer.memory.measure import RELEASE_HOOKS, malloc_trim, pin_mmap_threshold, rss_anon_bytes
from edge_infer.quant import native

MiB = 1 << 20
BUDGET = 8 * MiB
pin_mmap_threshold()
assert native.cache_large_blocks(256 << 10, BUDGET)
RELEASE_HOOKS.append(native.release_cached_blocks)  # as a thinker's worker does

def stats():
    return dict(zip(["live", "cached", "high", "reused", "mapped"], torch.ops.edge_infer.block_cache_stats()))

out = {}
# a layer's pattern four times: two sizes, mapped once, then handed out again
for _ in range(4):
    a = torch.empty(4 * MiB, dtype=torch.uint8).fill_(1)
    b = torch.empty(2 * MiB, dtype=torch.uint8).fill_(2)
    del a, b
out["repeat"] = stats()
small = torch.empty(1000)  # under 256 KiB: glibc's, not counted
out["small"] = stats()
# sizes never seen before, a few alive at once: every allocation must keep live + cached within
# max(high-water, live + budget)
held, worst = [], 0
for i in range(1, 25):
    held.append(torch.empty(i * MiB + 4096 * i, dtype=torch.uint8).fill_(i))
    s = stats()
    worst = max(worst, s["live"] + s["cached"] - max(s["high"], s["live"] + BUDGET))
    if len(held) > 3:
        held.pop(0)
out["worst_excess"] = worst
del held
# computing through reused blocks gives the same numbers as a fresh process would
g = torch.Generator().manual_seed(0)
x, w = torch.randn(512, 256, generator=g), torch.randn(1024, 256, generator=g)
out["matmul"] = [float((x @ w.T).double().sum()) for _ in range(3)]
out["before_release"] = stats()
rss = rss_anon_bytes()
out["released"] = malloc_trim()
out["rss_drop"] = rss - rss_anon_bytes()
out["after_release"] = stats()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_a_repeated_pattern_of_sizes_is_mapped_once(probe):
    repeat = probe["repeat"]
    assert repeat["mapped"] == 2 and repeat["reused"] == 6
    assert repeat["live"] == 0 and repeat["cached"] == 6 << 20 == repeat["high"]
    assert probe["small"]["live"] == 0 and probe["small"]["mapped"] == 2


def test_the_cached_bytes_stay_within_the_high_water_mark_or_the_budget(probe):
    assert probe["worst_excess"] <= 0


def test_tensors_through_reused_blocks_compute_alike(probe):
    first, *again = probe["matmul"]
    assert all(v == first for v in again)


def test_release_gives_the_cached_blocks_back(probe):
    before, after = probe["before_release"], probe["after_release"]
    assert before["cached"] > 0 and after["cached"] == 0 and after["high"] == after["live"]
    assert probe["rss_drop"] >= 0.9 * before["cached"], probe
