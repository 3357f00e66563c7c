"""Write cpu_int4 and cpu_int8 checkpoints (``edge-infer quantize [--bits 8]``).

Every linear weight the engine would quantize is stored in the portable code
format (docs/quantization.md): ``<name>`` holds ``uint8 [rows, Kp / 2]``
(4 bits: two codes per byte, the even column in the low nibble) or ``int8
[rows, Kp]`` (8 bits), ``<name>_scale`` and, when asymmetric, ``<name>_zero``
hold ``bf16 [rows, Kp / group_size]``. Other tensors are copied unchanged; config.json gains a
``quantization_config``; tokenizer and generation files are copied. The
kernel's packed layout is not stored: it depends on the CPU PyTorch runs on.

``towers=True`` (a thinker) quantizes its media towers' linears too, in the same
format: they then load on the decoder's kernel only (``--encoder-quantization
same``), and the file shrinks by their share.

``simulate=True`` instead writes the dequantized weights in the source dtype,
for any group size including one group per row: an ordinary float checkpoint
that behaves like a quantizer the kernel cannot run, for fidelity studies.

Everything that can be checked is checked before the first tensor is read.
Tensors are quantized a block of rows at a time and written in shards, so the
peak is about one shard plus one tensor. The output appears under its final
name only when complete.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from edge_infer.config import QuantConfig
from edge_infer.errors import CheckpointError, InvalidRequestError
from edge_infer.models.checkpoint import check_checkpoint, safetensors_files
from edge_infer.models.config import ModelConfig
from edge_infer.models.encoder_weights import is_tower_spec
from edge_infer.models.loader import CheckpointReader
from edge_infer.models.weights import weight_specs
from edge_infer.quant.install import FLOAT_DTYPES, SCALE_SUFFIX, ZERO_SUFFIX
from edge_infer.quant.quantize import NonFiniteWeightError, QuantizedRows, dequantize_rows, pack_nibbles, quantize_rows
from edge_infer.quant.sizes import (
    ROW_GROUP, TENSOR_GROUP, checkpoint_quantization_config, check_quant_config, is_quantized, repack_block_rows,
)

DEFAULT_SHARD_BYTES = 2 << 30
# Files of a checkpoint directory that are weights (rewritten) rather than copied.
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.pt", "*.pth", "*.gguf", "config.json")


@dataclass
class QuantizeResult:
    out_dir: Path
    quantized_tensors: int
    copied_tensors: int
    source_bytes: int
    written_bytes: int


def quantize_checkpoint(
    src: str | Path,
    dst: str | Path,
    quant: QuantConfig,
    simulate: bool = False,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: Callable[[int, int], None] | None = None,
    towers: bool = False,
) -> QuantizeResult:
    """Quantize checkpoint ``src`` into the new directory ``dst`` (with ``towers``, a thinker's towers too).

    With ``simulate``, ``quant.group_size`` may be any size, or ROW_GROUP
    (one group per row) or TENSOR_GROUP (one per matrix).
    """
    src, dst = Path(src), Path(dst)
    cfg = ModelConfig.from_dir(src)
    if cfg.quantization_config is not None:
        raise CheckpointError(
            f"{src} is already quantized (config.json has a quantization_config); "
            f"quantize the original bf16 or fp32 checkpoint instead"
        )
    if not simulate:
        check_quant_config(quant)
    elif quant.group_size < TENSOR_GROUP:
        raise InvalidRequestError(f"group size must be positive, 'row' or 'tensor', got {quant.group_size}")
    if towers and cfg.multimodal is None:
        raise InvalidRequestError(f"{src} ({cfg.architecture}) has no media towers to quantize; drop --towers")
    specs = weight_specs(cfg)  # a thinker's towers included
    index = check_checkpoint(cfg, src, specs)
    targets = {name: spec.shape[1] for spec in specs
               if is_quantized(spec, quant, cfg.tie_word_embeddings) or (towers and is_tower_spec(spec) and spec.is_linear)
               for name in spec.sources}
    for name, cols in targets.items():
        info = index[name]
        if info.dtype not in FLOAT_DTYPES or len(info.shape) != 2 or info.shape[1] != cols:
            raise CheckpointError(
                f"tensor {name!r} is {info.dtype} {list(info.shape)}; quantizing needs a float matrix with {cols} "
                f"columns (F32, F16 or BF16)"
            )
    _check_destination(src, dst)

    partial = dst.with_name(dst.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        written = _write_weights(src, partial, index, targets, quant, simulate, shard_bytes, progress)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # a refused tensor (or ^C) leaves no half-written shards
        raise
    raw = dict(cfg.raw)
    if not simulate:
        raw["quantization_config"] = checkpoint_quantization_config(quant, towers)
    (partial / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    for path in sorted(src.iterdir()):
        if path.is_file() and not any(path.match(p) for p in WEIGHT_PATTERNS):
            shutil.copy2(path, partial / path.name)
    if dst.exists():
        dst.rmdir()  # checked empty above
    partial.rename(dst)
    return QuantizeResult(
        out_dir=dst,
        quantized_tensors=len(targets),
        copied_tensors=len(index) - len(targets),
        source_bytes=sum(f.stat().st_size for f in safetensors_files(src)),
        written_bytes=written,
    )


def _write_weights(src: Path, out: Path, index: dict, targets: dict[str, int], quant: QuantConfig, simulate: bool,
                   shard_bytes: int, progress: Callable[[int, int], None] | None) -> int:
    """Every tensor of ``src`` into shards under ``out``: ``targets`` quantized (or simulated), the rest copied."""
    writer = _ShardWriter(out, shard_bytes)
    with CheckpointReader(src) as reader:
        for done, name in enumerate(sorted(index), start=1):
            info = index[name]
            if name in targets:
                rows, cols = info.shape
                encoded = (_simulate if simulate else _encode)(reader, name, rows, cols, quant)
                for key, tensor in encoded.items():
                    writer.add(key, tensor)
            else:
                writer.add(name, reader.rows(name, 0, info.shape[0]) if info.shape else next(reader.row_blocks(name))[1])
            if progress is not None:
                progress(done, len(index))
        return writer.close()  # while the source is open: copied tensors may still read its mapped pages


def _check_destination(src: Path, dst: Path) -> None:
    if dst.resolve() == src.resolve():
        raise InvalidRequestError("the output directory must differ from the source checkpoint")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise InvalidRequestError(f"{dst} already exists and is not an empty directory; choose a new output directory")


def _row_blocks(reader: CheckpointReader, name: str, rows: int, step: int,
                quantize: Callable[[torch.Tensor], object]) -> Iterator[object]:
    """``quantize`` of each block of ``step`` rows of ``name``; a row without codes is refused naming the tensor
    and row."""
    for start in range(0, rows, step):
        try:
            yield quantize(reader.rows(name, start, min(rows, start + step)))
        except NonFiniteWeightError as exc:
            raise CheckpointError(exc.located(f"{name}, row {start + exc.row}")) from None


def _encode(reader: CheckpointReader, name: str, rows: int, cols: int, quant: QuantConfig) -> dict[str, torch.Tensor]:
    """The tensors stored for one quantized weight, quantized a block of rows at a time."""
    parts: dict[str, list[torch.Tensor]] = {}

    def quantize(weight: torch.Tensor) -> QuantizedRows:
        return quantize_rows(weight, quant.group_size, quant.symmetric, quant.bits)

    for q in _row_blocks(reader, name, rows, repack_block_rows(cols, quant.group_size), quantize):
        blocks = {name: pack_nibbles(q.codes) if quant.bits == 4 else q.codes, name + SCALE_SUFFIX: q.scales}
        if not quant.symmetric:
            blocks[name + ZERO_SUFFIX] = q.zeros
        for key, block in blocks.items():
            parts.setdefault(key, []).append(block)
    return {key: torch.cat(blocks) for key, blocks in parts.items()}


def _simulate(reader: CheckpointReader, name: str, rows: int, cols: int, quant: QuantConfig) -> dict[str, torch.Tensor]:
    """The weight as the quantizer would reproduce it, in the source dtype."""
    if quant.group_size == TENSOR_GROUP:  # one block: the whole matrix as one row
        def simulate(weight: torch.Tensor) -> torch.Tensor:
            q = quantize_rows(weight.reshape(1, rows * cols), rows * cols, quant.symmetric, quant.bits)
            return dequantize_rows(q, rows * cols).view(rows, cols).to(weight.dtype)

        return {name: next(_row_blocks(reader, name, rows, rows, simulate))}
    group = cols if quant.group_size == ROW_GROUP else quant.group_size

    def simulate(weight: torch.Tensor) -> torch.Tensor:
        return dequantize_rows(quantize_rows(weight, group, quant.symmetric, quant.bits), group, cols).to(weight.dtype)

    return {name: torch.cat(list(_row_blocks(reader, name, rows, repack_block_rows(cols, group), simulate)))}


class _ShardWriter:
    """Collects tensors and writes safetensors shards of at most ``shard_bytes`` (plus an index)."""

    def __init__(self, out: Path, shard_bytes: int):
        self.out = out
        self.shard_bytes = shard_bytes
        self.current: dict[str, torch.Tensor] = {}
        self.size = 0
        self.shards: list[tuple[Path, list[str]]] = []
        self.written = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.current and self.size + nbytes > self.shard_bytes:
            self._flush()
        self.current[name] = tensor.contiguous()
        self.size += nbytes

    def _flush(self) -> None:
        from safetensors.torch import save_file

        path = self.out / f"shard-{len(self.shards):05d}.tmp"
        save_file(self.current, str(path), metadata={"format": "pt"})
        self.shards.append((path, sorted(self.current)))
        self.written += self.size
        self.current, self.size = {}, 0

    def close(self) -> int:
        if self.current or not self.shards:
            self._flush()
        if len(self.shards) == 1:
            self.shards[0][0].rename(self.out / "model.safetensors")
            return self.written
        weight_map = {}
        for i, (path, names) in enumerate(self.shards, start=1):
            final = f"model-{i:05d}-of-{len(self.shards):05d}.safetensors"
            path.rename(self.out / final)
            weight_map.update({n: final for n in names})
        index = {"metadata": {"total_size": self.written}, "weight_map": weight_map}
        (self.out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        return self.written
