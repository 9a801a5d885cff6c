#!/usr/bin/env bash
# The pilot's third design, probe and run in one unattended GPU session (docs/pilot.md, "The third
# design"): a probe on the TRAIN split picks the task and learning rate by the rule fixed in
# benchmarks/pilot_collapse_choice.py, writes them into configs/pilot.yaml, and then runs the
# README's pilot command (benchmarks/pilot_gpu.sh) on that config, unchanged otherwise:
#
#   bash benchmarks/pilot_collapse_probe.sh [STEPS]          # default 100; from the project root
#
# Probe, all side by side on the one GPU (the offline GPU stack installed):
#   * GRPO only, seed 1, STEPS steps, one training per candidate TASK:LR (below), everything else as
#     configs/pilot.yaml; read: the training rollouts' own policy entropy and verifier reward;
#   * the base model on each candidate task's DEV split (256 samples per question, vLLM), for the
#     issue's window (base pass@1 roughly 2-25 %, pass@256 clearly below 1).
# No RepExp run and no test question enters the choice. Outputs: results/probe3/ (choice.json,
# summary.txt, metrics/), then the pilot's own (results/pilot, results/pilot_bundle).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STEPS="${1:-100}"
CANDIDATES=(arith-hard:1e-4 arith-mid:2e-5 arith-mid:5e-5 arith-mid:1e-4)
TASKS=(arith-hard arith-mid)
ROOT=results/probe3
MODEL="$PWD/$ROOT/smollm2"
mkdir -p "$ROOT/metrics"
mark() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$ROOT/progress.log"; }
mark "probe: ${CANDIDATES[*]}, $STEPS steps"
[ -f "$MODEL/config.json" ] || repexp model smollm2 --out "$MODEL" > "$ROOT/model.log" 2>&1 || exit 1
started=$(date +%s)
pids=()
for candidate in "${CANDIDATES[@]}"; do
    task="${candidate%%:*}" lr="${candidate##*:}"
    out="$ROOT/$task-lr$lr"
    snakemake "$out/train/$task/trl_grpo_s1/DONE" --configfile configs/pilot.yaml --cores 2 \
        --resources gpu_share=100 \
        --config set="results_dir=$out model=$MODEL sweep.tasks=[$task] train.lr=$lr train.total_steps=$STEPS" \
        > "$ROOT/$task-lr$lr.log" 2>&1 &
    pids+=($!)
done
for task in "${TASKS[@]}"; do   # the base model on each task's dev split, beside the trainings
    (
        repexp data prepare "$task" --out "$ROOT/data/$task" &&
        repexp eval --model "$MODEL" --data "$ROOT/data/$task/dev.parquet" --out "$ROOT/base-dev/$task" \
            --seed 7 --overwrite --no-progress --set eval.engine=vllm eval.n_samples=256 eval.max_new_tokens=16 \
            eval.dtype=bfloat16 eval.gpu_memory_utilization=0.08 eval.kv_cache_gib=4 eval.enforce_eager=true
    ) > "$ROOT/base-dev-$task.log" 2>&1 &
    pids+=($!)
done
code=0
for pid in "${pids[@]}"; do wait "$pid" || code=1; done
echo "{\"exit\": $code, \"wall_s\": $(( $(date +%s) - started )), \"steps\": $STEPS}" > "$ROOT/wall.json"
for candidate in "${CANDIDATES[@]}"; do
    task="${candidate%%:*}" lr="${candidate##*:}"
    cp "$ROOT/$task-lr$lr/train/$task/trl_grpo_s1/metrics.jsonl" "$ROOT/metrics/$task-lr$lr.jsonl" 2>/dev/null
done
mark "probe exit $code; choosing"
python3 benchmarks/pilot_collapse_choice.py "$ROOT" --steps "$STEPS" --apply configs/pilot.yaml \
    > "$ROOT/summary.txt" 2>&1
choice=$?
cat "$ROOT/summary.txt"
cp configs/pilot.yaml "$ROOT/pilot.yaml"
[ $choice -eq 0 ] || { mark "no choice (exit $choice): the pilot is not run"; exit 1; }
mark "pilot: $(grep -E '^  (tasks|lr|total_steps):' configs/pilot.yaml | tr -s ' ' | tr '\n' ' ')"
bash benchmarks/pilot_gpu.sh
code=$?
mark "pilot exit $code"
exit $code
