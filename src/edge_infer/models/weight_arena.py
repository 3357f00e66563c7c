"""Packed weights on 2 MiB pages: the regions a model's quantized kernels are allocated from while it loads.

A decode step streams every packed weight once. On 4 KiB pages that is a
TLB miss every 4 KiB; a transparent huge page covers 512 of them. One
one-token W4A8 product of 85 MB read 15-33% faster from 2 MiB pages than from
malloc's (8 alternations, each of 4 runs on an AMD EPYC Zen 4, native and
under the AVX2 mask, 1 and 2 threads; docs/quantization.md). Whole 2 MiB
pages need whole 2 MiB extents, which one kernel's tensors rarely fill, so
the kernels built inside ``weight_arena()`` (the loader's) are carved one
after another out of shared 2 MiB-aligned regions advised ``MADV_HUGEPAGE``.

Resident bytes stay the plan's: a region's memory is touched only where a
tensor lies, and when loading ends the huge page holding each region's last
bytes is cut back to them (``MADV_DONTNEED`` past the end). A region is
unmapped when the last tensor carved from it is freed. Where the kernel has
transparent huge pages disabled (``never``), off Linux, or with
``EDGE_INFER_HUGE_PAGES=0``, tensors come from PyTorch's allocator as before.
"""
from __future__ import annotations

import contextlib
import math
import mmap
import os
import threading
from collections.abc import Iterator

import torch

from edge_infer.hardware.memory import transparent_huge_pages

HUGE_PAGE = 2 << 20
REGION_BYTES = 64 << 20  # shared regions; a tensor over a quarter of this gets a region of its own
ALIGN = 64  # each tensor starts on a cache line


def huge_pages_available() -> bool:
    """Whether weights can be placed on transparent huge pages here (and are not switched off)."""
    if os.environ.get("EDGE_INFER_HUGE_PAGES", "1") == "0" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    return transparent_huge_pages() in ("always", "madvise")


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class _Region:
    """One anonymous mapping; ``start`` is its first 2 MiB-aligned byte, tensors are carved from there on."""

    def __init__(self, capacity: int):
        self.capacity = _round_up(capacity, HUGE_PAGE)
        # Private, so it counts as RssAnon (a shared mapping would be shmem, with shmem's huge-page setting);
        # the slack lets the used part start on a 2 MiB boundary.
        self.mapping = mmap.mmap(-1, self.capacity + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        address = torch.frombuffer(self.mapping, dtype=torch.uint8, count=1).data_ptr()
        self.start = -address % HUGE_PAGE
        self.used = 0
        self.mapping.madvise(mmap.MADV_HUGEPAGE, self.start, self.capacity)

    def carve(self, nbytes: int) -> torch.Tensor | None:
        offset = _round_up(self.used, ALIGN)
        if offset + nbytes > self.capacity:
            return None
        self.used = offset + nbytes
        return torch.frombuffer(self.mapping, dtype=torch.uint8, count=nbytes, offset=self.start + offset)

    def trim(self) -> None:
        """Give back the rest of the huge page the last tensor ends in (it was faulted in whole)."""
        end = _round_up(self.used, mmap.PAGESIZE)
        if end < self.capacity:
            self.mapping.madvise(mmap.MADV_DONTNEED, self.start + end, self.capacity - end)


class WeightArena:
    """Zero-filled tensors carved from 2 MiB-aligned huge-page regions; ``seal`` when no more will be carved."""

    def __init__(self) -> None:
        self.regions: list[_Region] = []
        self._shared: _Region | None = None

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            return torch.zeros(shape, dtype=dtype)
        if nbytes > REGION_BYTES // 4:
            region = _Region(nbytes)
            self.regions.append(region)
            raw = region.carve(nbytes)
        else:
            raw = self._shared.carve(nbytes) if self._shared is not None else None
            if raw is None:
                self._shared = _Region(REGION_BYTES)
                self.regions.append(self._shared)
                raw = self._shared.carve(nbytes)
        return raw.view(dtype).view(shape)  # fresh anonymous memory reads as zeros

    def seal(self) -> None:
        for region in self.regions:
            region.trim()
        self.regions, self._shared = [], None  # the tensors keep their regions mapped


_local = threading.local()  # each thread's load carves from its own arena (carving takes no lock)


@contextlib.contextmanager
def weight_arena() -> Iterator[None]:
    """Within this block, ``packed_zeros`` carves from one arena (sealed at the end); nested blocks share it."""
    if getattr(_local, "arena", None) is not None or not huge_pages_available():
        yield
        return
    _local.arena = WeightArena()
    try:
        yield
    finally:
        arena, _local.arena = _local.arena, None
        arena.seal()


def packed_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled tensor for a kernel's packed weights: from the loading arena if one is open."""
    arena = getattr(_local, "arena", None)
    if arena is None:
        return torch.zeros(shape, dtype=dtype)
    return arena.zeros(tuple(shape), dtype)
