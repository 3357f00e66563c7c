"""Linear layers whose weight storage is chosen at load time.

A ``Linear`` holds exactly one resident copy of its weight, in whichever
layout its kernel computes with: row-major for ``F.linear``, oneDNN's blocked
layout for bf16 (about 1.5x the matrix-vector bandwidth of ``F.linear`` on
this machine class, see docs/results.md), or the int4 packed layout of
``edge_infer.quant``. The plain tensor the loader built is released as soon
as the packed one exists.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


class WeightKernel:
    """Computes ``x @ W.T (+ bias)`` from one resident weight layout."""

    name = "abstract"

    @property
    def label(self) -> str:
        """The name as reports show it (kernels with several ISA variants add the one that runs)."""
        return self.name

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Kernels that can fuse the bias override this."""
        y = self.matmul(x)
        return y if bias is None else y + bias

    @property
    def nbytes(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError


class DenseKernel(WeightKernel):
    name = "dense"

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, self.weight, bias)

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


class OneDnnBf16Kernel(WeightKernel):
    """bf16 weight reordered once into oneDNN's blocked layout."""

    name = "onednn-bf16"

    def __init__(self, weight: torch.Tensor):
        assert weight.dtype == torch.bfloat16
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")

    @property
    def nbytes(self) -> int:
        # The blocked layout of these shapes (multiples of 16) carries no padding:
        # checked against the plan in tests/memory/test_plan.py (planned bytes equal what the engine allocates).
        return self.out_features * self.in_features * 2


@functools.lru_cache(maxsize=1)
def onednn_bf16_available() -> bool:
    """True when this PyTorch build and CPU (as hardware.cpu reports it, masks included) run the oneDNN bf16 linear."""
    from edge_infer.hardware.cpu import detect
    from edge_infer.hardware.kernels import KERNELS

    if KERNELS["onednn-bf16"].missing(detect()) is not None:
        return False
    try:
        if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
            return False
        w = torch.ones(16, 16, dtype=torch.bfloat16)
        OneDnnBf16Kernel(w)(torch.ones(1, 16, dtype=torch.bfloat16))
        return True
    except (RuntimeError, AttributeError):
        return False


def products_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype PyTorch's dense products (matrix products, convolutions) of ``dtype`` tensors should run in on this
    CPU: bf16 ones in fp32 where it has no bf16 arithmetic (``CpuCapabilities.native_bf16``, masks included), as
    PyTorch's emulated bf16 products ran 9-37x slower than fp32's on a Zen 3 (a 448x448 image's patch embedding
    152 against 17 ms, a 10 s clip's audio convolutions 1.5 s against 42 ms, 2 threads)."""
    from edge_infer.hardware.cpu import detect

    return torch.float32 if dtype == torch.bfloat16 and not detect().native_bf16 else dtype


def reorders_weight(backend: str, dtype: torch.dtype) -> bool:
    """Whether ``make_kernel`` copies the weight into a layout of its own (the row-major tensor is not kept)."""
    return backend == "onednn" and dtype == torch.bfloat16


def make_kernel(weight: torch.Tensor, backend: str) -> WeightKernel:
    """Wrap a row-major weight for ``backend`` ('dense' or 'onednn')."""
    if reorders_weight(backend, weight.dtype):
        return OneDnnBf16Kernel(weight)
    return DenseKernel(weight)


class Linear(nn.Module):
    """``y = x W^T + b`` with the weight kernel installed by the loader."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.has_bias = bias
        self.kernel: WeightKernel | None = None
        self.bias: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x, self.bias)

    @property
    def resident_bytes(self) -> int:
        n = self.kernel.nbytes if self.kernel is not None else 0
        if self.bias is not None:
            n += self.bias.numel() * self.bias.element_size()
        return n

    def extra_repr(self) -> str:
        kind = self.kernel.name if self.kernel is not None else "unloaded"
        return f"{self.in_features} -> {self.out_features}, bias={self.has_bias}, kernel={kind}"
