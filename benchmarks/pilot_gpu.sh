#!/usr/bin/env bash
# The pilot on one GPU node, timed, as docs/pilot.md records it (the offline GPU stack installed:
# `repexp`, `snakemake`, `mlflow` on PATH):
#
#   bash benchmarks/pilot_gpu.sh            # from the project root
#
# Runs the README's pilot command exactly, then benchmarks/dag_report.py (per-node wall times, test
# pass@k per run, one sweep point's MLflow tree), then gathers the small outputs worth keeping (the
# aggregate table, figures, per-run training metrics, eval.json and testtime.json files, logs and
# the MLflow store; not the sample stores) into results/pilot_bundle/.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RESULTS=results/pilot
BUNDLE=results/pilot_bundle
mkdir -p "$BUNDLE"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$BUNDLE/gpu.csv" 2>&1
nproc > "$BUNDLE/nproc.txt"
( while sleep 15; do nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader; done ) \
    > "$BUNDLE/gpu_usage.csv" 2>&1 &
sampler=$!
started=$(date +%s)
snakemake all --configfile configs/pilot.yaml --cores 16 --resources gpu_share=100
code=$?
echo "{\"exit\": $code, \"wall_s\": $(( $(date +%s) - started ))}" > "$BUNDLE/wall.json"
kill "$sampler" 2>/dev/null
TASK=$(python3 -c "import yaml; print(yaml.safe_load(open('configs/pilot.yaml'))['sweep']['tasks'][0])")
python3 benchmarks/dag_report.py --results "$RESULTS" --point "$TASK/trl_repexp_k32_b0.1_s1" \
    --out "$BUNDLE/dag_report.json" > /dev/null 2>"$BUNDLE/dag_report.err"
for d in aggregate figures benchmarks logs; do
    [ -d "$RESULTS/$d" ] && cp -r "$RESULTS/$d" "$BUNDLE/"
done
( cd "$RESULTS" && find train eval testtime data -maxdepth 3 \( -name 'metrics.jsonl' -o -name 'best_dev.json' \
    -o -name 'select.json' -o -name 'eval.json' -o -name 'testtime.json' -o -name 'DONE' -o -name 'manifest.json' \) \
    -print0 | tar --null -cf - -T - ) | tar -C "$BUNDLE" -xf -
cp "$RESULTS"/mlflow/mlflow.db "$BUNDLE/" 2>/dev/null
exit $code
