#!/usr/bin/env bash
# Every GPU measurement of docs/gpu-validation.md and docs/performance.md in one unattended session
# on one GPU node (the verl + vLLM stack installed, `repexp`, `snakemake`, `mlflow` on PATH):
#
#   bash benchmarks/gpu_session.sh OUT_DIR [STAGE...]     # stages: dag verl_step eval_engine testtime (default), ...
#
# Stages run in order and are independent: a failed stage is recorded and the next one starts.
#   dag          snakemake all --configfile configs/gpu.yaml (the whole DAG, then benchmarks/dag_report.py)
#   verl_step    benchmarks/verl_step.py: RepExp vs GRPO s/step on Qwen2.5-1.5B shapes
#   eval_engine  repexp eval, eval.engine vllm vs hf on the DAG's SmolLM2, same problems and n
#   testtime     benchmarks/testtime_order.py on the GPU; test-time RepExp of SmolLM2 on arith (n = 256)
#   smoke        after a refactor: one TRL RepExp run of configs/pilot.yaml through train (4 steps) →
#                select → eval (vLLM) → testtime, then one verl step of configs/gpu.yaml on arith-mid for
#                RepExp and for GRPO (beta 0, sparse_dim null: a path of its own in the verl trainer)
#                (SMOKE_VERL_SET="key=value ..." adds settings to those verl runs, e.g. a small fixed KV cache
#                when other jobs share the GPU)
#   startup      verl's start-up phase by phase (repexp.verl.startup), one GRPO step alone on the GPU each:
#                first with configs/gpu.yaml's worker counts (1 reward + 1 agent-loop worker), then with
#                verl's defaults (8 + 8); the second start finds the page cache warm, so the comparison
#                is conservative
#   parity       configs/overlays/parity.yaml (an overlay on configs/pilot.yaml): verl GRPO and RepExp beta 0.01
#                for seeds 1-3, side by side, 80 steps each (on a GPU of >= 120 GB also the other methods
#                for seed 1 on both backends and a seed-1 rerun on TRL); then
#                benchmarks/parity_report.py against the committed TRL curves (docs/verl_backend.md)
#   methods      one verl step of configs/gpu.yaml on arith-mid for each other method: pass@k training,
#                outcome exploration (historical) and KL-Cov (docs/methods.md; Clip-Cov takes verl's same
#                loss_mode path and its actor update runs in the CPU tests), one after another (~4 min each)
#   trl_engines  issue 43: benchmarks/trl_step.py --engines hf vllm: the pilot's TRL training with
#                trl.rollout_engine hf and vllm on this GPU, one training alone and as many side by side as the
#                pilot runs at once (8 on an H100, 9 on an H200; 6 steps each, each capped at the pilot's auto
#                share); s/step per engine and the ratio hf / vllm in
#                trl_engines.log's table and trl_engines/trl_engines.json (with each group's steps per second
#                and the most GPU memory one training held), each training's log in trl_engines/logs/ (~5 min
#                on an H100); TRL_ENGINES_ARGS replaces the groups (MPS, --share)
# OUT_DIR must lie outside the device call's own $OUT, which every later call empties (use e.g.
# /root/session, then copy what you need into $OUT with poll.sh or tar in the last call).
# OUT_DIR/progress.log says which stage runs (one line per start and end, with exit codes);
# OUT_DIR/<stage>.log holds each stage's output; results go to OUT_DIR/<stage>/.
set -uo pipefail
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"; shift
STAGES=("${@:-dag verl_step eval_engine testtime}")
read -r -a STAGES <<<"${STAGES[*]}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RESULTS=results/gpu
GPU_ARGS=(--cores "$(nproc)" --resources gpu=1)

mark() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" >>"$OUT/progress.log"; }

stage_dag() {
    local started=$SECONDS
    snakemake all --configfile configs/gpu.yaml "${GPU_ARGS[@]}" --keep-going
    local code=$?
    echo "snakemake exit $code after $((SECONDS - started)) s"
    python3 benchmarks/dag_report.py --results "$RESULTS" --point gsm8k/verl_repexp_k32_b0.01_s42 \
        --out "$OUT/dag/dag_report.json" >/dev/null
    return $code
}

stage_verl_step() {
    python3 benchmarks/verl_step.py --out /tmp/verl-step --steps 3 --prompts 32 --response-length 512 &&
        cp /tmp/verl-step/verl_step.json "$OUT/verl_step/"
}

stage_eval_engine() {
    local model="$RESULTS/models/smollm2" data="$RESULTS/data/gsm8k/test.parquet" engine
    for engine in vllm hf; do
        local started=$SECONDS
        repexp eval --model "$model" --data "$data" --out "/tmp/eval-$engine" --limit 32 --seed 7 --overwrite \
            --no-progress --set "eval.engine=$engine" eval.n_samples=32 eval.max_new_tokens=256 eval.dtype=bfloat16 \
            eval.batch_size=256 eval.gpu_memory_utilization=0.4 || return 1
        python3 - "$engine" "$((SECONDS - started))" "/tmp/eval-$engine/eval.json" >>"$OUT/eval_engine/engines.jsonl" <<'PY'
import json, sys
engine, wall, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
data = json.load(open(path))
samples = data["num_problems"] * data["n_samples"]
print(json.dumps({"engine": engine, "wall_s": wall, "samples": samples, "samples_per_s": samples / wall,
                  "pass_at_1": data["pass_at_k"]["1"], "pass_at_32": data["pass_at_k"].get("32")}))
PY
    done
}

stage_testtime() {
    # the ordering's cost on the GPU, then test-time RepExp on real weights: SmolLM2 on the built-in
    # arith test split, 256 samples per question (docs/evaluation.md)
    python3 benchmarks/testtime_order.py --out "$OUT/testtime" --repeats 3 || return 1
    local model="$RESULTS/models/smollm2"
    repexp data prepare arith --out /tmp/arith-data || return 1
    repexp eval --model "$model" --data /tmp/arith-data/test.parquet --out /tmp/arith-eval --seed 7 --overwrite \
        --no-progress --set eval.engine=vllm eval.n_samples=256 eval.max_new_tokens=16 eval.dtype=bfloat16 \
        eval.gpu_memory_utilization=0.4 eval.enforce_eager=true || return 1
    repexp testtime --eval-dir /tmp/arith-eval --model "$model" --out /tmp/arith-testtime \
        --set testtime.bootstrap=2000 &&
        cp /tmp/arith-testtime/testtime.json "$OUT/testtime/testtime_arith_smollm2.json" &&
        cp /tmp/arith-eval/eval.json "$OUT/testtime/eval_arith_smollm2.json"
}

stage_smoke() {
    local started=$SECONDS point=arith-mid/trl_repexp_k32_b0.1_s1 code
    # (targets before --config, which takes every word after it)
    snakemake "results/pilot/testtime/$point/testtime.json" --configfile configs/pilot.yaml --cores "$(nproc)" \
        --resources gpu_share=100 --config set="train.total_steps=4 train.test_freq=2 train.save_freq=2 eval.n_samples=32"
    code=$?
    echo "trl chain exit $code after $((SECONDS - started)) s"
    cp -r results/pilot/train/$point/metrics.jsonl results/pilot/eval/$point/eval.json \
        results/pilot/testtime/$point/testtime.json results/pilot/mlflow/mlflow.db "$OUT/smoke/" 2>/dev/null
    started=$SECONDS
    snakemake results/gpu/train/arith-mid/{verl_repexp_k32_b0.01_s42,verl_grpo_s42}/DONE --configfile configs/gpu.yaml \
        "${GPU_ARGS[@]}" --keep-going --config set="sweep.tasks=[arith-mid] train.total_steps=1 train.test_freq=1 train.save_freq=1 ${SMOKE_VERL_SET:-}"
    local verl=$?
    echo "verl steps exit $verl after $((SECONDS - started)) s"
    cp results/gpu/train/arith-mid/verl_repexp_k32_b0.01_s42/metrics.jsonl "$OUT/smoke/verl_metrics.jsonl" 2>/dev/null
    cp results/gpu/train/arith-mid/verl_grpo_s42/metrics.jsonl "$OUT/smoke/verl_grpo_metrics.jsonl" 2>/dev/null
    return $((code || verl))
}

stage_methods() {
    local started=$SECONDS code run targets=()
    local runs=(verl_passk_k4_s42 verl_outcome_historical_c1_s42 verl_kl_cov_r0.002_s42)
    for run in "${runs[@]}"; do targets+=("results/gpu/train/arith-mid/$run/DONE"); done
    snakemake "${targets[@]}" --configfile configs/gpu.yaml "${GPU_ARGS[@]}" --keep-going \
        --config set="sweep.tasks=[arith-mid] sweep.methods.passk.passk_k=[4] sweep.methods.outcome={} \
sweep.methods.cov.loss_mode=[kl_cov] sweep.methods.cov.cov_ratio=[0.002] \
train.total_steps=1 train.test_freq=1 train.save_freq=1"
    code=$?
    echo "verl method steps exit $code after $((SECONDS - started)) s"
    for run in "${runs[@]}"; do
        cp "results/gpu/train/arith-mid/$run/metrics.jsonl" "$OUT/methods/$run.metrics.jsonl" 2>/dev/null
    done
    return $code
}

stage_startup() {
    local run code=0 one="sweep.tasks=[arith-mid] train.total_steps=1 train.test_freq=1 train.save_freq=1"
    for run in "verl_grpo_s42:" "verl_grpo_s7:verl.reward_workers=8 verl.agent_workers=8 sweep.seeds=[7]"; do
        local name=${run%%:*} extra=${run#*:} started=$SECONDS
        snakemake "results/gpu/train/arith-mid/$name/DONE" --configfile configs/gpu.yaml "${GPU_ARGS[@]}" \
            --config set="$one $extra" || code=1
        echo "$name ($extra) node wall $((SECONDS - started)) s"
        cp "results/gpu/train/arith-mid/$name/startup.json" "$OUT/startup/$name.startup.json" 2>/dev/null
        cp results/gpu/logs/train/arith-mid/"$name"*.log "$OUT/startup/" 2>/dev/null
    done
    return $code
}

stage_parity() {
    local started=$SECONDS code mib with_trl=(--tested-only) share="resources.train.gpu_share=16"
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    if [ "${mib:-0}" -ge 120000 ] && [ -z "${PARITY_TESTED_ONLY:-}" ]; then  # room for 14: 9 verl, 5 TRL
        with_trl=(--with-trl); share="resources.train.gpu_share=7 trl.gpu_memory_fraction=0.07"
    fi  # else (or with PARITY_TESTED_ONLY=1) the six tested verl runs only: GRPO and RepExp, seeds 1-3
    # shellcheck disable=SC2046
    snakemake $(python3 benchmarks/parity_report.py --targets "${with_trl[@]}") \
        --configfile configs/pilot.yaml configs/overlays/parity.yaml --cores "$(nproc)" --resources gpu_share=100 \
        --keep-going --config set="$share"
    code=$?
    echo "parity snakemake exit $code after $((SECONDS - started)) s ($share)"
    python3 benchmarks/parity_report.py --results results/parity --out "$OUT/parity"
    mkdir -p "$OUT/parity/train"
    for run in results/parity/train/arith-mid/*/; do
        cp "$run/metrics.jsonl" "$OUT/parity/train/$(basename "$run").jsonl" 2>/dev/null
        cp "$run/startup.json" "$OUT/parity/train/$(basename "$run").startup.json" 2>/dev/null
    done
    cp results/parity/benchmarks/train/arith-mid/*.tsv "$OUT/parity/train/" 2>/dev/null
    return $code
}

stage_trl_engines() {
    # every group of trainings must end within --timeout s; a failed training's log tail is printed here
    # TRL_ENGINES_ARGS replaces the groups, e.g. "--engines vllm --parallel auto --mps both"
    # shellcheck disable=SC2086
    python3 benchmarks/trl_step.py ${TRL_ENGINES_ARGS:---engines hf vllm --parallel 1 auto} --steps 6 --timeout 150 \
        --out "$OUT/trl_engines"
}

mark "start ${STAGES[*]}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
for stage in "${STAGES[@]}"; do
    mkdir -p "$OUT/$stage"
    mark "begin $stage"
    "stage_$stage" >"$OUT/$stage.log" 2>&1
    mark "end $stage exit=$?"
done
mark "done"
