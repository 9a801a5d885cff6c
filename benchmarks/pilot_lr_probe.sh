#!/usr/bin/env bash
# The pilot's learning-rate probe (docs/pilot.md, "Second design"): GRPO only, seed 1, on the
# pilot's TRAIN split (the metrics are the training rollouts' own; no dev or test question is
# scored), one training per learning rate, all side by side on the one GPU:
#
#   bash benchmarks/pilot_lr_probe.sh [STEPS] [LR ...]     # defaults: 60 steps; 1e-5 2e-5 3e-5 5e-5
#
# It answers two questions the first pilot run left open, before the second run is designed:
# at which learning rate GRPO's policy entropy collapses within the pilot's step budget, and how
# long a step takes with bfloat16 autocast. Per run: results/probe/lr<LR>/train/arith-hard/
# trl_grpo_s1/metrics.jsonl; benchmarks/pilot_lr_probe_summary.py prints the table.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STEPS="${1:-60}"; shift || true
LRS=("$@"); [ ${#LRS[@]} -gt 0 ] || LRS=(1e-5 2e-5 3e-5 5e-5)
ROOT=results/probe
MODEL="$PWD/$ROOT/smollm2"
mkdir -p "$ROOT"
[ -f "$MODEL/config.json" ] || repexp model smollm2 --out "$MODEL" || exit 1
started=$(date +%s)
pids=()
for lr in "${LRS[@]}"; do
    out="$ROOT/lr$lr"
    # the pilot's config as it is, but for the probe's model path, task (arith-hard, the task these probes
    # ran on; the config now holds the third design's arith-mid), learning rate, dtype and steps
    snakemake "$out/train/arith-hard/trl_grpo_s1/DONE" --configfile configs/pilot.yaml --cores 4 \
        --resources gpu_share=100 \
        --config set="results_dir=$out model=$MODEL sweep.tasks=[arith-hard] train.lr=$lr trl.dtype=bfloat16 train.total_steps=$STEPS" \
        > "$ROOT/lr$lr.log" 2>&1 &
    pids+=($!)
done
code=0
for pid in "${pids[@]}"; do wait "$pid" || code=1; done
echo "{\"exit\": $code, \"wall_s\": $(( $(date +%s) - started )), \"steps\": $STEPS}" > "$ROOT/wall.json"
python3 benchmarks/pilot_lr_probe_summary.py "$ROOT" | tee "$ROOT/summary.txt"
mkdir -p "$ROOT/metrics"   # the per-step metrics of every rate, small enough to keep with the docs
for lr in "${LRS[@]}"; do
    cp "$ROOT/lr$lr/train/arith-hard/trl_grpo_s1/metrics.jsonl" "$ROOT/metrics/lr$lr.jsonl" 2>/dev/null
done
exit $code
