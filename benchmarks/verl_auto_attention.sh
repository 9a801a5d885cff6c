#!/usr/bin/env bash
# verl training with the default `verl.attn_implementation: auto` on a GPU node without flash-attn
# (issue 23, item 1; docs/gpu-validation.md, "Attention `auto` on the GPU"): `configs/gpu.yaml` as it
# is (no attention overrides), on the built-in `arith` task so that the rollouts earn reward, one
# RepExp training (actor, vLLM rollout and the frozen representation model) through `repexp run train`:
#
#   bash benchmarks/verl_auto_attention.sh          # from the project root, the GPU stack installed
#
# Keeps what shows the choice in results/auto_bundle/: whether flash_attn imports, the train log
# (its "train: attention ..." line), metrics.jsonl, DONE, the job's resolved overrides and the
# MLflow store (params verl.attention.resolved / verl.attention.packing).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RESULTS=results/gpuauto
RUN=arith/verl_repexp_k32_b0.1_s42
BUNDLE=results/auto_bundle
mkdir -p "$BUNDLE"
python3 -c "import flash_attn" > "$BUNDLE/flash_attn_import.txt" 2>&1
echo "exit $?" >> "$BUNDLE/flash_attn_import.txt"
started=$(date +%s)
snakemake "$RESULTS/train/$RUN/DONE" --configfile configs/gpu.yaml --cores 12 --resources gpu=1 \
    --config set="sweep.tasks=[arith] results_dir=$RESULTS"
code=$?
echo "{\"exit\": $code, \"wall_s\": $(( $(date +%s) - started ))}" > "$BUNDLE/wall.json"
cp -r "$RESULTS/logs" "$RESULTS/benchmarks" "$BUNDLE/" 2>/dev/null
( cd "$RESULTS/train/$RUN" && cp metrics.jsonl DONE best_dev.json job.yaml "$OLDPWD/$BUNDLE/" 2>/dev/null )
find "$RESULTS/train/$RUN" -maxdepth 3 -name '*.yaml' -path '*hydra*' -exec cp {} "$BUNDLE/" \; 2>/dev/null
cp "$RESULTS/mlflow/mlflow.db" "$BUNDLE/" 2>/dev/null
exit $code
