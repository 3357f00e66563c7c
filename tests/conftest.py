"""Shared fixtures: checkpoints built on the spot (no model hub here)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime import toys
from testutil import FAMILY_CONFIGS, write_hf_checkpoint

# Keep test processes polite on small machines; the engine's own thread choice is tested separately.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# `make test` runs the suite on pytest-xdist, a worker per core (at most 4: each holds its own checkpoints and servers).
@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config) -> int:
    return min(4, len(os.sched_getaffinity(0)))


def pytest_configure(config) -> None:
    """Under pytest-xdist each worker gets cores of its own: its tests, and the engines they start (a thread per
    core they may run on), never contend with another worker's (sharing both of 2 cores, two workers took 559 s
    where pinned they took 492 with the kernel build). The kernel library is built once, before the workers
    start, on every core."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) >= workers:
            os.sched_setaffinity(0, cores[int(worker.removeprefix("gw"))::workers])
    elif getattr(config.option, "numprocesses", None):
        _build_kernels_once()


def _build_kernels_once() -> None:
    from edge_infer.errors import KernelUnavailableError
    from edge_infer.quant import native_build

    if native_build.missing_toolchain() is None and not native_build.library_path().exists():
        try:
            native_build.build(native_build.library_path())
        except KernelUnavailableError:
            pass  # the tests that need the library say why it is missing


# The toy stages (toy_ar, toy_vocoder) are test doubles, not shipped executors: every test may name them.
toys.register()

@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {fam: write_hf_checkpoint(root / fam, fam) for fam in FAMILY_CONFIGS}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random Qwen2 checkpoint with a working tokenizer and chat template (edge-infer synth)."""
    from edge_infer.models.synth import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("synth") / "tiny-qwen2", "qwen2", "tiny", dtype="float32")


@pytest.fixture(scope="session")
def demo_model() -> Path:
    from edge_infer.models.checkpoint import demo_model_dir

    return demo_model_dir()


@pytest.fixture(scope="session")
def thinker_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Tiny Qwen2.5-VL, Qwen2.5-Omni thinker and full Qwen2.5-Omni checkpoints written by transformers."""
    from testutil import write_thinker_checkpoint

    root = tmp_path_factory.mktemp("thinkers")
    return {kind: write_thinker_checkpoint(root / kind, kind) for kind in ("qwen2_5_vl", "qwen2_5_omni_thinker", "qwen2_5_omni")}


@pytest.fixture(scope="session")
def synth_thinkers(tmp_path_factory) -> dict[str, Path]:
    """Tiny Qwen2.5-VL and Qwen2.5-Omni thinkers from `edge-infer synth` (tokenizer, chat template for content lists,
    processor files)."""
    from edge_infer.models.synth_thinker import write_thinker

    root = tmp_path_factory.mktemp("synth-thinkers")
    return {family: write_thinker(root / family, family, "tiny", seed=0, dtype="float32", shard_bytes=1 << 30)
            for family in ("qwen2_5_vl", "qwen2_5_omni")}
