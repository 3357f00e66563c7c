"""Memory admission for a text session: every byte itemised before loading.

``plan_text_session`` resolves the engine settings (dtype, context length, KV
budget), sizes each item from the checkpoint's headers and config alone —
weights as they will be resident, KV cache, RoPE tables, activation peak,
load-time transient, runtime overhead — and compares the peak with the
memory actually available. A plan that does not fit is refused with the
numbers and the levers that would make it fit. Nothing is loaded and torch
is not imported.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from edge_infer.config import DTYPES, QUANT_METHODS, EngineConfig, QuantConfig
from edge_infer.models.layers.kv_cache import DEFAULT_BLOCK_SIZE, KVLayout
from edge_infer.errors import InvalidRequestError
from edge_infer.hardware.cpu import CpuCapabilities, detect
from edge_infer.hardware.kernels import KernelSelection, auto_dtype, select_kernels
from edge_infer.hardware.memory import available_memory_bytes
from edge_infer.models.checkpoint import check_checkpoint
from edge_infer.models.config import ModelConfig
from edge_infer.models.weights import weight_specs

MiB = 1 << 20
DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_MAX_NUM_SEQS = 8
DEFAULT_MAX_NUM_BATCHED_TOKENS = 512
# Share of the memory left after everything else that a default KV budget may take.
DEFAULT_KV_SHARE = 0.5
# Bytes copied per step while loading (models.loader.BLOCK_BYTES).
LOAD_BLOCK_BYTES = 16 * MiB
CHECKPOINT_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


@lru_cache(maxsize=1)
def runtime_overhead() -> dict[str, Any]:
    """Per-process baselines measured once on this machine class (scripts/measure_overhead.py)."""
    return json.loads((Path(__file__).with_name("overhead.json")).read_text())


@dataclass
class PlanItem:
    name: str
    bytes: int
    pool: str  # "anon": allocated memory (RssAnon); "file": page cache of mapped files (RssFile)
    phase: str  # "steady": held while serving; "load": only while loading
    note: str = ""


@dataclass
class TextPlan:
    model: str
    settings: dict[str, Any]
    items: list[PlanItem]
    available_bytes: int
    admitted: bool
    reasons: list[str] = field(default_factory=list)
    levers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    engine_config: EngineConfig | None = None
    cpu: CpuCapabilities | None = None
    kernels: KernelSelection | None = None

    def item(self, name: str) -> int:
        return next(i.bytes for i in self.items if i.name == name)

    @property
    def steady_bytes(self) -> int:
        """Serving at full load: everything but the load-only transient."""
        return sum(i.bytes for i in self.items if i.phase == "steady" and i.pool == "anon")

    @property
    def load_peak_bytes(self) -> int:
        """While loading: overhead + weights + transient (KV is allocated after loading)."""
        names = {"runtime overhead", "weights", "load transient"}
        return sum(i.bytes for i in self.items if i.name in names)

    @property
    def peak_bytes(self) -> int:
        return max(self.steady_bytes, self.load_peak_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "admitted": self.admitted,
            "settings": self.settings,
            "items": [asdict(i) for i in self.items],
            "steady_bytes": self.steady_bytes,
            "load_peak_bytes": self.load_peak_bytes,
            "peak_bytes": self.peak_bytes,
            "available_bytes": self.available_bytes,
            "reasons": self.reasons,
            "levers": self.levers,
            "notes": self.notes,
            "cpu": self.cpu.to_dict() if self.cpu else None,
            "kernels": self.kernels.to_dict() if self.kernels else None,
        }

    def table(self) -> str:
        def mib(n: int) -> str:
            return f"{n / MiB:10.1f} MiB"

        lines = [f"memory plan for {self.model}"]
        for key, value in self.settings.items():
            lines.append(f"  {key:<24} {value}")
        lines.append("")
        lines.append(f"  {'item':<22} {'bytes':>14} {'':>14}  pool  phase   note")
        for i in self.items:
            lines.append(f"  {i.name:<22} {i.bytes:>14,} {mib(i.bytes)}  {i.pool:<5} {i.phase:<7} {i.note}")
        lines.append("")
        lines.append(f"  {'steady state':<22} {self.steady_bytes:>14,} {mib(self.steady_bytes)}")
        lines.append(f"  {'load peak':<22} {self.load_peak_bytes:>14,} {mib(self.load_peak_bytes)}")
        lines.append(f"  {'available':<22} {self.available_bytes:>14,} {mib(self.available_bytes)}")
        if self.cpu is not None and self.kernels is not None:
            lines.append("")
            lines.append(f"  cpu {self.cpu.isa_summary} ({self.cpu.source})")
            for c in self.kernels.choices:
                lines.append(f"  {c.kind:<22} {c.label:<26} {c.dtype:<9} {c.why}")
        lines.append("")
        lines.append("ADMITTED" if self.admitted else "REFUSED")
        lines += [f"  - {r}" for r in self.reasons]
        if self.levers:
            lines.append("levers that would make it fit:")
            lines += [f"  - {lever}" for lever in self.levers]
        for note in self.notes:
            lines.append(f"note: {note}")
        return "\n".join(lines)


def resolve_dtype(requested: str | None, notes: list[str], quantization: str | None = None,
                  cpu: CpuCapabilities | None = None) -> str:
    """The engine dtype; ``auto`` picks what is fast for the kernel ``quantization`` runs on, on ``cpu``."""
    if requested in (None, "auto"):
        dtype, why = auto_dtype(cpu or detect(), quantization)
        notes.append(f"dtype auto -> {dtype}: {why}")
        return dtype
    aliases = {"bf16": "bfloat16", "fp32": "float32", "float": "float32"}
    dtype = aliases.get(requested, requested)
    if dtype not in DTYPES:
        raise InvalidRequestError(f"dtype {requested!r} is not supported; use one of auto, {', '.join(DTYPES)}")
    return dtype


def weight_bytes(cfg: ModelConfig, dtype_bytes: int, quant: QuantConfig | None, widened: bool = False) -> tuple[int, int]:
    """(resident weight bytes, largest linear repacked from its row-major form while loading); ``widened``: a
    16-bit checkpoint on the W16A32 kernel (packed a block of rows at a time: no linear is held whole)."""
    total = 0
    largest_linear = 0
    for spec in weight_specs(cfg):
        plain = spec.numel * dtype_bytes
        if widened:
            from edge_infer.quant.sizes import widened_spec_nbytes

            total += widened_spec_nbytes(spec, dtype_bytes, cfg.tie_word_embeddings)
            continue
        if quant is None:
            total += plain
            largest_linear = max(largest_linear, plain if spec.is_linear else 0)
            continue
        from edge_infer.quant.sizes import is_quantized, spec_nbytes

        total += spec_nbytes(spec, quant, dtype_bytes, cfg.tie_word_embeddings)
        if spec.is_linear and not is_quantized(spec, quant, cfg.tie_word_embeddings):
            largest_linear = max(largest_linear, plain)  # e.g. an unquantized output head
    return total, largest_linear


def activation_tensor_bytes(cfg: ModelConfig, dtype_bytes: int) -> int:
    """Bytes per token of the tensors a step keeps alive at once, by shape alone.

    The residual stream and its normed copy, q/k/v and their rotated copies,
    the attention output, gate/up, the activated product and the down
    projection. Kernels add scratch on top (oneDNN accumulates in fp32,
    RMSNorm works in fp32, the allocator rounds up): the measured factor
    ``activation_per_token_factor`` in overhead.json scales this to what a
    step really takes.
    """
    h, i = cfg.hidden_size, cfg.intermediate_size
    return dtype_bytes * (4 * h + 3 * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size + 4 * i)


def activation_calibration(quantization: str | None) -> tuple[float, int, float]:
    """(per-token factor, fixed bytes, bytes per attention-mask element) measured for the linears'
    kernel: dense/oneDNN, or the quantized kernels' (measured with cpu_int4: the int8 kernels allocate the
    same tensors, plus int8 copies of their inputs that are smaller than those)."""
    calib = runtime_overhead()
    prefix = "cpu_int4_" if quantization else ""
    return (calib[prefix + "activation_per_token_factor"], int(calib[prefix + "activation_fixed_bytes"]),
            calib["activation_mask_bytes_per_element"])


def activation_bytes(
    cfg: ModelConfig, dtype_bytes: int, tokens: int, max_num_seqs: int, max_model_len: int,
    quantization: str | None = None,
) -> int:
    """Transient bytes of one step of ``tokens`` tokens, calibrated by measurement.

    Per token: the shape-derived tensors times the measured kernel factor.
    Attention: the fused kernel works in blocks; what scales is the mask of
    one chunk against the context (booleans, which attention turns into a
    float bias: the measured bytes per element). Logits: fp32 rows for every sequence that
    samples, plus the sampler's working copies of one row. Fixed: the
    measured allocator and thread scratch of a step.
    """
    factor, fixed, mask_element = activation_calibration(quantization)
    per_token = int(factor * activation_tensor_bytes(cfg, dtype_bytes))
    chunk = min(tokens, max_model_len)
    mask = int(mask_element * chunk * max_model_len * (cfg.num_attention_heads // cfg.num_key_value_heads))
    logits = 4 * cfg.vocab_size * (max_num_seqs + 4)
    return per_token * tokens + mask + logits + fixed


def plan_text_session(
    model: str | Path,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    quantization: str | QuantConfig | None = None,
    dtype: str | None = None,
    available_bytes: int | None = None,
    weight_backend: str = "auto",
    num_threads: int | None = None,
    seed: int = 0,
    eos_token_ids: tuple[int, ...] = (),
    frontend: str = "library",
    rope_model_positions: bool = False,
    trim_after_load: bool = True,
    packed_head: bool = False,
    cpu: CpuCapabilities | None = None,
    priority: str | None = None,
) -> TextPlan:
    """Plan a text session; see the module docstring. Raises only for unreadable checkpoints.

    ``cpu`` plans for another CPU (``hardware.cpu.PROFILES``); by default, this one. ``quantization="auto"``
    (or a ``priority`` without a quantization) picks the weight path by ``priority`` (speed, fidelity or
    memory: memory/weight_path.py); an explicit quantization wins over a priority.
    """
    model_dir = str(model)
    cfg = ModelConfig.from_dir(model_dir)
    if quantization == "auto" or (quantization is None and priority is not None):
        from edge_infer.memory.weight_path import plan_auto

        settings = dict(max_model_len=max_model_len, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        kv_cache_memory_bytes=kv_cache_memory_bytes, dtype=dtype, available_bytes=available_bytes,
                        weight_backend=weight_backend, num_threads=num_threads, seed=seed, eos_token_ids=eos_token_ids,
                        frontend=frontend, rope_model_positions=rope_model_positions, trim_after_load=trim_after_load,
                        packed_head=packed_head)
        stored_format = (cfg.quantization_config or {}).get("quant_method")
        return plan_auto(plan_text_session, model_dir, priority, cpu or detect(), stored_format, **settings)
    tensors = check_checkpoint(cfg, model_dir, weight_specs(cfg))
    notes: list[str] = []
    reasons: list[str] = []
    levers: list[str] = []
    cpu = cpu or detect()
    quant = _resolve_quant(quantization, cfg)
    dtype_explicit = dtype not in (None, "auto")
    dtype = resolve_dtype(dtype, notes, quant.name if quant else None, cpu)
    dtype_bytes = 2 if dtype == "bfloat16" else 4
    stored_16bit = _stored_16bit(cfg, tensors)
    from edge_infer.quant import native_build

    built = native_build.built_variants() if cpu == detect() else None  # another CPU: any variant may run there
    kernels = select_kernels(cpu, dtype, quant.name if quant else None, quantize_head=bool(quant and quant.quantize_head),
                             tied=cfg.tie_word_embeddings, packed_head=packed_head, weight_backend=weight_backend,
                             dtype_explicit=dtype_explicit, built_variants=built, stored_16bit=stored_16bit)
    reasons += kernels.refusals
    notes += kernels.notes
    if priority is not None:
        notes.append(f"--priority {priority} does not apply: the weight path was chosen explicitly "
                     f"({quant.name if quant else 'unquantized'}); use --quantization auto to choose by priority")
    native_kernel = kernels.kernel_for("decoder linears") in ("cpu-w4a8", "cpu-w8a8", "cpu-w16a32")
    if native_kernel and not kernels.refusals and (why := native_build.missing_toolchain()) is not None:
        if quant is not None:
            reasons.append(f"--quantization {quant.name}: {why}")
        else:  # the 16-bit path is an optimisation: without it the weights are held in float32, and the plan says so
            kernels = select_kernels(cpu, dtype, None, tied=cfg.tie_word_embeddings, packed_head=packed_head,
                                     weight_backend="dense", dtype_explicit=dtype_explicit)
            notes.append(f"the checkpoint's {stored_16bit} weights are held in float32, twice their bytes: {why}")
    widened = kernels.kernel_for("decoder linears") == "cpu-w16a32"

    model_max = cfg.max_position_embeddings
    if max_model_len is None:
        max_model_len = min(model_max, DEFAULT_MAX_MODEL_LEN)
        if max_model_len < model_max:
            notes.append(f"max_model_len defaulted to {max_model_len} (the model allows {model_max}); set it to change")
    max_num_seqs = max_num_seqs or DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens = max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    if max_model_len < 2:
        reasons.append(f"max_model_len={max_model_len} leaves no room for a prompt and one generated token")
    if max_model_len > model_max:
        reasons.append(
            f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={model_max}; "
            f"positions beyond it were never trained"
        )
    if max_num_seqs < 1 or max_num_batched_tokens < 1:
        reasons.append("max_num_seqs and max_num_batched_tokens must be at least 1")
    if max_num_seqs > max_num_batched_tokens:
        reasons.append(
            f"max_num_seqs ({max_num_seqs}) exceeds max_num_batched_tokens ({max_num_batched_tokens}): "
            f"one step could not give every running sequence its token"
        )
        levers.append(f"--max-num-seqs {max_num_batched_tokens} or --max-num-batched-tokens {max_num_seqs}")

    layout = KVLayout(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dtype_bytes, DEFAULT_BLOCK_SIZE)
    overhead = runtime_overhead()
    tokenizer_json = Path(model_dir) / "tokenizer.json"
    tok_bytes = int(overhead["tokenizer_bytes_per_json_byte"] * (tokenizer_json.stat().st_size if tokenizer_json.exists() else 0))
    if frontend not in ("library", "server"):
        raise InvalidRequestError(f"frontend must be 'library' or 'server', got {frontend!r}")
    frontend_bytes = overhead["server_frontend_bytes" if frontend == "server" else "frontend_bytes"]
    overhead_bytes = frontend_bytes + overhead["worker_bytes"] + tok_bytes
    weights, largest_linear = weight_bytes(cfg, dtype_bytes, quant, widened)
    packed_head = packed_head and cfg.tie_word_embeddings and not (quant is not None and quant.quantize_head)
    if packed_head:
        weights += cfg.vocab_size * cfg.hidden_size * dtype_bytes  # the head's own copy beside the embedding
    # The measuring-only alternative sizes RoPE for every position the model allows.
    rope_positions = model_max if rope_model_positions else max_model_len
    rope = 2 * rope_positions * cfg.head_dim * 4
    acts = activation_bytes(cfg, dtype_bytes, max_num_batched_tokens, max_num_seqs, max_model_len,
                            quant.name if quant is not None else None)
    src_bytes = max((CHECKPOINT_DTYPE_BYTES.get(t.dtype, 4) for t in tensors.values()), default=4)
    # One block being converted, plus the largest linear held twice while it is repacked.
    transient = min(LOAD_BLOCK_BYTES, largest_linear * src_bytes // dtype_bytes) + largest_linear
    if quant is not None:  # quantized linears are quantized and packed a block of rows at a time
        from edge_infer.quant.sizes import repack_transient_bytes

        transient = max(transient, repack_transient_bytes(weight_specs(cfg), quant, cfg.tie_word_embeddings, src_bytes))
    if widened:  # 16-bit rows packed a block at a time
        from edge_infer.quant.sizes import widened_transient_bytes

        transient = max(transient, widened_transient_bytes(weight_specs(cfg)))
    file_bytes = sum(t.file.stat().st_size for t in {t.file: t for t in tensors.values()}.values())

    one_seq_blocks = layout.blocks_for_tokens(max_model_len)
    others = overhead_bytes + weights + rope + acts
    available = available_bytes if available_bytes is not None else available_memory_bytes()
    if kv_cache_memory_bytes is None:
        wanted = layout.blocks_for_tokens(max_model_len) * max_num_seqs
        share = int(max(0, available - others) * DEFAULT_KV_SHARE) // layout.bytes_per_block
        kv_blocks = max(min(wanted, share), one_seq_blocks)
        notes.append(
            f"kv_cache_memory_bytes defaulted to {kv_blocks * layout.bytes_per_block:,} "
            f"({kv_blocks * layout.block_size} tokens; at most half of the memory left after the rest)"
        )
    else:
        kv_blocks = layout.blocks_for_budget(int(kv_cache_memory_bytes))
        if kv_blocks * layout.bytes_per_block != kv_cache_memory_bytes:
            notes.append(
                f"kv_cache_memory_bytes={kv_cache_memory_bytes:,} holds {kv_blocks} whole blocks of "
                f"{layout.bytes_per_block:,} bytes: {kv_blocks * layout.bytes_per_block:,} bytes are allocated"
            )
    kv_bytes = kv_blocks * layout.bytes_per_block
    kv_tokens = kv_blocks * layout.block_size
    if kv_blocks < one_seq_blocks:
        reasons.append(
            f"the KV budget holds {kv_tokens} tokens, less than one sequence of max_model_len={max_model_len} "
            f"({one_seq_blocks * layout.bytes_per_block:,} bytes needed)"
        )
        levers.append(f"--kv-cache-memory-bytes {one_seq_blocks * layout.bytes_per_block} (one full-length sequence)")
        levers.append(f"--max-model-len {max(layout.block_size, kv_tokens)} (what this KV budget holds)")
    elif kv_tokens < max_model_len * max_num_seqs:
        notes.append(
            f"KV cache holds {kv_tokens} tokens: {kv_tokens // max_model_len} of {max_num_seqs} sequences at full "
            f"length at once; beyond that, newer sequences wait or are preempted and recomputed"
        )

    items = [
        PlanItem("runtime overhead", overhead_bytes, "anon", "steady", f"{frontend} frontend + worker + tokenizer (measured once)"),
        PlanItem("weights", weights, "anon", "steady", _weights_note(cfg, dtype, quant, packed_head, widened and stored_16bit)),
        PlanItem("kv cache", kv_bytes, "anon", "steady", f"{kv_blocks} blocks x {layout.bytes_per_block:,} B = {kv_tokens} tokens"),
        PlanItem("rope tables", rope, "anon", "steady", f"cos+sin fp32 for {rope_positions} positions"),
        PlanItem("activations", acts, "anon", "steady", f"one step of {max_num_batched_tokens} tokens, {max_num_seqs} logit rows"),
        PlanItem("load transient", transient, "anon", "load", "one block being converted + the largest linear being repacked"),
        PlanItem("checkpoint pages", file_bytes, "file", "load", "memory-mapped while loading; page cache, released after"),
    ]
    plan = TextPlan(
        model=model_dir,
        settings={
            "dtype": dtype,
            "quantization": None if quant is None else f"{quant.name} g{quant.group_size} {'sym' if quant.symmetric else 'asym'}{' +head' if quant.quantize_head else ''}",
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "kv_cache_memory_bytes": kv_bytes,
            "kv_cache_tokens": kv_tokens,
            "architecture": cfg.architecture,
        },
        items=items,
        available_bytes=available,
        admitted=False,
        notes=notes,
        cpu=cpu,
        kernels=kernels,
    )
    if plan.peak_bytes > available:
        reasons.append(
            f"peak {plan.peak_bytes / MiB:,.1f} MiB (steady {plan.steady_bytes / MiB:,.1f} MiB, load {plan.load_peak_bytes / MiB:,.1f} MiB) "
            f"exceeds the {available / MiB:,.1f} MiB available"
        )
        levers += _memory_levers(plan, cfg, quant, layout, one_seq_blocks)
    plan.reasons = reasons
    plan.levers = levers
    plan.admitted = not reasons
    if plan.admitted:
        plan.engine_config = EngineConfig(
            model=model_dir,
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_memory_bytes=kv_bytes,
            block_size=layout.block_size,
            quant=quant,
            weight_backend="w16" if widened else weight_backend,
            num_threads=num_threads,
            seed=seed,
            eos_token_ids=tuple(eos_token_ids),
            rope_model_positions=rope_model_positions,
            trim_after_load=trim_after_load,
            packed_head=packed_head,
        )
    return plan


def _resolve_quant(quantization: str | QuantConfig | None, cfg: ModelConfig) -> QuantConfig | None:
    if cfg.quantization_config is not None:
        from edge_infer.quant.sizes import resolve_checkpoint_quant

        return resolve_checkpoint_quant(quantization, cfg.quantization_config)
    if isinstance(quantization, QuantConfig):
        from edge_infer.quant.sizes import check_quant_config

        check_quant_config(quantization)
        return quantization
    if quantization in (None, "none"):
        return None
    if quantization in QUANT_METHODS:
        return QuantConfig.named(quantization)
    raise InvalidRequestError(f"quantization {quantization!r} is not supported; use {', '.join(QUANT_METHODS)} or none")


def _stored_16bit(cfg: ModelConfig, tensors: dict) -> str | None:
    """The checkpoint's weight dtype when every linear and the embedding table are stored in one 16-bit dtype."""
    names = [n for spec in weight_specs(cfg) if spec.is_linear or spec.target == "embed" for n in spec.sources]
    dtypes = {tensors[n].dtype for n in names}
    return {"BF16": "bfloat16", "F16": "float16"}.get(dtypes.pop()) if len(dtypes) == 1 else None


def _weights_note(cfg: ModelConfig, dtype: str, quant: QuantConfig | None, packed_head: bool,
                  widened: str | None = None) -> str:
    head = "tied to the embedding (one copy)" if cfg.tie_word_embeddings else "separate output head"
    if packed_head:
        head = "tied head kept twice: the embedding table and a packed copy for the head"
    if widened:
        return f"{widened} linears and table as stored (2 bytes), {dtype} activations and norms, {head}"
    if quant is None:
        return f"{dtype}, {head}"
    if quant.quantize_head:
        head = "int4 head, embedding rows read from it" if cfg.tie_word_embeddings else f"int4 head, {dtype} embedding"
    return f"{quant.name} g{quant.group_size} linears, {dtype} norms, {head}"


def _memory_levers(plan: TextPlan, cfg: ModelConfig, quant: QuantConfig | None, layout: KVLayout, one_seq_blocks: int) -> list[str]:
    out = []
    kv = plan.item("kv cache")
    if kv > one_seq_blocks * layout.bytes_per_block:
        out.append(f"--kv-cache-memory-bytes {one_seq_blocks * layout.bytes_per_block} (saves {(kv - one_seq_blocks * layout.bytes_per_block) / MiB:,.1f} MiB)")
    if plan.settings["max_model_len"] > 512:
        out.append("--max-model-len 512 (shrinks the KV need, RoPE tables and attention scratch)")
    if quant is None:
        out.append("--quantization cpu_int4 (4-bit linear weights, about a quarter of their bf16 bytes)")
    if plan.settings["max_num_batched_tokens"] > 128:
        out.append("--max-num-batched-tokens 128 (smaller activation peak)")
    return out
