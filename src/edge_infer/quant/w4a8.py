"""The W4A8 kernel: int4 weights times int8 activations on AVX512-VNNI CPUs.

``cpu_int4`` weights (the same codes, scales and zeros) computed by our own
kernel, ``csrc/w4a8.cpp``, instead of PyTorch's tinygemm: activations are
quantized to int8 per row and weight group as they enter, and the products
run on integer dot-product instructions. At one token a matrix-vector
product then runs at memory speed rather than tinygemm's dequantizing
compute speed (4-6x faster on this machine class, see docs/quantization.md),
for a small extra error from the 8-bit activations.

The extension is compiled on first use with PyTorch's C++ extension
builder, in a child process (a C++ compiler and ``ninja`` needed, 15-25 s
on 2 cores), and cached under ``EDGE_INFER_KERNEL_CACHE`` or
``~/.cache/edge-infer/kernels``. Anything missing is refused by name: there
is no silent fall back to tinygemm.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
from pathlib import Path

import torch

from edge_infer.quant.kernel import PackedInt4
from edge_infer.quant.quantize import QuantizedRows, dequantize_rows

TILE_ROWS = 64  # output rows per packed tile (csrc/w4a8.cpp)
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
log = logging.getLogger(__name__)
_CSRC = Path(__file__).with_name("csrc")
_SOURCES = [_CSRC / name for name in ("w4a8.cpp", "decode_layer.cpp")]
_FLAGS = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]


def missing_requirement() -> str | None:
    """Why the W4A8 kernel cannot run here, or None when it can."""
    flags = _cpu_flags()
    absent = [f for f in CPU_FLAGS if f not in flags]
    if absent:
        return f"this CPU lacks {', '.join(absent)} (the W4A8 kernel needs AVX512-VNNI); use cpu_int4"
    if _library_path().exists():  # built before: nothing else needed
        return None
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler (c++ or $CXX) to build the W4A8 kernel; install g++ or use cpu_int4"
    try:
        import ninja  # noqa: F401 - PyTorch's extension builder runs its executable
    except ImportError:
        return "the W4A8 kernel is built with ninja: pip install ninja, or use cpu_int4"
    return None


def require_w4a8_kernel() -> None:
    """Build (once) and load the kernel; a RuntimeError names what is missing."""
    reason = missing_requirement()
    if reason is not None:
        raise RuntimeError(f"cpu_w4a8: {reason}")
    _load_extension()


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


@functools.lru_cache(maxsize=1)
def _library_path() -> Path:
    """Where the library built from these sources and flags for this torch lives."""
    key = hashlib.sha256(torch.__version__.encode() + " ".join(_FLAGS).encode())
    for path in sorted(p for p in _CSRC.iterdir() if p.suffix in (".cpp", ".h")):
        key.update(path.name.encode() + path.read_bytes())
    cache = Path(os.environ.get("EDGE_INFER_KERNEL_CACHE", Path.home() / ".cache" / "edge-infer" / "kernels"))
    return cache / f"w4a8-{key.hexdigest()[:16]}" / "edge_infer_w4a8.so"


@functools.lru_cache(maxsize=1)
def _load_extension() -> None:
    """Load the built library, building it first if these sources, flags and torch have none yet."""
    library = _library_path()
    if not library.exists():
        _build(library)
    torch.ops.load_library(str(library))


def _build(library: Path) -> None:
    """Compile in a child process: the builder's imports (~5 MB of RssAnon) and the compiler stay out of
    this one, whose memory the plan counts."""
    import subprocess
    import sys

    import ninja

    log.info("building the W4A8 kernel into %s (once per source version, 15-25 s)", library.parent)
    # The builder runs `ninja` from PATH; a venv's python started by its full path may not have it there.
    env = dict(os.environ, PATH=ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", ""))
    script = "import sys; from edge_infer.quant.w4a8 import compile_library; compile_library(sys.argv[1])"
    run = subprocess.run([sys.executable, "-c", script, str(library)], env=env, capture_output=True, text=True)
    if run.returncode != 0 or not library.exists():
        raise RuntimeError(f"cpu_w4a8: building the W4A8 kernel failed (use cpu_int4 meanwhile):\n{run.stderr[-3000:]}")


def compile_library(library: str) -> None:
    """(The build child.) Compile into a private directory, then publish with an atomic rename, so that
    a process starting meanwhile never loads a half-written file and a killed build leaves no lock."""
    import tempfile

    from torch.utils.cpp_extension import load

    target = Path(library)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix="build-"))
    try:
        # -fopenmp: at::parallel_for runs on the OpenMP pool PyTorch already started (same libgomp soname).
        load(name=target.stem, sources=[str(s) for s in _SOURCES], extra_cflags=_FLAGS, extra_ldflags=["-fopenmp"],
             build_directory=str(work), is_python_module=False, verbose=False)
        os.replace(work / target.name, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


class W4A8Kernel(PackedInt4):
    """``x @ W.T`` for a weight ``[out_features, in_features]`` held as int4 in ``csrc/w4a8.cpp``'s layout.

    ``packed`` uint8 ``[Np / 64, Kp / 8, 64, 4]`` and ``scales_zeros`` bf16
    ``[Np / 64, Kp / group_size, 2, 64]`` (see the kernel source); ``Np`` pads the
    rows to whole tiles with zero codes and scales, which the kernel never stores.
    """

    name = "cpu-w4a8"

    def __init__(self, out_features: int, in_features: int, group_size: int, dtype: torch.dtype):
        require_w4a8_kernel()
        super().__init__(out_features, in_features, group_size)
        self.dtype = dtype
        tiles = -(-out_features // TILE_ROWS)
        self.packed = torch.zeros(tiles, self.cols_padded // 8, TILE_ROWS, 4, dtype=torch.uint8)
        self.scales_zeros = torch.zeros(tiles, self.cols_padded // group_size, 2, TILE_ROWS, dtype=torch.bfloat16)

    def write_rows(self, start: int, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> None:
        """Pack rows ``start .. start + len(codes)`` (``start`` a multiple of 64); arguments as ``Int4Kernel.write_rows``."""
        assert start % TILE_ROWS == 0, "blocks must start on a row tile"
        n = min(codes.shape[0], self.out_features - start)
        tiles = -(-n // TILE_ROWS)
        rows = tiles * TILE_ROWS
        pad = rows - n
        codes = torch.nn.functional.pad(codes[:n].to(torch.uint8), (0, 0, 0, pad))
        kp, groups = self.cols_padded, self.cols_padded // self.group_size
        # Column k + 4 + i shares a byte with column k + i (i < 4) in every block of 8 columns.
        halves = codes.view(tiles, TILE_ROWS, kp // 8, 2, 4)
        byte = halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)
        first = start // TILE_ROWS
        self.packed[first:first + tiles] = byte.permute(0, 2, 1, 3)
        sz = torch.stack((scales[:n], zeros[:n])).to(torch.bfloat16)  # [2, n, groups]
        sz = torch.nn.functional.pad(sz, (0, 0, 0, pad)).view(2, tiles, TILE_ROWS, groups)
        self.scales_zeros[first:first + tiles] = sz.permute(1, 3, 0, 2)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = torch.ops.edge_infer.w4a8_linear(self.padded_input(x), self.packed, self.scales_zeros, self.group_size,
                                             self.out_features)
        return y.view(*lead, self.out_features)

    def quantized_rows(self, ids: torch.Tensor) -> QuantizedRows:
        """The codes, scales and zeros of weight rows ``ids``."""
        ids = ids.reshape(-1).long()
        tile, r = ids // TILE_ROWS, ids % TILE_ROWS
        byte = self.packed[tile, :, r]  # [T, Kp / 8, 4]
        codes = torch.stack((byte & 15, byte >> 4), dim=2).reshape(len(ids), self.cols_padded)
        sz = self.scales_zeros[tile, :, :, r]  # [T, groups, 2]
        return QuantizedRows(codes, sz[..., 0], sz[..., 1])

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized weight rows ``[len(ids), in_features]`` in the activation dtype (an embedding lookup)."""
        w = dequantize_rows(self.quantized_rows(ids), self.group_size, self.in_features)
        return w.to(self.dtype)
