"""Packed weights loaded onto 2 MiB pages: advised, aligned, zero-filled, no bytes beyond the plan, freed with the model."""
from __future__ import annotations

import gc

import pytest
import torch

from edge_infer.config import QuantConfig
from edge_infer.memory.measure import rss_anon_bytes
from edge_infer.models import weight_arena
from edge_infer.models.weight_arena import HUGE_PAGE, huge_pages_available, packed_zeros
from edge_infer.quant.native import missing_requirement

MiB = 1 << 20
needs_thp = pytest.mark.skipif(not huge_pages_available(),
                               reason="transparent huge pages are off here (never) or not Linux's")


def mapping_of(address: int) -> tuple[int, int, set[str]] | None:
    """(start, end, VmFlags) of the mapping holding ``address``, from /proc/self/smaps."""
    found = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                start, end = (int(x, 16) for x in head.split("-"))
                found = (start, end) if start <= address < end else None
            elif found and line.startswith("VmFlags:"):
                return found[0], found[1], set(line.split()[1:])
    return None


def from_pytorchs_allocator(t: torch.Tensor) -> bool:
    """A carved tensor views an arena's mapping (a fixed-size buffer); PyTorch's own storages can be resized."""
    return t.untyped_storage().resizable()


def test_outside_loading_kernels_take_pytorchs_memory():
    t = packed_zeros((3, 5), torch.bfloat16)
    assert t.shape == (3, 5) and t.dtype == torch.bfloat16 and not t.any()
    assert from_pytorchs_allocator(t)


@needs_thp
def test_tensors_are_carved_aligned_zeroed_and_apart_from_huge_page_regions():
    with weight_arena.weight_arena():
        small = [packed_zeros((1000 + i, 3), torch.uint8) for i in range(3)]
        large = packed_zeros((20 * MiB,), torch.int8)  # over a quarter of a shared region: a region of its own
        scales = packed_zeros((7, 64), torch.bfloat16)
    for t in (*small, large, scales):
        assert t.data_ptr() % 64 == 0 and not t.any() and not from_pytorchs_allocator(t)
        start, end, flags = mapping_of(t.data_ptr())
        assert "hg" in flags  # MADV_HUGEPAGE
    assert large.data_ptr() % HUGE_PAGE == 0
    assert small[0].data_ptr() % HUGE_PAGE == 0  # the first tensor of a shared region
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in (*small, scales))
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))  # no overlap
    for i, t in enumerate(small):
        t.fill_(i + 1)
    assert [int(t.float().mean()) for t in small] == [1, 2, 3] and not scales.any()


@needs_thp
def test_a_sealed_arena_holds_the_tensors_bytes_not_whole_huge_pages():
    before = rss_anon_bytes()
    with weight_arena.weight_arena():
        t = packed_zeros((5 * MiB // 2,), torch.uint8)  # 2.5 MiB: one huge page and half of the next
        t.fill_(1)
    grown = rss_anon_bytes() - before
    assert 5 * MiB // 2 - 64 * 1024 <= grown <= 5 * MiB // 2 + 256 * 1024, grown
    address = t.data_ptr()
    del t
    gc.collect()
    assert mapping_of(address) is None or "hg" not in mapping_of(address)[2]  # unmapped with its last tensor


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("EDGE_INFER_HUGE_PAGES", "0")
    assert not huge_pages_available()
    with weight_arena.weight_arena():
        t = packed_zeros((4 * MiB,), torch.uint8)
    assert from_pytorchs_allocator(t)


@needs_thp
@pytest.mark.parametrize("quant", [
    pytest.param(QuantConfig(group_size=32, quantize_head=True), id="int4"),
    pytest.param(QuantConfig.named("cpu_w4a8", group_size=32, quantize_head=True), id="w4a8",
                 marks=pytest.mark.skipif(missing_requirement() is not None, reason=str(missing_requirement()))),
])
def test_a_loaded_models_packed_weights_lie_on_huge_page_memory(untied_model, make_core, quant):
    core = make_core(untied_model, quant)
    kernels = [lin.kernel for _, lin in core.model.linears()]
    assert kernels
    for kernel in kernels:
        for t in kernel.resident():
            assert not from_pytorchs_allocator(t) and "hg" in mapping_of(t.data_ptr())[2], kernel.label
    x = torch.randn(2, kernels[0].in_features, dtype=torch.bfloat16)
    assert torch.isfinite(kernels[0](x)).all()
