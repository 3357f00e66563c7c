"""The machine's read bandwidth, the denominator of decode's bandwidth use."""
from __future__ import annotations

import torch

from edge_infer.bench.harness.bandwidth import machine_read_bytes_per_s


def test_read_bandwidth_is_a_finite_rate_and_leaves_torchs_threads_as_they_were():
    before = torch.get_num_threads()
    rate = machine_read_bytes_per_s(threads=1, buffer_bytes=64 << 20, passes=2)
    assert 1e8 < rate < 1e13  # between 0.1 GB/s and 10 TB/s: a rate, not a unit slip
    assert torch.get_num_threads() == before
