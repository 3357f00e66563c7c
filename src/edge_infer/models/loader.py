"""Load Hugging Face safetensors checkpoints into ``DecoderLM`` (``load_weights``) or any module (``load_module``).

Files are memory-mapped by ``safetensors`` and every tensor is copied into
its final dtype a block of rows at a time, so the load-time peak is the
steady state plus one block plus one weight being repacked — not a second
copy of the model. Sharded checkpoints are read through their index.

A weight that a kernel copies into a layout of its own (oneDNN's reorder) is
read into one staging buffer reused from linear to linear: the operating
system zeroes fresh memory on first touch, and a fresh row-major copy of each
such weight was a third of a bf16 3B model's load (docs/performance.md).
"""
from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import torch

from edge_infer.errors import CheckpointError
from edge_infer.models.checkpoint import TensorInfo, read_tensor_index
from edge_infer.models.layers.linear import Linear, make_kernel, reorders_weight
from edge_infer.models.weight_arena import weight_arena

# Rows copied per step are chosen so a block holds about this many bytes.
BLOCK_BYTES = 16 << 20

DTYPES = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I32": torch.int32,
    "I64": torch.int64,
    "U8": torch.uint8,
    "I8": torch.int8,
}
# The engine's dtype names (EngineConfig.dtype) as torch dtypes.
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


class CheckpointReader:
    """Blocked reads of named tensors from memory-mapped safetensors files."""

    def __init__(self, model_dir: str | Path):
        from safetensors import safe_open

        self.model_dir = Path(model_dir)
        self.index = read_tensor_index(self.model_dir)
        self._stack = contextlib.ExitStack()
        self._handles = {}
        self._open = lambda p: self._stack.enter_context(safe_open(str(p), framework="pt"))

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        self._handles.clear()

    def info(self, name: str) -> TensorInfo:
        try:
            return self.index[name]
        except KeyError:
            raise CheckpointError(f"checkpoint {self.model_dir} lacks tensor {name!r}") from None

    def _slice(self, info: TensorInfo):
        handle = self._handles.get(info.file)
        if handle is None:
            handle = self._handles[info.file] = self._open(info.file)
        return handle.get_slice(info.key)

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of ``name`` in the file's dtype: a copy of just those rows."""
        return self._slice(self.info(name))[start:stop]

    def row_blocks(self, name: str) -> Iterator[tuple[int, torch.Tensor]]:
        """(first row, tensor) blocks of ``name`` along dim 0, in the file's dtype."""
        info = self.info(name)
        sl = self._slice(info)
        if len(info.shape) == 0:
            yield 0, sl[:]
            return
        rows = info.shape[0]
        row_bytes = max(1, _numel(info.shape[1:]) * DTYPES.get(info.dtype, torch.float32).itemsize)
        step = max(1, BLOCK_BYTES // row_bytes)
        for start in range(0, rows, step):
            yield start, sl[start : min(rows, start + step)]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def fill_concatenated(reader: CheckpointReader, sources: tuple[str, ...], out: torch.Tensor) -> None:
    """Copy ``sources`` (concatenated along dim 0) into ``out``, converting dtype per block."""
    row = 0
    for name in sources:
        info = reader.info(name)
        expected = tuple(out.shape[1:])
        if tuple(info.shape[1:]) != expected:
            raise CheckpointError(f"tensor {name!r} has shape {info.shape}; expected (*, {', '.join(map(str, expected))}) from config.json")
        for start, block in reader.row_blocks(name):
            out[row + start : row + start + block.shape[0]].copy_(block)
        row += info.shape[0] if info.shape else 1
    if row != (out.shape[0] if out.dim() else 1):
        raise CheckpointError(f"tensors {', '.join(sources)} give {row} rows; config.json implies {out.shape[0]}")


class _Staging:
    """The buffer a load reads reordered weights into, grown to the largest asked for."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def rows(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        if self.buffer is None or self.buffer.numel() < nbytes:
            self.buffer = None  # the smaller one goes before the larger one is made
            self.buffer = torch.empty(nbytes, dtype=torch.uint8)
        return self.buffer[:nbytes].view(dtype).view(shape)


_local = threading.local()  # each thread's load has its own buffer


def _staging() -> _Staging | None:
    return getattr(_local, "staging", None)


@contextlib.contextmanager
def _staging_scope() -> Iterator[None]:
    """One staging buffer for the block; nested blocks share the outer one."""
    if _staging() is not None:
        yield
        return
    _local.staging = _Staging()
    try:
        yield
    finally:
        _local.staging = None


def staged_rows(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Uninitialised rows for a weight that is copied elsewhere before the next one is read: a view of the load's
    staging buffer (its memory already touched), or fresh memory outside a load."""
    staging = _staging()
    return torch.empty(shape, dtype=dtype) if staging is None else staging.rows(shape, dtype)


def release_staging() -> None:
    """Free the load's staging buffer: an installer calls this before a linear with a working set of its own (a
    quantized one's block), so the two are not held at once (the plan counts the larger, not their sum)."""
    staging = _staging()
    if staging is not None:
        staging.buffer = None


M = TypeVar("M", bound=torch.nn.Module)


def load_module(factory: Callable[[], M], model_dir: str | Path, dtype: torch.dtype, *, prefix: str = "",
                ignore: tuple[str, ...] = ()) -> M:
    """Build a plain module with ``factory`` on the meta device and fill its parameters by name.

    A parameter ``p`` is the checkpoint's ``prefix + p``. Checkpoint names
    starting with one of ``ignore`` belong to something else; any other
    extra or missing name is an error that lists them.
    """
    with torch.device("meta"):
        module = factory()
    wanted = dict(module.named_parameters())
    with CheckpointReader(model_dir) as reader:
        names = [n for n in reader.index if n.startswith(prefix) and n[len(prefix):] in wanted]
        missing = sorted(set(wanted) - {n[len(prefix):] for n in names})
        unexpected = sorted(n for n in reader.index if n not in names and not n.startswith(ignore))
        if missing or unexpected:
            raise CheckpointError(
                f"{model_dir}: the weights do not match the config "
                f"(missing: {missing[:8]}{' ...' if len(missing) > 8 else ''}; "
                f"unexpected: {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''})"
            )
        state = {}
        for name in names:
            local = name[len(prefix):]
            if reader.info(name).shape != tuple(wanted[local].shape):
                raise CheckpointError(f"{model_dir}: {name} has shape {reader.info(name).shape}, "
                                      f"the config implies {tuple(wanted[local].shape)}")
            state[local] = torch.empty(wanted[local].shape, dtype=dtype)
            fill_concatenated(reader, (name,), state[local])
    module.load_state_dict(state, strict=True, assign=True)
    return module.eval().requires_grad_(False)


LinearInstaller = Callable[[Linear, str, tuple[str, ...], CheckpointReader, torch.dtype], None]


def install_dense(backend: str) -> LinearInstaller:
    """Installer that loads a linear weight as-is and wraps it for ``backend``."""

    def install(linear: Linear, target: str, sources: tuple[str, ...], reader: CheckpointReader, dtype: torch.dtype) -> None:
        shape = (linear.out_features, linear.in_features)
        weight = staged_rows(shape, dtype) if reorders_weight(backend, dtype) else torch.empty(shape, dtype=dtype)
        fill_concatenated(reader, sources, weight)
        linear.kernel = make_kernel(weight, backend)

    return install


def load_weights(
    model: "torch.nn.Module",
    model_dir: str | Path,
    dtype: torch.dtype,
    install_linear: LinearInstaller,
    progress: Callable[[int, int], None] | None = None,
    head_from_embedding: bool = False,
    release: Callable[[], object] | None = None,
    table_dtype_as_stored: bool = False,
    prefix: str = "",
) -> None:
    """Fill every tensor of ``model.weight_specs()`` from the checkpoint.

    ``prefix`` is put before every source name: a tower loaded on its own
    names tensors relative to itself (``models.encoders``).

    ``head_from_embedding`` (a tied model whose head is quantized or
    widened): the embedding table is installed as the output head's linear,
    and the embedding lookup reads its rows from that one copy.
    ``table_dtype_as_stored``: a separate embedding table keeps the
    checkpoint's dtype (16-bit weights widened at lookup, not held twice as large).

    Packed kernels built here are carved from 2 MiB pages (``weight_arena``).

    ``release`` runs after each tensor (the engine passes ``malloc_trim``):
    the allocator otherwise keeps the freed blocks of earlier tensors, about
    15% of a 0.5B model's weights by the last one, which the plan's load
    transient (one block plus one linear being repacked) does not hold.
    """
    specs = model.weight_specs()
    if prefix:
        specs = [replace(spec, sources=tuple(prefix + name for name in spec.sources)) for spec in specs]
    with CheckpointReader(model_dir) as reader, weight_arena(), _staging_scope():
        for n, spec in enumerate(specs):
            owner, attr = model.resolve(spec.target)
            if spec.target == "embed" and head_from_embedding:
                install_linear(model.lm_head, "lm_head", spec.sources, reader, dtype)
            elif spec.is_linear:
                install_linear(getattr(owner, attr), spec.target, spec.sources, reader, dtype)
            else:
                stored = DTYPES[reader.info(spec.sources[0]).dtype] if spec.target == "embed" and table_dtype_as_stored else dtype
                tensor = torch.empty(spec.shape, dtype=stored)
                fill_concatenated(reader, spec.sources, tensor)
                setattr(owner, attr, tensor)
            if release is not None:
                release()
            if progress is not None:
                progress(n + 1, len(specs))
    if getattr(model.cfg, "tie_word_embeddings", False):  # decoders; the encoders have no head
        model.tie_head()


def resident_bytes(model: "torch.nn.Module") -> int:
    """Bytes of the tensors ``model.weight_specs()`` installed, as held: a linear by its kernel (its bias is a
    spec of its own), any other tensor by its storage."""
    total = 0
    for spec in model.weight_specs():
        owner, attr = model.resolve(spec.target)
        value = getattr(owner, attr)
        if isinstance(value, Linear):
            total += value.kernel.nbytes if value.kernel is not None else 0
        elif value is not None:
            total += value.numel() * value.element_size()
    return total


def resolve_target(root: object, target: str) -> tuple[object, str]:
    """The object owning the dotted attribute path ``target`` under ``root``, and the attribute name to set on it."""
    obj = root
    parts = target.split(".")
    for part in parts[:-1]:
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj, parts[-1]
