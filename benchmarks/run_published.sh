#!/usr/bin/env bash
# Run the published comparisons and regenerate docs/results.md.
#
#   [SPECS="benchmarks/specs/a.json ..."] [PROFILES=0] benchmarks/run_published.sh [grid options, e.g. --cores 2-3 --passes 3]
#
# Run it on quiet cores: every grid refuses busy cores and holds the host
# lock. First (once) it writes the synthetic checkpoints and their GGUFs
# (bf16 export, Q8_0, Q4_K_M and Q4_0 through llama.cpp's quantizer) under
# benchmarks/models/ and llama.cpp builds without AVX-512 under benchmarks/llamacpp-avx2/
# and (where the CPU has AVX-VNNI) benchmarks/llamacpp-avx-vnni/, then runs every spec in benchmarks/specs/ into
# benchmarks/results/<spec>.json, profiles batch-1 decode steps into
# benchmarks/results/profiles/ and speech frames into benchmarks/results/tts-frames/. An arm that fails is kept in its result as a
# failed pass and makes this script exit 1 after everything else has run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${EDGE_INFER:-}" ]; then
  if [ -x .venv/bin/edge-infer ]; then EDGE_INFER=.venv/bin/edge-infer; else EDGE_INFER=edge-infer; fi
fi
export EDGE_INFER  # the specs' arms run "${EDGE_INFER:-edge-infer} bench ..."
PYTHON=$(dirname "$EDGE_INFER")/python; [ -x "$PYTHON" ] || PYTHON=python
export PYTHON  # the demo-vision grid's arms run "${PYTHON:-python} scripts/train_demo_vision.py ..."

models=benchmarks/models
mkdir -p "$models/gguf" benchmarks/results/raw

prepare() {  # family preset
  if [ ! -f "$models/$2/config.json" ]; then
    $EDGE_INFER synth "$models/$2" --family "$1" --preset "$2"
  fi
  if [ ! -f "$models/gguf/$2-Q4_K_M.gguf" ] || [ ! -f "$models/gguf/$2-Q8_0.gguf" ] || [ ! -f "$models/gguf/$2-Q4_0.gguf" ]; then
    $EDGE_INFER bench llamacpp prepare "$models/$2" "$models/gguf"
  fi
}
# llama.cpp for one ISA level (PYTHONPATH=DIR in the *-isa grids' "-avx2" arms and the
# *-avx-vnni grids): the same llama-cpp-python version as the baseline extra, compiled
# without AVX-512. --no-cache-dir: pip would otherwise reuse a wheel of the same version
# built with other flags (a native AVX-512/AMX one), whatever CMAKE_ARGS says.
build_llamacpp() {  # dir extra-cmake-flags
  if [ ! -d "$1/llama_cpp" ]; then
    version=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DLLAVA_BUILD=OFF $2" \
      "$PYTHON" -m pip install --no-cache-dir --no-deps --no-binary llama-cpp-python --target "$1" "llama-cpp-python==$version"
  fi
  if PYTHONPATH=$1 "$PYTHON" -c 'import llama_cpp; print(llama_cpp.llama_print_system_info().decode())' \
      | grep -q 'AVX512 = 1\|AMX_INT8 = 1'; then
    echo "$1 holds an AVX-512 build, not the one without it: remove it and run again" >&2
    exit 2
  fi
}
build_llamacpp benchmarks/llamacpp-avx2 ""
# The AVX-VNNI level (Alder Lake-N, N100 boxes) can only be measured on a CPU that has it.
if grep -qw 'avx_vnni' /proc/cpuinfo; then have_avx_vnni=1; else have_avx_vnni=0; fi
if grep -qw 'amx_int8' /proc/cpuinfo; then have_amx=1; else have_amx=0; fi
if [ $have_avx_vnni = 1 ]; then build_llamacpp benchmarks/llamacpp-avx-vnni "-DGGML_AVX_VNNI=ON"; fi
prepare qwen2 qwen2.5-0.5b
prepare llama llama-3.2-1b
if [ ! -f "$models/qwen3-tts-0.6b/config.json" ]; then  # speech: no GGUF
  $EDGE_INFER synth "$models/qwen3-tts-0.6b" --family qwen3-tts --preset qwen3-tts-0.6b
fi
if [ ! -f "$models/qwen2.5-omni-3b/config.json" ]; then  # media in (the thinker): transformers and llama.cpp's libmtmd
  $EDGE_INFER synth "$models/qwen2.5-omni-3b" --family qwen2_5_omni --preset qwen2.5-omni-3b
fi
# llama.cpp's multimodal path (the media grids' llamacpp-*-mtmd arms, PYTHONPATH=benchmarks/llamacpp-mtmd): the
# baseline's version built with libmtmd (-DLLAVA_BUILD=ON; .ci/run builds it without), for this CPU without
# llama.cpp's AMX kernels (as .ci/run: they die of SIGILL on the AMX virtual machines); the thinker's two GGUFs
# written by the converter vendored in that version's sdist (benchmarks/llamacpp_omni_gguf.py).
# A native build dies of SIGILL on another CPU: it is rebuilt when this CPU's flags differ from its own.
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cpu_flags=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo | md5sum | cut -c1-12)
if [ "$(cat benchmarks/llamacpp-mtmd/.cpu-flags 2>/dev/null)" != "$cpu_flags" ]; then
  rm -rf benchmarks/llamacpp-mtmd
  version=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=ON -DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'" \
    "$PYTHON" -m pip install --no-cache-dir --no-deps --no-binary llama-cpp-python --target benchmarks/llamacpp-mtmd \
    "llama-cpp-python==$version"
  echo "$cpu_flags" > benchmarks/llamacpp-mtmd/.cpu-flags
fi
omni=$models/gguf/qwen2.5-omni-3b
if [ ! -f "$omni-Q4_K_M.gguf" ] || [ ! -f "$omni-mmproj-f16.gguf" ]; then
  version=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
  sdist=$(mktemp -d)
  "$PYTHON" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$sdist"
  tar xzf "$sdist"/llama_cpp_python-"$version".tar.gz -C "$sdist"
  "$PYTHON" benchmarks/llamacpp_omni_gguf.py "$sdist/llama_cpp_python-$version/vendor/llama.cpp" "$models/qwen2.5-omni-3b" "$models/gguf"
  $EDGE_INFER bench llamacpp quantize "$omni-bf16.gguf" "$omni-Q4_K_M.gguf" --type Q4_K_M
  rm -rf "$sdist"
fi

status=0
for spec in ${SPECS:-benchmarks/specs/*.json}; do  # SPECS: a subset, e.g. SPECS="benchmarks/specs/pp-tg-*.json"
  name=$(basename "$spec" .json)
  if [[ $name == *-avx-vnni && $have_avx_vnni = 0 ]]; then
    echo "== $name skipped: this CPU lacks avx_vnni, the level its arms measure" >&2
    continue
  fi
  if [[ $name == *-amx && $have_amx = 0 ]]; then
    echo "== $name skipped: this CPU lacks amx_int8, the tile unit its arms measure" >&2
    continue
  fi
  echo "== $name" >&2
  $EDGE_INFER bench grid --spec "$spec" --out "benchmarks/results/$name.json" "$@" || status=1
done
if [ "${PROFILES:-1}" = 0 ]; then benchmarks/render_results.sh; exit $status; fi  # grids only
cores=$(printf '%s\n' "$@" | sed -n '/^--cores$/{n;p;}')  # the grids' --cores, if given
for arm in "bf16:" "bf16-packed-head:--packed-head" "w4a16:--quantization cpu_int4" \
           "w4a16-head:--quantization cpu_int4 --quantize-head" "w4a8-head:--quantization cpu_w4a8 --quantize-head"; do
  # shellcheck disable=SC2086  # the flags are words
  ${cores:+taskset -c "$cores"} "$PYTHON" benchmarks/profile_decode.py "$models/qwen2.5-0.5b" ${arm#*:} \
    --out "benchmarks/results/profiles/decode-qwen2.5-0.5b-${arm%%:*}.json" || status=1
done
for arm in "bf16-1t::1" "w4a16-1t:--quantization cpu_int4:1" "w4a16-2t:--quantization cpu_int4:2" \
           "w4a8-1t:--quantization cpu_w4a8:1" "w4a8-2t:--quantization cpu_w4a8:2"; do
  IFS=: read -r tag flags threads <<< "$arm"
  # shellcheck disable=SC2086  # the flags are words
  ${cores:+taskset -c "$cores"} "$PYTHON" benchmarks/profile_tts_frame.py "$models/qwen3-tts-0.6b" $flags \
    --threads "$threads" --out "benchmarks/results/tts-frames/qwen3-tts-0.6b-$tag.json" || status=1
done
benchmarks/render_results.sh
exit $status
