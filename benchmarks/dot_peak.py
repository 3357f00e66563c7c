"""The int8 dot-product instruction's peak on this CPU: the ceiling the W4A8/W8A8 tile kernels are measured against.

    python benchmarks/dot_peak.py --out benchmarks/results/dot-peak-zen4.json [--seconds 2] [--processes 1 2]

A loop of 12 independent ``vpdpbusd`` accumulator chains (enough to hide the instruction's latency), in each
form this CPU has: ``zmm`` and ``ymm`` (EVEX, AVX512-VNNI: what the avx512-vnni kernels use, and its 256-bit
width) and ``ymm-vex`` (AVX-VNNI: what the avx-vnni kernels use), compiled with the C++ compiler the kernels
are built with, run in 1 and in N processes at once (each pinned to its own CPU, as the kernels' threads are).
Reported per form: G multiply-adds/s per core (64 per zmm instruction, 32 per ymm) and in all, the median of
the processes' rates and the lowest. docs/multimodal.md compares the tile kernels' rates
(``edge-infer bench kernels``) with it.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHAINS = 12
# One process's loop: CHAINS independent vpdpbusd chains on one register width, run for argv[1] seconds;
# prints the instructions per second. Each chain is its own variable (an array was spilled to the stack by GCC).
SOURCE = r"""
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#define STEP(a) asm volatile(DOT " %2, %1, %0" : "+v"(a) : "v"(u), "v"(s));
#define ALL STEP(a0) STEP(a1) STEP(a2) STEP(a3) STEP(a4) STEP(a5) STEP(a6) STEP(a7) STEP(a8) STEP(a9) STEP(a10) STEP(a11)
template <typename V>
double run(double seconds, V u, V s) {
  V a0 = u, a1 = u, a2 = u, a3 = u, a4 = u, a5 = u, a6 = u, a7 = u, a8 = u, a9 = u, a10 = u, a11 = u;
  const auto start = std::chrono::steady_clock::now();
  long rounds = 0;
  double elapsed = 0;
  while (elapsed < seconds) {
    for (int n = 0; n < 100000; ++n) { ALL }
    rounds += 100000;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  V keep[12] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};
  asm volatile("" : : "r"(keep) : "memory");
  return rounds * 12.0 / elapsed;
}
int main(int argc, char** argv) {
#ifdef ZMM
  printf("%.6e\n", run(atof(argv[1]), _mm512_set1_epi8(3), _mm512_set1_epi8(5)));
#else
  printf("%.6e\n", run(atof(argv[1]), _mm256_set1_epi8(3), _mm256_set1_epi8(5)));
#endif
}
"""
MACS_PER_INSTRUCTION = {"zmm": 64, "ymm": 32, "ymm-vex": 32}
_AVX512_VNNI = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")


def forms(features: set[str]) -> list[tuple[str, tuple[str, ...]]]:
    """The forms of vpdpbusd this CPU runs, with the compiler flags for each (the assembler picks the EVEX
    encoding for ymm registers unless told {vex})."""
    found = []
    if "avx512_vnni" in features:
        found.append(("zmm", (*_AVX512_VNNI, "-DZMM", "-DDOT=\"vpdpbusd\"")))
        found.append(("ymm", (*_AVX512_VNNI, "-DDOT=\"vpdpbusd\"")))
    if "avx_vnni" in features:
        found.append(("ymm-vex", ("-mavx2", "-mavxvnni", "-DDOT=\"%{vex%} vpdpbusd\"")))
    return found


def measure(binary: Path, width: str, processes: int, seconds: float) -> list[float]:
    """G multiply-adds/s of each of ``processes`` copies run at once, each pinned to its own CPU."""
    cores = sorted(os.sched_getaffinity(0))
    if processes > len(cores):
        raise SystemExit(f"--processes {processes}: this process may run on {len(cores)} core(s)")
    procs = [subprocess.Popen([str(binary), str(seconds)], stdout=subprocess.PIPE, text=True,
                              preexec_fn=lambda core=core: os.sched_setaffinity(0, {core}))
             for core in cores[:processes]]
    rates = []
    for p in procs:
        out = p.communicate()[0]
        if p.returncode != 0:
            raise SystemExit(f"the {width} loop failed (exit {p.returncode}): does this CPU run that form?")
        rates.append(float(out) * MACS_PER_INSTRUCTION[width] / 1e9)
    return rates


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=2.0, help="seconds per run (default 2)")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--runs", type=int, default=3, help="runs per case; the median is reported (default 3)")
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from edge_infer.bench.harness.arm_output import stamp, write_json_atomic
    from edge_infer.bench.harness.provenance import now_utc
    from edge_infer.hardware.cpu import detect

    started = now_utc()
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise SystemExit("no C++ compiler (c++ or g++) on PATH; set CXX")
    cases = forms(set(detect().features))
    if not cases:
        raise SystemExit("this CPU has no vpdpbusd (neither AVX512-VNNI nor AVX-VNNI): nothing to measure")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "dot_peak.cpp"
        source.write_text(SOURCE)
        for width, flags in cases:
            binary = Path(tmp) / f"dot_peak_{width}"  # one process's loop in this form
            subprocess.run([compiler, "-O2", "-std=c++17", *flags, str(source), "-o", str(binary)], check=True)
            for processes in args.processes:
                runs = [measure(binary, width, processes, args.seconds) for _ in range(args.runs)]
                per_core = statistics.median(statistics.median(r) for r in runs)
                rows.append({"width": width, "processes": processes, "gmacs_per_core": round(per_core, 1),
                             "gmacs_all_cores": round(per_core * processes, 1),
                             "lowest_core": round(min(min(r) for r in runs), 1),
                             "runs": [[round(v, 1) for v in r] for r in runs]})
                print(f"vpdpbusd {width}, {processes} process(es): {per_core:.1f} G multiply-adds/s per core",
                      file=sys.stderr)
    result = {"benchmark": "dot-peak", "chains": CHAINS, "seconds": args.seconds, "compiler": compiler, "rows": rows}
    write_json_atomic(args.out, {**result, "provenance": stamp(started)})
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
