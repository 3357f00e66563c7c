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

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from edge_infer.config import (
    ENCODER_QUANTIZATION_CHOICES, KV_CACHE_DTYPES, QUANT_METHODS, EngineConfig, QuantConfig, encoder_quant_config,
)
from edge_infer.errors import InvalidRequestError
from edge_infer.hardware.cpu import CpuCapabilities, detect
from edge_infer.hardware.kernels import KernelSelection, auto_encoder_quantization, encoder_kernels, select_kernels
from edge_infer.hardware.memory import available_memory_bytes
from edge_infer.media.limits import MediaLimits
from edge_infer.memory.encoder_sizing import linear_accumulator_bytes
from edge_infer.memory.sizing import (
    CHECKPOINT_DTYPE_BYTES, MiB, activation_bytes, load_transient_bytes, resolve_dtype,
    request_bodies_bytes, runtime_overhead, weight_bytes,
)
from edge_infer.models.checkpoint import check_checkpoint
from edge_infer.models.config import ModelConfig
from edge_infer.models.layers.kv_cache import DEFAULT_BLOCK_SIZE, KVLayout
from edge_infer.models.weights import weight_specs
from edge_infer.quant.sizes import stored_towers

if TYPE_CHECKING:
    from edge_infer.memory.media_plan import MediaPlan

DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_MAX_NUM_SEQS = 8
DEFAULT_MAX_NUM_BATCHED_TOKENS = 512
# Share of the memory left after everything else that a default KV budget may take.
DEFAULT_KV_SHARE = 0.5
# The weights: the text decoder's, and each tower's of a multimodal thinker.
WEIGHT_ITEMS = frozenset({"weights", "vision encoder weights", "audio encoder weights"})
# What the process that runs a thinker's towers holds: their weights, one encode and the frontend's preparing of
# requests (an encoder stage, or the text engine when it loads the towers itself).
TOWER_ITEMS = frozenset({"vision encoder weights", "audio encoder weights", "encoder activations", "block cache",
                         "media preprocessing"})
# What is resident while the weights load: the load peak's items.
LOAD_ITEMS = WEIGHT_ITEMS | {"runtime overhead", "load transient"}


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
    model_config: ModelConfig | None = None  # config.json as parsed once, for the frontend
    media_limits: MediaLimits | None = None  # a multimodal model's per-request limits, as sized (None: text only)
    media_kinds: tuple[str, ...] | None = None  # the media kinds it takes, as its chat template renders (None: its family's)

    def item(self, name: str) -> int:
        return next(i.bytes for i in self.items if i.name == name)

    @property
    def weight_bytes(self) -> int:
        """Every resident weight: the decoder's ("weights") and a thinker's towers' ("vision encoder weights",
        "audio encoder weights"); what the engine reports as ``ReadyInfo.weight_bytes``."""
        return sum(i.bytes for i in self.items if i.name in WEIGHT_ITEMS)

    def items_bytes(self, names: frozenset[str]) -> int:
        """The steady bytes of the items named ``names``."""
        return sum(i.bytes for i in self.items if i.name in names and i.phase == "steady")

    @property
    def steady_bytes(self) -> int:
        """Serving at full load: everything but the load-only transient."""
        return sum(i.bytes for i in self.items if i.phase == "steady" and i.pool == "anon")

    @property
    def load_peak_bytes(self) -> int:
        """While loading: overhead + weights (the decoder's and the encoders') + transient (KV is allocated after)."""
        return sum(i.bytes for i in self.items if i.name in LOAD_ITEMS)

    @property
    def peak_bytes(self) -> int:
        return max(self.steady_bytes, self.load_peak_bytes)

    def ledger_items(self) -> dict[str, int]:
        """The steady state as a shared-RAM ledger's items (memory/ledger.py): the weights, the KV cache, the
        process, and the rest (activations, RoPE tables, request bodies, a thinker's media and encodes) as buffers."""
        weights, kv, runtime = self.weight_bytes, self.item("kv cache"), self.item("runtime overhead")
        return dict(weights_bytes=weights, kv_bytes=kv, runtime_bytes=runtime,
                    buffers_bytes=self.steady_bytes - weights - kv - runtime)

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
    packed_head: bool = False,
    cpu: CpuCapabilities | None = None,
    priority: str | None = None,
    prefix_caching: bool = True,
    kv_cache_dtype: str = "auto",
    encoder_threads: int | None = None,
    encoder_quantization: str | None = None,
    media_limits: MediaLimits | Mapping[str, float] | None = None,
    body_bytes_in_flight: int = 0,
) -> TextPlan:
    """Plan a text session; see the module docstring. Raises only for unreadable checkpoints and unknown settings.

    ``encoder_quantization`` (a multimodal thinker; ``config.ENCODER_QUANTIZATION_CHOICES``): the towers'
    weight path — none (dense in ``dtype``), same (the decoder's), or a method. Their items are sized as that
    kernel holds them, the kernel is listed beside the decoder's, and one this CPU cannot run is refused with
    the nearest that runs. A text model notes that it does nothing.

    ``media_limits`` (a multimodal thinker): what one request may carry, which the plan sizes the encoders
    for. A ``MediaLimits`` is taken as given; a mapping (e.g. ``{"max_image_pixels": 448 * 448}``) sets
    those limits and leaves the others at the checkpoint's defaults, lowered where a request at all the
    limits would not fit ``max_model_len`` (memory/media_plan.py). A text model ignores it.

    ``body_bytes_in_flight`` (a server: its ``--max-body-bytes-in-flight``): the request bodies its requests in
    flight may hold at once, planned at the RssAnon a server process holds per body byte (measured).

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
                        frontend=frontend, packed_head=packed_head, prefix_caching=prefix_caching,
                        kv_cache_dtype=kv_cache_dtype, encoder_threads=encoder_threads,
                        encoder_quantization=encoder_quantization, media_limits=media_limits,
                        body_bytes_in_flight=body_bytes_in_flight)
        stored_format = (cfg.quantization_config or {}).get("quant_method")
        return plan_auto(plan_text_session, model_dir, priority, cpu or detect(), stored_format, **settings)
    if frontend not in ("library", "server"):
        raise InvalidRequestError(f"frontend must be 'library' or 'server', got {frontend!r}")
    if body_bytes_in_flight < 0 or (body_bytes_in_flight and frontend != "server"):
        raise InvalidRequestError("body_bytes_in_flight is a server's budget of request bodies: a non-negative "
                                  f"number with frontend='server', got {body_bytes_in_flight} with {frontend!r}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise InvalidRequestError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    r = _resolve(cfg, model_dir, quantization, dtype, cpu or detect(), weight_backend, packed_head, priority,
                 max_model_len, max_num_seqs, max_num_batched_tokens, encoder_quantization)
    items, layout = _size_items(r, model_dir, frontend, kv_cache_dtype == "int8")
    if body_bytes_in_flight:
        items.append(_bodies_item(body_bytes_in_flight))
    media = _media(r, model_dir, media_limits, items)
    available = available_bytes if available_bytes is not None else available_memory_bytes()
    kv_blocks = _kv_blocks(r, layout, items, available, kv_cache_memory_bytes)
    items.insert(next(n for n, i in enumerate(items) if i.name == "rope tables"), _kv_item(layout, kv_blocks))
    plan = _admit(r, model_dir, items, layout, available)
    plan.settings["prefix_caching"] = prefix_caching
    plan.settings["kv_cache_dtype"] = "int8" if layout.int8 else r.dtype
    if media is not None:
        plan.settings["encoder_quantization"] = r.encoder_quantization
        plan.media_limits = media.limits
        plan.media_kinds = media.kinds
        plan.settings["media_limits"] = media.settings()
        plan.settings["media_sized_for"] = media.sized_for()
    if plan.admitted:
        plan.engine_config = EngineConfig(
            model=model_dir, dtype=r.dtype, max_model_len=r.max_model_len, max_num_seqs=r.max_num_seqs,
            max_num_batched_tokens=r.max_num_batched_tokens, kv_cache_memory_bytes=kv_blocks * layout.bytes_per_block,
            block_size=layout.block_size, quant=r.quant, weight_backend="w16" if r.widened else weight_backend,
            num_threads=num_threads, seed=seed, eos_token_ids=tuple(eos_token_ids), packed_head=r.packed_head,
            prefix_caching=prefix_caching, kv_cache_dtype=kv_cache_dtype, encoder_threads=encoder_threads,
            encoder_quantization=r.encoder_quantization,
            block_cache_bytes=plan.item("block cache") if media is not None else 0,
        )
    return plan


@dataclass
class _Resolved:
    """The settings a plan runs with, and what resolving them said (notes, refusals, levers)."""

    cfg: ModelConfig
    tensors: dict
    cpu: CpuCapabilities
    quant: QuantConfig | None
    dtype: str
    kernels: KernelSelection
    widened: bool  # 16-bit weights kept as stored, on the W16A32 kernel
    stored_16bit: str | None
    packed_head: bool
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    notes: list[str]
    reasons: list[str]
    levers: list[str]
    encoder_quantization: str = "none"  # the towers' weight path as asked (a thinker)
    encoder_quant: QuantConfig | None = None  # ... as their kernel holds it; None: dense in dtype

    @property
    def dtype_bytes(self) -> int:
        return 2 if self.dtype == "bfloat16" else 4


def _resolve(cfg: ModelConfig, model_dir: str, quantization: str | QuantConfig | None, dtype: str | None,
             cpu: CpuCapabilities, weight_backend: str, packed_head: bool, priority: str | None,
             max_model_len: int | None, max_num_seqs: int | None, max_num_batched_tokens: int | None,
             encoder_quantization: str | None) -> _Resolved:
    """The dtype, quantization and kernels (the decoder's and a thinker's towers'; refused where this CPU cannot
    run them) and the batch shape."""
    tensors = check_checkpoint(cfg, model_dir, weight_specs(cfg))
    notes: list[str] = []
    reasons: list[str] = []
    levers: list[str] = []
    quant = _resolve_quant(quantization, cfg)
    dtype_explicit = dtype not in (None, "auto")
    dtype = resolve_dtype(dtype, notes, quant.name if quant else None, cpu)
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
    native_kernel = kernels.kernel_for("decoder linears") in ("cpu-w4a8", "cpu-w8a8", "cpu-w4a16", "cpu-w16a32")
    if native_kernel and not kernels.refusals and (why := native_build.missing_toolchain()) is not None:
        if quant is not None:
            reasons.append(f"--quantization {quant.name}: {why}")
        else:  # the 16-bit path is an optimisation: without it the weights are held in float32, and the plan says so
            kernels = select_kernels(cpu, dtype, None, tied=cfg.tie_word_embeddings, packed_head=packed_head,
                                     weight_backend="dense", dtype_explicit=dtype_explicit)
            notes.append(f"the checkpoint's {stored_16bit} weights are held in float32, twice their bytes: {why}")
    encoder_choice = encoder_quantization or "auto"
    if cfg.multimodal is not None and stored_towers(cfg.quantization_config):
        encoder_choice = _stored_towers_choice(encoder_choice, quant, notes, reasons)
    elif encoder_choice == "auto" and cfg.multimodal is not None:
        encoder_choice, why = auto_encoder_quantization(cpu, dtype, quant.name if quant else None,
                                                        native_library=native_build.missing_toolchain() is None)
        notes.append(f"encoder_quantization auto -> {encoder_choice}: {why}")
    elif encoder_choice == "auto":
        encoder_choice = "none"
    encoder_quant = _resolve_towers(cfg, encoder_choice, quant, cpu, dtype, weight_backend, built, kernels, notes,
                                    reasons)

    model_max = cfg.max_position_embeddings
    if max_model_len is None:
        max_model_len = min(model_max, DEFAULT_MAX_MODEL_LEN)
        if max_model_len < model_max:
            notes.append(f"max_model_len defaulted to {max_model_len} (the model allows {model_max}); set it to change")
    # None takes the default; 0 is refused below, not quietly the default
    max_num_seqs = DEFAULT_MAX_NUM_SEQS if max_num_seqs is None else max_num_seqs
    max_num_batched_tokens = DEFAULT_MAX_NUM_BATCHED_TOKENS if max_num_batched_tokens is None else max_num_batched_tokens
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
    packed_head = packed_head and cfg.tie_word_embeddings and not (quant is not None and quant.quantize_head)
    return _Resolved(cfg, tensors, cpu, quant, dtype, kernels, kernels.kernel_for("decoder linears") == "cpu-w16a32",
                     stored_16bit, packed_head, max_model_len, max_num_seqs, max_num_batched_tokens, notes, reasons, levers,
                     encoder_choice, encoder_quant)


def _stored_towers_choice(choice: str, quant: QuantConfig, notes: list[str], reasons: list[str]) -> str:
    """Towers stored as codes (`edge-infer quantize --towers`) run on the decoder's kernel: ``same``; another
    choice is refused, and the plan sized as for ``same``."""
    if choice in ("auto", "same", quant.name):
        if choice != "same":
            notes.append(f"encoder_quantization {choice} -> same: the towers are stored as {quant.bits}-bit codes with "
                         f"the decoder's and run on its kernel ({quant.name})")
    else:
        reasons.append(f"--encoder-quantization {choice}: this checkpoint's towers are stored as {quant.bits}-bit codes "
                       f"(edge-infer quantize --towers) and run on the decoder's kernel only; use --encoder-quantization "
                       f"same, or load the original checkpoint")
    return "same"


def _resolve_towers(cfg: ModelConfig, choice: str, quant: QuantConfig | None, cpu: CpuCapabilities, dtype: str,
                    weight_backend: str, built: tuple[str, ...] | None, kernels: KernelSelection, notes: list[str],
                    reasons: list[str]) -> QuantConfig | None:
    """A thinker's towers' weight path (``--encoder-quantization choice``): their kernel listed with the
    decoder's, refused (with the nearest that runs) where this CPU cannot run it; None for dense weights."""
    if choice not in ENCODER_QUANTIZATION_CHOICES:
        raise InvalidRequestError(f"encoder_quantization {choice!r} is not supported; use one of "
                                  f"{', '.join(ENCODER_QUANTIZATION_CHOICES)}")
    if cfg.multimodal is None:
        if choice != "none":
            notes.append(f"--encoder-quantization {choice} does nothing: {cfg.architecture} has no media encoders")
        return None
    towers = encoder_quant_config(choice, quant)
    selection = encoder_kernels(cpu, dtype, towers.name if towers else None, weight_backend, built)
    if towers is not None and towers.tiles and not selection.refusals:
        from edge_infer.quant import native_build

        if (why := native_build.missing_toolchain()) is not None:
            selection.refusals.append(f"--encoder-quantization {towers.name}: {why}")
    kernels.choices += selection.choices
    kernels.refusals += selection.refusals
    notes += selection.notes
    reasons += selection.refusals
    return towers


def _size_items(r: _Resolved, model_dir: str, frontend: str, int8_kv: bool) -> tuple[list[PlanItem], KVLayout]:
    """Every item but the KV cache (its blocks depend on what is left), and the KV layout."""
    cfg = r.cfg
    overhead = runtime_overhead()
    tokenizer_json = Path(model_dir) / "tokenizer.json"
    json_bytes = tokenizer_json.stat().st_size if tokenizer_json.exists() else 0
    tok_bytes = int(overhead["tokenizer_bytes_per_json_byte"] * json_bytes)
    # the worker's structured-output view of the tokenizer (engine/grammar.py), built on the first constrained request
    grammar_bytes = int(overhead["grammar_tokenizer_fixed_bytes"] + overhead["grammar_tokenizer_bytes_per_json_byte"] * json_bytes)
    frontend_bytes = overhead["server_frontend_bytes" if frontend == "server" else "frontend_bytes"]
    overhead_bytes = frontend_bytes + overhead["worker_bytes"] + tok_bytes + grammar_bytes
    weights, largest_linear = weight_bytes(cfg, r.dtype_bytes, r.quant, r.widened)
    if r.packed_head:
        weights += cfg.vocab_size * cfg.hidden_size * r.dtype_bytes  # the head's own copy beside the embedding
    # M-RoPE positions are not bounded by the context (a video's advance by seconds): no table, cos/sin per step
    rope = 0 if cfg.mrope_section else 2 * r.max_model_len * cfg.head_dim * 4
    acts = activation_bytes(cfg, r.dtype_bytes, r.max_num_batched_tokens, r.max_num_seqs, r.max_model_len,
                            r.quant.name if r.quant is not None else None)
    acts_note = f"one step of {r.max_num_batched_tokens} tokens, {r.max_num_seqs} logit rows"
    if r.kernels.kernel_for("decoder linears") == "onednn-bf16" and (
            accumulator := linear_accumulator_bytes(r.dtype_bytes, r.cpu)):
        # emulated, oneDNN's bf16 linear holds an fp32 copy of its whole output while it runs: the fused gate/up's
        acts += r.max_num_batched_tokens * 2 * cfg.intermediate_size * accumulator
        acts_note += ", oneDNN's fp32 copy of the gate/up output (bf16 emulated on this CPU)"
    if r.quant is not None or r.encoder_quant is not None:
        from edge_infer.quant.sizes import PROMPT_BLOCK_ROWS, int4_prompt_bytes, int4_prompt_widths

        decoder, towers = int4_prompt_widths(weight_specs(cfg), r.quant, r.encoder_quant)
        # A prompt step's rows, and an encode's (an image's patches: a whole block); an encode may overlap a step.
        prompt_blocks = (int4_prompt_bytes(r.max_num_batched_tokens, decoder, r.dtype_bytes, r.cpu.native_bf16)
                         + int4_prompt_bytes(PROMPT_BLOCK_ROWS, towers, r.dtype_bytes, r.cpu.native_bf16))
        if prompt_blocks:
            acts += prompt_blocks
            acts_note += ", the int4 prompt path's dequantized weight blocks"
    if int8_kv:  # attention reads one sequence's K and V back at the compute dtype, a layer at a time
        acts += 2 * r.max_model_len * cfg.num_key_value_heads * cfg.head_dim * r.dtype_bytes
        acts_note += f", one {r.max_model_len}-token sequence's int8 K/V read back"
        if r.quant is not None and r.quant.int8_activations:
            r.notes.append("kv cache int8: decode runs the model's layers, not the fused int8 decode layer (it reads a "
                           "16-bit cache); expect slower decode than with --kv-cache-dtype auto")
    src_bytes = max((CHECKPOINT_DTYPE_BYTES.get(t.dtype, 4) for t in r.tensors.values()), default=4)
    transient = load_transient_bytes(cfg, r.quant, r.widened, largest_linear, src_bytes, r.dtype_bytes)
    file_bytes = sum(t.file.stat().st_size for t in {t.file: t for t in r.tensors.values()}.values())
    layout = KVLayout.for_model(cfg, r.dtype_bytes, DEFAULT_BLOCK_SIZE, int8=int8_kv)
    weights_note = _weights_note(cfg, r.dtype, r.quant, r.packed_head, r.widened and r.stored_16bit)
    if cfg.multimodal is not None:
        weights_note += "; the text decoder (the media encoders are items of their own)"
    return [
        PlanItem("runtime overhead", overhead_bytes, "anon", "steady", f"{frontend} frontend + worker + tokenizer + its structured-output view (measured once)"),
        PlanItem("weights", weights, "anon", "steady", weights_note),
        PlanItem("rope tables", rope, "anon", "steady", "none: M-RoPE cos/sin are computed per step" if cfg.mrope_section
                 else f"cos+sin fp32 for {r.max_model_len} positions"),
        PlanItem("activations", acts, "anon", "steady", acts_note),
        PlanItem("load transient", transient, "anon", "load", "one block being converted + the largest linear being repacked"),
        PlanItem("checkpoint pages", file_bytes, "file", "load", "memory-mapped while loading; page cache, released after"),
    ], layout


def _bodies_item(in_flight: int) -> PlanItem:
    per_byte = runtime_overhead()["server_bytes_per_body_byte"]
    return PlanItem("request bodies", request_bodies_bytes(in_flight), "anon", "steady",
                    f"the bodies of the requests in flight, at most {in_flight / MiB:,.1f} MiB "
                    f"(--max-body-bytes-in-flight), held raw and parsed until their responses end: {per_byte:g} bytes "
                    "per body byte (JSON items counted as the bytes they parse to)")


def _media(r: _Resolved, model_dir: str, limits: MediaLimits | Mapping[str, float] | None,
           items: list[PlanItem]) -> MediaPlan | None:
    """A thinker's media items, placed after the decoder's weights and activations; None for a text model."""
    if r.cfg.multimodal is None:
        return None
    from edge_infer.memory.media_plan import plan_media

    media = plan_media(model_dir, r.cfg, r.tensors, r.dtype, r.max_model_len, r.max_num_seqs, limits, r.encoder_quant,
                       r.cpu)
    weights = [i for i in media.items if i.name in WEIGHT_ITEMS]
    at = next(n for n, i in enumerate(items) if i.name == "weights") + 1
    items[at:at] = weights
    at = next(n for n, i in enumerate(items) if i.name == "activations") + 1
    items[at:at] = [i for i in media.items if i not in weights]
    transient = next(i for i in items if i.name == "load transient")
    transient.bytes = max(transient.bytes, media.load_transient)  # one load: the towers' linears among the rest
    r.notes += media.notes
    r.reasons += media.reasons
    r.levers += media.levers
    return media


def _kv_blocks(r: _Resolved, layout: KVLayout, items: list[PlanItem], available: int, budget: int | None) -> int:
    """KV blocks: the budget's whole blocks, or by default room for every sequence at full length, at most half
    of the memory the other steady items leave; refusals when one full-length sequence does not fit."""
    one_seq_blocks = layout.blocks_for_tokens(r.max_model_len)
    if budget is None:
        others = sum(i.bytes for i in items if i.phase == "steady")
        wanted = one_seq_blocks * r.max_num_seqs
        share = int(max(0, available - others) * DEFAULT_KV_SHARE) // layout.bytes_per_block
        kv_blocks = max(min(wanted, share), one_seq_blocks)
        r.notes.append(
            f"kv_cache_memory_bytes defaulted to {kv_blocks * layout.bytes_per_block:,} "
            f"({kv_blocks * layout.block_size} tokens; at most half of the memory left after the rest)"
        )
    else:
        kv_blocks = layout.blocks_for_budget(int(budget))
        if kv_blocks * layout.bytes_per_block != budget:
            r.notes.append(
                f"kv_cache_memory_bytes={budget:,} holds {kv_blocks} whole blocks of "
                f"{layout.bytes_per_block:,} bytes: {kv_blocks * layout.bytes_per_block:,} bytes are allocated"
            )
    kv_tokens = kv_blocks * layout.block_size
    if kv_blocks < one_seq_blocks:
        r.reasons.append(
            f"the KV budget holds {kv_tokens} tokens, less than one sequence of max_model_len={r.max_model_len} "
            f"({one_seq_blocks * layout.bytes_per_block:,} bytes needed)"
        )
        r.levers.append(f"--kv-cache-memory-bytes {one_seq_blocks * layout.bytes_per_block} (one full-length sequence)")
        r.levers.append(f"--max-model-len {max(layout.block_size, kv_tokens)} (what this KV budget holds)")
    elif kv_tokens < r.max_model_len * r.max_num_seqs:
        r.notes.append(
            f"KV cache holds {kv_tokens} tokens: {kv_tokens // r.max_model_len} of {r.max_num_seqs} sequences at full "
            f"length at once; beyond that, newer sequences wait or are preempted and recomputed"
        )
    return kv_blocks


def _kv_item(layout: KVLayout, kv_blocks: int) -> PlanItem:
    return PlanItem("kv cache", kv_blocks * layout.bytes_per_block, "anon", "steady",
                    f"{kv_blocks} blocks x {layout.bytes_per_block:,} B = {kv_blocks * layout.block_size} tokens")


def _admit(r: _Resolved, model_dir: str, items: list[PlanItem], layout: KVLayout, available: int) -> TextPlan:
    """The plan: admitted when nothing refused it and its peak fits what is available."""
    kv = next(i for i in items if i.name == "kv cache")
    q = r.quant
    plan = TextPlan(
        model=model_dir,
        settings={
            "dtype": r.dtype,
            "quantization": None if q is None else f"{q.name} g{q.group_size} {'sym' if q.symmetric else 'asym'}{' +head' if q.quantize_head else ''}",
            "max_model_len": r.max_model_len,
            "max_num_seqs": r.max_num_seqs,
            "max_num_batched_tokens": r.max_num_batched_tokens,
            "kv_cache_memory_bytes": kv.bytes,
            "kv_cache_tokens": kv.bytes // layout.bytes_per_block * layout.block_size,
            "architecture": r.cfg.architecture,
        },
        items=items, available_bytes=available, admitted=False, notes=r.notes, cpu=r.cpu, kernels=r.kernels,
        model_config=r.cfg,
    )
    if plan.peak_bytes > available:
        r.reasons.append(
            f"peak {plan.peak_bytes / MiB:,.1f} MiB (steady {plan.steady_bytes / MiB:,.1f} MiB, load {plan.load_peak_bytes / MiB:,.1f} MiB) "
            f"exceeds the {available / MiB:,.1f} MiB available"
        )
        r.levers += _memory_levers(plan, q, layout, layout.blocks_for_tokens(r.max_model_len))
    plan.reasons, plan.levers, plan.admitted = r.reasons, r.levers, not r.reasons
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
        head = (f"{quant.bits}-bit head, embedding rows read from it" if cfg.tie_word_embeddings
                else f"{quant.bits}-bit head, {dtype} embedding")
    return f"{quant.name} g{quant.group_size} linears, {dtype} norms, {head}"


def _memory_levers(plan: TextPlan, quant: QuantConfig | None, layout: KVLayout, one_seq_blocks: int) -> list[str]:
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
