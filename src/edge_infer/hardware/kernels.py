"""Which weight kernel each linear runs on, what CPU features it needs, and the dtype that is fast for it.

Every dtype, quantization and head option maps to a kernel here, with its ISA
needs. ``select_kernels`` resolves ``dtype="auto"`` per kernel and lists the
refusals (with the nearest choice that does run) and the notes the plan
shows. The speed facts behind the choices are measured by
``edge-infer bench kernels`` (committed in benchmarks/results/kernels-*.json):

- PyTorch's int4 kernel (tinygemm) is vectorized for bf16 activations only,
  and only for AVX2 and AVX-512: fp32 activations, or any CPU without AVX2,
  run a scalar loop at ~1 G multiply-adds/s, 15-35x below its bf16 path.
- Without native bf16 (avx512_bf16 / amx_bf16), dense bf16 products are
  emulated: ~10x slower than fp32 for a 64-token prefill, a little faster at
  one token (half the bytes to read).
- edge-infer's own kernels (W4A8, W8A8, and W16A32 for 16-bit checkpoints
  with fp32 activations) have one implementation per instruction set
  (``NATIVE_VARIANTS``), all giving the same bits. At one token they stream
  weights at the memory's speed on AVX2 as on AVX-512 (25-27 GB/s on one
  core of the development machine, whose plain read is 25 GB/s): W4A8 is
  2.5-4x tinygemm there; in cache or at 64 rows AVX2 runs at ~0.65x AVX-512.

Torch-free: the planner calls it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from edge_infer.hardware.cpu import CpuCapabilities


@dataclass(frozen=True)
class Variant:
    """One instruction-set implementation of a kernel (quant/csrc/isa_*.cpp)."""

    name: str  # as csrc/isa.h names it
    arch: str
    needs: tuple[str, ...]


@dataclass(frozen=True)
class Kernel:
    name: str  # as models.linear.WeightKernel.name reports it
    computes: str
    # Features needed per architecture; an architecture not listed has no implementation.
    needs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Where it is fast (architecture -> features); empty: fast wherever it runs. Elsewhere: ``slow_note``.
    fast_with: dict[str, tuple[str, ...]] = field(default_factory=dict)
    slow_note: str = ""
    # Instead of ``needs``: implementations per instruction set, fastest first; the kernel runs where one does.
    variants: tuple[Variant, ...] = ()

    def variant(self, cpu: CpuCapabilities, built: tuple[str, ...] | None = None) -> Variant | None:
        """The fastest variant ``cpu`` runs (of those ``built`` into the library, when it is known)."""
        return next((v for v in self.variants if v.arch == cpu.arch and cpu.has(*v.needs)
                     and (built is None or v.name in built)), None)

    def missing(self, cpu: CpuCapabilities) -> str | None:
        """Why this kernel cannot run on ``cpu``, or None."""
        if self.variants:
            here = [v for v in self.variants if v.arch == cpu.arch]
            if not here:
                return f"{self.name} has no implementation for {cpu.arch}"
            if self.variant(cpu) is None:
                least = here[-1]
                return (f"{self.name} needs {', '.join(cpu.missing(least.needs))} (its {least.name} variant), "
                        f"which this CPU lacks")
            return None
        if cpu.arch not in self.needs:
            return f"{self.name} has no implementation for {cpu.arch}"
        absent = cpu.missing(self.needs[cpu.arch])
        return f"{self.name} needs {', '.join(absent)}, which this CPU lacks" if absent else None

    def slow_path(self, cpu: CpuCapabilities) -> str | None:
        """Why this kernel runs slowly on ``cpu``, or None."""
        if not self.fast_with:
            return None
        if cpu.arch not in self.fast_with:
            return f"{self.name} on {cpu.arch}: {self.slow_note}"
        absent = cpu.missing(self.fast_with[cpu.arch])
        return f"{self.name} without {', '.join(absent)}: {self.slow_note}" if absent else None


# torch 2.13's tinygemm has vectorized code for AVX2 and AVX-512 only (none for aarch64).
_SCALAR_INT4 = "PyTorch's int4 kernel runs its scalar loop (~1 G multiply-adds/s, 15-35x below its AVX2/AVX-512 path)"
# edge-infer's own kernels (quant/csrc), fastest first; the scalar reference is not a serving path.
NATIVE_VARIANTS = (
    # avx512-vnni's kernels plus AMX-INT8 tile panels for prompt rows (isa_amx.h): Intel Xeon Sapphire Rapids on.
    Variant("amx-int8", "x86_64", ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_int8")),
    Variant("avx512-vnni", "x86_64", ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni")),
    Variant("avx-vnni", "x86_64", ("avx2", "fma", "f16c", "avx_vnni")),
    Variant("avx2", "x86_64", ("avx2", "fma", "f16c")),
    Variant("neon-dotprod", "aarch64", ("asimd", "dotprod")),
)
KERNELS = {
    "dense": Kernel("dense", "F.linear on a row-major weight (fp32 or bf16)", {"x86_64": (), "aarch64": ()}),
    "onednn-bf16": Kernel("onednn-bf16", "bf16 weight reordered once into oneDNN's blocked layout",
                          {"x86_64": ("avx512bw", "avx512vl", "avx512dq"), "aarch64": ("bf16",)}),
    "cpu-int4": Kernel("cpu-int4", "4-bit weights, bf16 activations: PyTorch's tinygemm (W4A16)",
                       {"x86_64": (), "aarch64": ()}, {"x86_64": ("avx2",)}, _SCALAR_INT4),
    "cpu-w4a16": Kernel("cpu-w4a16", "4-bit weights x fp32 activations: edge-infer's tile kernels (W4A16)",
                        variants=NATIVE_VARIANTS),
    "cpu-w4a8": Kernel("cpu-w4a8", "4-bit weights x int8 activations: edge-infer's int8 kernels (W4A8)",
                       variants=NATIVE_VARIANTS),
    "cpu-w8a8": Kernel("cpu-w8a8", "8-bit weights x int8 activations: edge-infer's int8 kernels (W8A8)",
                       variants=NATIVE_VARIANTS),
    "cpu-w16a32": Kernel("cpu-w16a32", "the checkpoint's 16-bit weights at 2 bytes, widened to fp32 in edge-infer's "
                         "kernel (W16A32)", variants=NATIVE_VARIANTS),
}
# Not a weight kernel: attention over bf16 activations (quant/csrc/attention.cpp), taken by prompt chunks and
# the media encoders where it runs (models/layers/native_ops.py), PyTorch's SDPA elsewhere.
BF16_ATTENTION = Kernel("bf16-attention", "bf16 attention on vdpbf16ps (prompt chunks, media encoders)",
                        {"x86_64": ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")})
QUANT_KERNELS = {"cpu_int4": "cpu-int4", "cpu_w4a16": "cpu-w4a16", "cpu_w4a8": "cpu-w4a8", "cpu_w8a8": "cpu-w8a8"}


def bf16_attention_route(cpu: CpuCapabilities) -> tuple[bool, str]:
    """Whether bf16 attention should take BF16_ATTENTION on ``cpu`` (when the library holds it), and why. With
    AMX-BF16, SDPA's products run on the tile unit (MKL's bf16 GEMM) and win: one image's request (a 3B thinker,
    W4A8) 2.46-2.55 s against 2.74-2.81 s on a 2-core Xeon, its ViT encode 1.17-1.21 s against 1.36-1.45."""
    missing = BF16_ATTENTION.missing(cpu)
    if missing is not None:
        return False, f"PyTorch's SDPA: {missing}"
    if cpu.has("amx_bf16"):
        return False, "PyTorch's SDPA: its bf16 products run on AMX-BF16 here, faster than edge-infer's kernel"
    return True, f"edge-infer's {BF16_ATTENTION.computes}"


@dataclass(frozen=True)
class KernelChoice:
    kind: str  # decoder linears | output head | embedding lookup
    kernel: str
    dtype: str
    why: str
    variant: str | None = None  # the instruction-set variant, for kernels that have several

    @property
    def label(self) -> str:
        return f"{self.kernel} [{self.variant}]" if self.variant else self.kernel


@dataclass
class KernelSelection:
    dtype: str
    choices: list[KernelChoice]
    refusals: list[str] = field(default_factory=list)  # each names the option and the nearest one that runs
    notes: list[str] = field(default_factory=list)

    def kernel_for(self, kind: str) -> str:
        return next(c.kernel for c in self.choices if c.kind == kind)

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "kernels": {c.kind: {"kernel": c.kernel, "variant": c.variant, "dtype": c.dtype, "why": c.why}
                                                 for c in self.choices},
                "refusals": list(self.refusals), "notes": list(self.notes)}


def auto_dtype(cpu: CpuCapabilities, quantization: str | None) -> tuple[str, str]:
    """(dtype, why) for ``dtype="auto"``: what is fast for the kernel that will run, on this CPU."""
    if quantization == "cpu_int4" and KERNELS["cpu-int4"].slow_path(cpu) is None:
        return "bfloat16", "PyTorch's int4 kernel is vectorized for bf16 activations only (fp32 runs its scalar loop)"
    if quantization in ("cpu_w4a8", "cpu_w8a8"):
        return "bfloat16", "the fused int8 decode layer takes bf16 activations (it converts them itself)"
    if quantization == "cpu_int4":
        return "float32", "PyTorch's int4 kernel has no vectorized path on this CPU; float32 keeps the rest native"
    if quantization == "cpu_w4a16":
        return "bfloat16", ("edge-infer's W4A16 kernel widens either dtype to fp32; in bf16 the unquantized head, the "
                            "embedding and the KV cache hold half the bytes (decode 30 against 19 tokens/s at the "
                            "Qwen2.5-0.5B shape on 2 Zen 3 cores, benchmarks/results/pp-tg-qwen2.5-0.5b-w4a16-zen3.json)")
    if cpu.arch == "x86_64" and cpu.native_bf16:
        return "bfloat16", "this CPU has native bf16 (avx512_bf16/amx_bf16)"
    if cpu.arch == "x86_64":
        return "float32", "no native bf16 on this CPU (no avx512_bf16/amx_bf16): bf16 would be emulated"
    return "float32", f"bf16 on {cpu.arch} is not measured by edge-infer yet; float32 is the known path"


def auto_encoder_quantization(cpu: CpuCapabilities, dtype: str, quantization: str | None,
                              native_library: bool = True) -> tuple[str, str]:
    """(choice, why) for a thinker's ``encoder_quantization="auto"``: dense towers in the engine's dtype, unless
    that is bf16 on a CPU without native bf16 while the decoder is quantized (dtype auto's bf16 for its kernels):
    the towers then take the decoder's int8 kernel, not PyTorch's emulated bf16 products (a 448x448 image's TTFT at
    the Qwen2.5-Omni-3B shape under the AVX2 mask: 7.0 s, not 32 s); beside an int4 decoder, edge-infer's W4A8
    kernel where its library builds (``native_library``), else the decoder's int4 kernel."""
    if dtype != "bfloat16" or cpu.native_bf16 or quantization is None:
        return "none", f"dense {dtype} towers"
    emulated = "dense bfloat16 towers would run emulated on this CPU (no avx512_bf16/amx_bf16)"
    if quantization in ("cpu_w4a8", "cpu_w8a8"):
        return "same", f"{emulated}; they take the decoder's {quantization}"
    if native_library and KERNELS["cpu-w4a8"].missing(cpu) is None:
        return "cpu_w4a8", (f"{emulated}; they take edge-infer's cpu_w4a8, whose int8 products run a prompt at "
                            f"about 2.5x the fp32 BLAS {quantization}'s prompts take here")
    return "same", f"{emulated}; they take the decoder's {quantization}"


def select_kernels(
    cpu: CpuCapabilities,
    dtype: str,
    quantization: str | None,
    quantize_head: bool = False,
    tied: bool = False,
    packed_head: bool = False,
    weight_backend: str = "auto",
    dtype_explicit: bool = False,
    built_variants: tuple[str, ...] | None = None,
    stored_16bit: str | None = None,
) -> KernelSelection:
    """The kernel of each linear kind for these options on ``cpu``; ``dtype`` is resolved (not "auto"),
    ``dtype_explicit`` when the user chose it; ``built_variants``: the ISA variants in edge-infer's built
    kernel library (quant.native_build.built_variants), when known; ``stored_16bit``: the checkpoint's
    weight dtype (bfloat16 or float16) when all its weights are 16-bit."""
    refusals: list[str] = []
    notes: list[str] = []
    onednn = KERNELS["onednn-bf16"]
    if weight_backend == "onednn" and onednn.missing(cpu):
        refusals.append(f"--weight-backend onednn: {onednn.missing(cpu)}; use --weight-backend dense")
    use_onednn = dtype == "bfloat16" and weight_backend != "dense" and onednn.missing(cpu) is None
    dense_kernel = "onednn-bf16" if use_onednn else "dense"
    dense_why = "bf16 in oneDNN's blocked layout (faster matrix-vector products)" if use_onednn else f"{dtype} F.linear"
    widened = _widened_variant(cpu, dtype, quantization, weight_backend, built_variants, stored_16bit, refusals, notes)

    if dtype == "bfloat16" and not cpu.native_bf16:
        if quantization is None:
            notes.append("bfloat16 is emulated on this CPU (no avx512_bf16/amx_bf16/bf16): dense products run ~10x "
                         "slower at prefill than float32 (benchmarks/results/kernels-*.json)"
                         + ("; drop --dtype to let auto choose" if dtype_explicit else ""))
        else:
            notes.append("bfloat16 is emulated on this CPU (no avx512_bf16/amx_bf16/bf16) for attention and norms; "
                         f"the {QUANT_KERNELS[quantization]} linears take bf16 activations on their fast path")
    choices: list[KernelChoice] = []
    w16 = KERNELS["cpu-w16a32"]
    if widened is not None:
        choices.append(KernelChoice("decoder linears", w16.name, dtype, w16.computes, widened))
    elif quantization is None:
        choices.append(KernelChoice("decoder linears", dense_kernel, dtype, dense_why))
    else:
        choices.append(_quantized_choice("decoder linears", "--quantization", cpu, dtype, quantization, built_variants,
                                         refusals, notes))

    if quantize_head and quantization is not None:
        head = replace(choices[0], kind="output head", why="quantized like the decoder linears")
        lookup = ("rows read back from the quantized head (one copy)" if tied else "the embedding table")
        choices += [head, replace(choices[0], kind="embedding lookup", why=lookup) if tied
                    else KernelChoice("embedding lookup", "table", dtype, lookup)]
    elif packed_head and tied:
        reason = onednn.missing(cpu) if dtype == "bfloat16" else "--packed-head packs for the oneDNN bf16 kernel; it needs --dtype bfloat16"
        if reason is not None:
            refusals.append(f"--packed-head: {reason}; drop --packed-head (the head then reads the embedding table)")
        choices += [KernelChoice("output head", "onednn-bf16", dtype, "a second, packed copy of the embedding table"),
                    KernelChoice("embedding lookup", "table", dtype, "the embedding table")]
    elif widened is not None:
        head = replace(choices[0], kind="output head", why=("holds the tied table once, 16-bit" if tied else w16.computes))
        lookup = (replace(choices[0], kind="embedding lookup", why="rows read back from the head (one copy)") if tied
                  else KernelChoice("embedding lookup", "table", stored_16bit, "the 16-bit table, rows widened at lookup"))
        choices += [head, lookup]
    else:
        head_why = "reads the embedding table (tied, one copy)" if tied else dense_why
        choices += [KernelChoice("output head", "dense" if tied else dense_kernel, dtype, head_why),
                    KernelChoice("embedding lookup", "table", dtype, "the embedding table")]
    return KernelSelection(dtype, choices, refusals, notes)


def _quantized_choice(kind: str, option: str, cpu: CpuCapabilities, dtype: str, quantization: str,
                      built_variants: tuple[str, ...] | None, refusals: list[str], notes: list[str]) -> KernelChoice:
    """The kernel of ``quantization`` for one kind of linear (set by ``option``), with its refusals and notes."""
    kernel = KERNELS[QUANT_KERNELS[quantization]]
    reason = kernel.missing(cpu)
    if reason is not None:
        refusals.append(f"{option} {quantization}: {reason}; {_nearest_quant(cpu, quantization, option)}")
    slow = kernel.slow_path(cpu)
    if slow:
        notes.append(f"{option} {quantization}: {slow}")
    if quantization == "cpu_int4" and dtype == "float32" and slow is None:
        notes.append(f"cpu_int4 with float32 activations: {_SCALAR_INT4}; drop --dtype to let auto choose bfloat16")
    variant = kernel.variant(cpu, built_variants)
    best = kernel.variant(cpu)
    if reason is None and kernel.variants and variant != best:
        if variant is None:
            refusals.append(f"{option} {quantization}: the built kernel library lacks the {best.name} variant "
                            f"(its compiler could not build it) and holds none other this CPU runs; use cpu_int4")
        else:
            notes.append(f"{option} {quantization}: runs the {variant.name} variant; the built kernel library "
                         f"lacks {best.name} (its compiler could not build it)")
    return KernelChoice(kind, kernel.name, dtype, kernel.computes, variant.name if variant else None)


def encoder_kernels(cpu: CpuCapabilities, dtype: str, quantization: str | None, weight_backend: str = "auto",
                    built_variants: tuple[str, ...] | None = None) -> KernelSelection:
    """The kernel of a multimodal thinker's tower linears (``--encoder-quantization``, resolved to a method name or
    None for dense weights in ``dtype``), with the refusals and notes the plan shows."""
    refusals: list[str] = []
    notes: list[str] = []
    if quantization is None:
        use_onednn = (dtype == "bfloat16" and weight_backend not in ("dense", "w16")
                      and KERNELS["onednn-bf16"].missing(cpu) is None)
        choice = (KernelChoice("encoder linears", "onednn-bf16", dtype, "bf16 in oneDNN's blocked layout") if use_onednn
                  else KernelChoice("encoder linears", "dense", dtype, f"{dtype} F.linear"))
    else:
        choice = _quantized_choice("encoder linears", "--encoder-quantization", cpu, dtype, quantization,
                                   built_variants, refusals, notes)
    return KernelSelection(dtype, [choice], refusals, notes)


def _widened_variant(cpu: CpuCapabilities, dtype: str, quantization: str | None, weight_backend: str,
                     built_variants: tuple[str, ...] | None, stored_16bit: str | None, refusals: list[str],
                     notes: list[str]) -> str | None:
    """The W16A32 variant when a 16-bit checkpoint runs with float32 activations (its weights then stay at 2 bytes),
    else None; where it cannot run, the doubled bytes are said (or, when asked for by name, refused)."""
    asked = weight_backend == "w16"
    if quantization is not None or dtype != "float32" or stored_16bit is None or weight_backend not in ("auto", "w16"):
        if asked:
            refusals.append("--weight-backend w16 keeps a 16-bit checkpoint's weights for float32 activations; this "
                            "load is quantized, bfloat16 or from 32-bit weights: drop --weight-backend")
        return None
    kernel = KERNELS["cpu-w16a32"]
    variant = kernel.variant(cpu, built_variants)
    if variant is not None:
        return variant.name
    reason = kernel.missing(cpu) or "the built kernel library holds no variant this CPU runs"
    if asked:
        refusals.append(f"--weight-backend w16: {reason}; use --weight-backend dense")
    else:
        notes.append(f"the checkpoint's {stored_16bit} weights are held in float32, twice their bytes ({reason}); "
                     f"--quantization cpu_int4 would shrink them instead")
    return None


def _nearest_quant(cpu: CpuCapabilities, refused: str, option: str = "--quantization") -> str:
    """The nearest quantization that runs on ``cpu``, as advice."""
    for name in ("cpu_w4a8", "cpu_int4"):
        kernel = KERNELS[QUANT_KERNELS[name]]
        if name != refused and kernel.missing(cpu) is None:
            slow = kernel.slow_path(cpu)
            return f"use {option} {name} (same checkpoint, runs here{', slowly: ' + slow if slow else ''})"
    return f"load without {option}"
