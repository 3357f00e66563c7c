"""Building the W4A8 kernel library (``csrc/``): what it needs, where it is cached, the build itself.

Torch-free, so the planner can refuse ``cpu_w4a8`` before loading when the
library is neither built nor buildable. The library is compiled on first use
with PyTorch's C++ extension builder, in a child process (a C++ compiler and
``ninja`` needed, 15-25 s on 2 cores), and cached under
``EDGE_INFER_KERNEL_CACHE`` or ``~/.cache/edge-infer/kernels``, keyed by a
hash of the sources, the flags and the torch version.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
from importlib import metadata
from pathlib import Path

from edge_infer.errors import KernelUnavailableError

log = logging.getLogger(__name__)
CSRC = Path(__file__).with_name("csrc")
SOURCES = [CSRC / name for name in ("w4a8.cpp", "decode_layer.cpp")]
FLAGS = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]


def missing_toolchain() -> str | None:
    """Why the library can be neither loaded nor built here, or None."""
    if library_path().exists():  # built before: nothing else needed
        return None
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler (c++ or $CXX) to build the W4A8 kernel; install g++ or use cpu_int4"
    try:
        import ninja  # noqa: F401 - PyTorch's extension builder runs its executable
    except ImportError:
        return "the W4A8 kernel is built with ninja: pip install ninja, or use cpu_int4"
    return None


@functools.lru_cache(maxsize=1)
def library_path() -> Path:
    """Where the library built from these sources and flags for this torch lives."""
    key = hashlib.sha256(metadata.version("torch").encode() + " ".join(FLAGS).encode())
    for path in sorted(p for p in CSRC.iterdir() if p.suffix in (".cpp", ".h")):
        key.update(path.name.encode() + path.read_bytes())
    cache = Path(os.environ.get("EDGE_INFER_KERNEL_CACHE", Path.home() / ".cache" / "edge-infer" / "kernels"))
    return cache / f"w4a8-{key.hexdigest()[:16]}" / "edge_infer_w4a8.so"


def build(library: Path) -> None:
    """Compile in a child process: the builder's imports (~5 MB of RssAnon) and the compiler stay out of
    this one, whose memory the plan counts."""
    import subprocess
    import sys

    import ninja

    log.info("building the W4A8 kernel into %s (once per source version, 15-25 s)", library.parent)
    # The builder runs `ninja` from PATH; a venv's python started by its full path may not have it there.
    env = dict(os.environ, PATH=ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", ""))
    script = "import sys; from edge_infer.quant.w4a8_build import compile_library; compile_library(sys.argv[1])"
    run = subprocess.run([sys.executable, "-c", script, str(library)], env=env, capture_output=True, text=True)
    if run.returncode != 0 or not library.exists():
        raise KernelUnavailableError(f"cpu_w4a8: building the W4A8 kernel failed (use cpu_int4 meanwhile):\n{run.stderr[-3000:]}")


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
        load(name=target.stem, sources=[str(s) for s in SOURCES], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
             build_directory=str(work), is_python_module=False, verbose=False)
        os.replace(work / target.name, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
