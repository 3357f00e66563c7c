#!/bin/sh
# Run the cpu_int4 benchmarks: speed (bf16 vs W4A16) and the memory-levers A/B table.
#
#   benchmarks/quant/run.sh [OUT_DIR] [extra `bench grid` flags, e.g. --cores 2-3]
#
# Run from the repository root on idle cores. Writes OUT_DIR/speed.json,
# OUT_DIR/levers-<lever>.json, OUT_DIR/levers.md and OUT_DIR/speed.md.
set -u
out=${1:-benchmarks/results/quant}
[ $# -gt 0 ] && shift
py=${PYTHON:-python}
export PYTHONPATH=src
model=build/bench-models/qwen2.5-0.5b
if [ ! -f "$model/config.json" ]; then
    "$py" -m edge_infer.cli synth "$model" --family qwen2 --preset qwen2.5-0.5b || exit 1
fi
mkdir -p "$out"
status=0
"$py" -m edge_infer.cli bench grid --spec benchmarks/quant/speed.json --passes 3 \
    --keys pp_tps,tg_tps,ready_s,load_peak_rss_anon_mb,rss_anon_mb,rss_anon_at_context_mb,weights_mb \
    --out "$out/speed.json" "$@" || status=1
"$py" -m edge_infer.cli bench report "$out/speed.json" --control bf16 > "$out/speed.md" || status=1
for spec in benchmarks/quant/levers/*.json; do
    name=$(basename "$spec" .json)
    "$py" -m edge_infer.cli bench grid --spec "$spec" --passes 3 \
        --keys rss_anon_mb,load_peak_rss_anon_mb,weights_mb,kv_cache_mb,rope_mb,trimmed_mb \
        --out "$out/levers-$name.json" "$@" || status=1
done
"$py" benchmarks/quant/levers_table.py "$out" > "$out/levers.md" || status=1
cat "$out/levers.md"
exit $status
