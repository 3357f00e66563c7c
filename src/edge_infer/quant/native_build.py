"""Building edge-infer's native kernels (``csrc/``): sources and flags per ISA variant, the cache, the build.

The ISA variants (``csrc/isa_*.cpp``) are plain C++, each compiled on its own
with its instruction-set flags; the PyTorch binding (``linear.cpp``,
``decode_layer.cpp``, ...) is compiled with the baseline flags against
PyTorch's headers and linked with them into one shared library. A variant
the compiler cannot build (an old compiler without ``-mavxvnni``, say) is
left out and named in the log; the scalar reference and the binding must
build.

Torch-free, so the planner can refuse before loading when the library is
neither built nor buildable. The library is compiled on first use in a
child process (a C++ compiler needed) and cached under
``EDGE_INFER_KERNEL_CACHE`` or ``~/.cache/edge-infer/kernels``, keyed by a
hash of the sources, the flags, the architecture and the torch version.
The sources compile on all the cores there are at once, and PyTorch's
headers (about 10 s of a core for each binding source) are parsed once
into a precompiled header: 51-54 s on 2 AVX2 cores of a Zen 3 (65 without
that header), where PyTorch's extension builder after the variants one at
a time took 79. The tests compile the same objects into a standalone
harness (``compile_isa_objects``), natively and cross-compiled for ARM.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from edge_infer.errors import KernelUnavailableError

log = logging.getLogger(__name__)
CSRC = Path(__file__).with_name("csrc")


@dataclass(frozen=True)
class IsaSource:
    variant: str  # as csrc/isa.h names it
    source: str
    flags: tuple[str, ...]


# Every variant rounds alike only without implicit contraction into fused multiply-adds (isa_common.h).
COMMON_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-ffp-contract=off", "-fno-math-errno")
_AVX2 = ("-mavx2", "-mfma", "-mf16c")
_AVX512_VNNI = (*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")
ISA_SOURCES = {
    "x86_64": (
        IsaSource("scalar", "isa_scalar.cpp", ()),
        IsaSource("avx2", "isa_avx2.cpp", _AVX2),
        IsaSource("avx-vnni", "isa_avx2.cpp", (*_AVX2, "-mavxvnni", "-DEDGE_INFER_AVX_VNNI")),
        IsaSource("avx512-vnni", "isa_avx512.cpp", _AVX512_VNNI),
        IsaSource("amx-int8", "isa_avx512.cpp", (*_AVX512_VNNI, "-mamx-tile", "-mamx-int8", "-DEDGE_INFER_AMX")),
    ),
    "aarch64": (
        IsaSource("scalar", "isa_scalar.cpp", ()),
        IsaSource("neon-dotprod", "isa_neon.cpp", ("-march=armv8.2-a+dotprod",)),
    ),
}
REGISTRY = "isa_registry.cpp"
# Kernels outside the ISA tables, one source each with the instruction sets it needs; one the compiler
# cannot build is left out, and the binding that declares it weakly sees a null address.
OPTIONAL_SOURCES = {
    "x86_64": (IsaSource("attention-avx512-bf16", "attention_avx512bf16.cpp",
                         ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16")),),
}
BINDING_SOURCES = ("linear.cpp", "decode_layer.cpp", "snake.cpp", "elementwise.cpp", "block_cache.cpp", "attention.cpp",
                   "pack.cpp", "int4_rows.cpp")
# The binding's flags: -fopenmp, as at::parallel_for runs on the OpenMP pool PyTorch already started (same
# libgomp soname); -ffp-contract=off as for the variants (no multiply-adds where x86's baseline has none, so ARM
# computes the same bits); -fno-trapping-math lets the compiler vectorize the loops that select between floats
# (clamps and minima, pack_math.h) without changing any value (it drops only the floating-point exception flags).
BINDING_FLAGS = ("-O3", "-std=c++20", "-fPIC", "-fopenmp", "-ffp-contract=off", "-fno-trapping-math")
# What the binding's sources include from PyTorch, parsed once into a precompiled header for all of them.
PRELUDE_HEADERS = ("ATen/ATen.h", "ATen/Parallel.h", "c10/core/CPUAllocator.h", "torch/library.h")
LIBRARY_NAME = "edge_infer_native.so"
VARIANTS_FILE = "variants.json"  # the variants the build holds, readable without loading the library


def arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def compiler() -> str:
    return os.environ.get("CXX", "c++")


def missing_toolchain() -> str | None:
    """Why the library can be neither loaded nor built here, or None."""
    if library_path().exists():  # built before: nothing else needed
        return None
    if arch() not in ISA_SOURCES:
        return f"edge-infer's int8 kernels have no implementation for {arch()}"
    if shutil.which(compiler()) is None:
        return "no C++ compiler (c++ or $CXX) to build edge-infer's int8 kernels; install g++ or use cpu_int4"
    return None


@functools.lru_cache(maxsize=1)
def library_path() -> Path:
    """Where the library built from these sources and flags for this torch and architecture lives."""
    sources = ISA_SOURCES.get(arch(), ()) + OPTIONAL_SOURCES.get(arch(), ())
    key = hashlib.sha256(
        f"{metadata.version('torch')} {arch()} {COMMON_FLAGS} {BINDING_FLAGS} {PRELUDE_HEADERS} {sources}".encode())
    for path in sorted(p for p in CSRC.iterdir() if p.suffix in (".cpp", ".h")):
        key.update(path.name.encode() + path.read_bytes())
    cache = Path(os.environ.get("EDGE_INFER_KERNEL_CACHE", Path.home() / ".cache" / "edge-infer" / "kernels"))
    return cache / f"native-{key.hexdigest()[:16]}" / LIBRARY_NAME


def built_variants() -> tuple[str, ...] | None:
    """The ISA variants in the built library, or None before it is built."""
    listing = library_path().with_name(VARIANTS_FILE)
    return tuple(json.loads(listing.read_text())) if listing.exists() else None


def compile_isa_objects(out_dir: Path, sources: tuple[IsaSource, ...], cxx: str | None = None,
                        extra_flags: tuple[str, ...] = ()) -> tuple[list[Path], list[str]]:
    """Compile the registry and each variant's source into ``out_dir``, on every core: (objects, variants built).

    A variant that fails to compile is skipped with a warning (its registry entry stays null); the scalar
    reference and the registry must compile.
    """
    cxx = cxx or compiler()
    out_dir.mkdir(parents=True, exist_ok=True)
    with _pool() as pool:
        return _isa_objects(_submit_isa(pool, cxx, out_dir, sources, extra_flags))


def _submit_isa(pool: ThreadPoolExecutor, cxx: str, out_dir: Path, sources: tuple[IsaSource, ...],
                extra_flags: tuple[str, ...] = ()) -> list[tuple[str, Path, bool, Future]]:
    """Start compiling the registry and each variant: (source, object, whether it must build, the run)."""
    entries = [(REGISTRY, (), out_dir / "isa_registry.o", True)] + [
        (s.source, s.flags, out_dir / f"isa_{s.variant}.o", s.variant == "scalar") for s in sources]
    return [(src, obj, required, pool.submit(_compile, cxx, src, (*COMMON_FLAGS, *extra_flags, *flags), obj))
            for src, flags, obj, required in entries]


def _isa_objects(runs: list[tuple[str, Path, bool, Future]]) -> tuple[list[Path], list[str]]:
    objects, built = [], []
    for src, obj, required, run in runs:
        done = run.result()
        if done.returncode != 0:
            if required:
                raise KernelUnavailableError(f"compiling {src} failed:\n{done.stderr[-3000:]}")
            log.warning("the %s kernel variant does not compile here (left out): %s", obj.stem[4:], done.stderr[-500:])
            continue
        objects.append(obj)
        if obj.stem != "isa_registry":
            built.append(obj.stem[4:])
    return objects, built


def _pool() -> ThreadPoolExecutor:
    """A compile per core this process may run on."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return ThreadPoolExecutor(max_workers=cores or 1)


def _compile(cxx: str, source: str | Path, flags: tuple[str, ...], obj: Path) -> subprocess.CompletedProcess:
    """Compile ``source`` (under csrc/ unless absolute) into ``obj``."""
    cmd = [cxx, *flags, "-c", str(CSRC / source), "-o", str(obj)]
    return subprocess.run(cmd, capture_output=True, text=True)


_failed_build: KernelUnavailableError | None = None  # a build that failed is not tried again by this process


def build(library: Path) -> None:
    """Compile in a child process: the builder's imports (~5 MB of RssAnon) and the compiler stay out of
    this one, whose memory the plan counts."""
    global _failed_build
    import sys

    if _failed_build is not None:  # callers that fall back (cpu_int4's quantizer) ask once per linear
        raise _failed_build
    log.info("building edge-infer's int8 kernels into %s (once per source version, about a minute on 2 cores)",
             library.parent)
    script = "import sys; from edge_infer.quant.native_build import compile_library; compile_library(sys.argv[1])"
    run = subprocess.run([sys.executable, "-c", script, str(library)], capture_output=True, text=True)
    if run.returncode != 0 or not library.exists():
        _failed_build = KernelUnavailableError(
            f"building edge-infer's int8 kernels failed (use cpu_int4 meanwhile):\n{run.stderr[-3000:]}")
        raise _failed_build


def compile_library(library: str) -> None:
    """(The build child.) Compile into a private directory, then publish with an atomic rename, so that
    a process starting meanwhile never loads a half-written file and a killed build leaves no lock."""
    import tempfile

    target = Path(library)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix="build-"))
    try:
        _build_into(work, target.name)
        os.replace(work / VARIANTS_FILE, target.with_name(VARIANTS_FILE))
        os.replace(work / target.name, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _build_into(work: Path, name: str) -> None:
    """Every object on all the cores there are (the binding's after its precompiled header), then the link."""
    from torch.utils import cpp_extension

    cxx = compiler()
    binding_flags = (*BINDING_FLAGS, *(f"-isystem{p}" for p in cpp_extension.include_paths()))
    prelude = work / "torch_prelude.h"
    prelude.write_text("".join(f"#include <{h}>\n" for h in PRELUDE_HEADERS))
    with _pool() as pool:
        pch = pool.submit(_compile, cxx, prelude, (*binding_flags, "-x", "c++-header"), Path(f"{prelude}.gch"))
        isa = _submit_isa(pool, cxx, work, ISA_SOURCES[arch()])
        optional = [(s, work / f"{s.variant}.o", pool.submit(_compile, cxx, s.source, (*COMMON_FLAGS, *s.flags),
                                                             work / f"{s.variant}.o"))
                    for s in OPTIONAL_SOURCES.get(arch(), ())]
        # Without the header precompiled (another compiler's format, say) each source parses it: slower, same code.
        use_pch = ("-include", str(prelude)) if pch.result().returncode == 0 else ()
        binding = [(src, pool.submit(_compile, cxx, src, (*binding_flags, *use_pch), work / f"{Path(src).stem}.o"))
                   for src in BINDING_SOURCES]
        objects, built = _isa_objects(isa)
        for s, obj, run in optional:
            if run.result().returncode != 0:
                log.warning("%s does not compile here (left out): %s", s.source, run.result().stderr[-500:])
            else:
                objects.append(obj)
        for src, run in binding:
            if run.result().returncode != 0:
                raise KernelUnavailableError(f"compiling {src} failed:\n{run.result().stderr[-3000:]}")
    link = [cxx, "-shared", *(str(work / f"{Path(src).stem}.o") for src in BINDING_SOURCES), *map(str, objects),
            *(f"-L{p}" for p in cpp_extension.library_paths()), "-lc10", "-ltorch_cpu", "-ltorch", "-fopenmp",
            "-o", str(work / name)]
    done = subprocess.run(link, capture_output=True, text=True)
    if done.returncode != 0:
        raise KernelUnavailableError(f"linking {name} failed:\n{done.stderr[-3000:]}")
    (work / VARIANTS_FILE).write_text(json.dumps(built))

