"""Provenance: what a number was measured on, so that it can be invalidated.

Every bench output carries one `Provenance`. Library versions are read from
package metadata rather than by importing the libraries: importing torch
would cost seconds and perturb the machine being measured, and a missing
library is recorded as absent instead of failing.
"""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from edge_infer.hardware.cpu import detect
from edge_infer.hardware.memory import transparent_huge_pages

# Environment variables that change how many threads a process uses or which
# code path it takes; any variable starting with one of these is recorded.
THREAD_ENV_PREFIXES = (
    "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "BLIS_", "VECLIB_", "NUMEXPR_",
    "TORCH_", "PYTORCH_", "ATEN_", "DNNL_", "ONEDNN_", "CUDA_VISIBLE_DEVICES",
    "LLAMA_", "GGML_", "EDGE_INFER_", "MALLOC_", "LD_PRELOAD",
)
PACKAGES = (
    "edge-infer", "torch", "numpy", "safetensors", "tokenizers", "transformers",
    "pydantic", "psutil", "llama-cpp-python", "gguf", "matplotlib",
)


class GitState(BaseModel):
    toplevel: str
    commit: str
    dirty: bool


class Provenance(BaseModel):
    host: str
    cpu_model: str | None
    # The instruction-set features the project's kernels care about (a model string names machines
    # with and without AVX-512), and whether EDGE_INFER_CPU_FEATURES masked some.
    cpu_isa: str | None = None
    cpu_features: list[str] | None = None
    cpu_masked: list[str] | None = None
    cpu_count: int | None
    affinity: list[int]
    target_cores: list[int]
    thread_env: dict[str, str]
    python: str
    platform: str
    packages: dict[str, str | None]  # None: not installed
    git: list[GitState]
    loadavg: list[float]
    # The kernel's transparent huge page mode: packed weights are placed on 2 MiB pages unless it is "never".
    transparent_huge_pages: str | None = None
    argv: list[str]
    started_at: str
    finished_at: str | None = None


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def thread_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items()) if k.startswith(THREAD_ENV_PREFIXES)}


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    if versions["edge-infer"] is None:  # run from a source tree, not installed
        from edge_infer import __version__

        versions["edge-infer"] = f"{__version__} (not installed)"
    return versions


def git_state(directory: Path) -> GitState | None:
    """Commit and dirty flag of the repository containing `directory`, if any."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(directory), *args],
                capture_output=True, text=True, timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    toplevel = git("rev-parse", "--show-toplevel")
    commit = git("rev-parse", "HEAD")
    if toplevel is None or commit is None:
        return None
    # The results a run writes (benchmarks/results/) are its output, not what it measures: a grid that follows
    # another in one publishing run is still measuring a clean tree.
    status = git("-C", toplevel, "status", "--porcelain", "--", ".", ":(exclude)benchmarks/results")
    return GitState(toplevel=toplevel, commit=commit, dirty=status is None or status != "")


def collect(target_cores: list[int]) -> Provenance:
    """Stamp taken at the start of a run; the caller sets `finished_at` at the end."""
    # The working directory's repository (a benchmark checkout) and the one
    # edge_infer was imported from can differ; record both, once each.
    package_dir = Path(__file__).resolve().parent
    repos: dict[str, GitState] = {}
    for directory in (Path.cwd(), package_dir):
        state = git_state(directory)
        if state is not None:
            repos.setdefault(state.toplevel, state)
    cpu = detect()
    return Provenance(
        host=socket.gethostname(),
        cpu_model=cpu.model,
        cpu_isa=cpu.isa_summary,
        cpu_features=cpu.to_dict()["features"],
        cpu_masked=list(cpu.masked),
        cpu_count=os.cpu_count(),
        affinity=sorted(os.sched_getaffinity(0)),
        target_cores=list(target_cores),
        thread_env=thread_env(),
        python=sys.version.split()[0],
        platform=platform.platform(),
        packages=package_versions(),
        git=list(repos.values()),
        loadavg=list(os.getloadavg()),
        transparent_huge_pages=transparent_huge_pages(),
        argv=list(sys.argv),
        started_at=now_utc(),
    )
