#!/usr/bin/env bash
# The pilot on one GPU node, timed, as docs/pilot.md records it (the offline GPU stack installed:
# `repexp`, `snakemake`, `mlflow` on PATH):
#
#   bash benchmarks/pilot_gpu.sh                          # the third design: the README's pilot command
#   bash benchmarks/pilot_gpu.sh --part N [--carry FILE]  # part N of the fourth design (configs/overlays/pilot4.yaml)
#
# Runs the README's command exactly (for a part: the body of its loop with sweep.part=N), then
# benchmarks/dag_report.py (per-node wall times, test pass@k per run, one sweep point's MLflow tree),
# then gathers the small outputs worth keeping (the aggregate table, figures, per-run training metrics,
# eval.json and testtime.json files, logs and the MLflow store; not checkpoints or sample stores) into
# results/pilot_bundle/ (a part: results/pilot4_bundle/part-N/).
#
# A part's aggregate pools every part whose outputs are in the results directory. On a machine that
# starts bare for each part, --carry FILE brings the earlier parts along: FILE (a tar.gz, absent on the
# first part) is unpacked into results/pilot4 before the run, and the part's bundle holds carry.tar.gz,
# the small outputs of every part so far, to pass as --carry to the next part.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PART="" CARRY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --part) PART="${2:?--part N}"; shift 2 ;;
        --carry) CARRY="${2:?--carry FILE}"; shift 2 ;;
        *) echo "pilot_gpu.sh: unknown argument $1 (--part N, --carry FILE)" >&2; exit 2 ;;
    esac
done
CONFIGS=(configs/pilot.yaml) SET=() RESULTS=results/pilot BUNDLE=results/pilot_bundle POINT=trl_repexp_k32_b0.1_s1
if [ -n "$PART" ]; then
    CONFIGS+=(configs/overlays/pilot4.yaml) SET=(--config "set=sweep.part=$PART") RESULTS=results/pilot4
    BUNDLE=results/pilot4_bundle/part-$PART
    # the part's RepExp run, whose MLflow tree dag_report.py records
    RUNS=$(repexp config runs "${CONFIGS[@]}" --set "sweep.part=$PART") || exit 2
    POINT=$(grep -m1 /trl_repexp_ <<<"$RUNS") && POINT=${POINT#*/} || exit 2
    if [ -n "$CARRY" ] && [ -f "$CARRY" ]; then
        mkdir -p "$RESULTS" && tar -C "$RESULTS" -xzf "$CARRY" || exit 2
        echo "pilot_gpu.sh: earlier parts from $CARRY: $(tar -tzf "$CARRY" | grep -c 'eval.json$') evaluations"
    fi
fi
mkdir -p "$BUNDLE"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$BUNDLE/gpu.csv" 2>&1
nproc > "$BUNDLE/nproc.txt"
( while sleep 15; do nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader;
    df -B1 --output=used "$RESULTS" 2>/dev/null | tail -1; done ) > "$BUNDLE/gpu_usage.csv" 2>&1 &
sampler=$!
started=$(date +%s)
snakemake all --configfile "${CONFIGS[@]}" --cores 16 --resources gpu_share=100 "${SET[@]}"
code=$?
echo "{\"exit\": $code, \"wall_s\": $(( $(date +%s) - started )), \"part\": \"$PART\"}" > "$BUNDLE/wall.json"
kill "$sampler" 2>/dev/null
TASK=$(python3 -c "import yaml; print(yaml.safe_load(open('configs/pilot.yaml'))['sweep']['tasks'][0])")
python3 benchmarks/dag_report.py --results "$RESULTS" --point "$TASK/$POINT" \
    --out "$BUNDLE/dag_report.json" > /dev/null 2>"$BUNDLE/dag_report.err"
for d in aggregate figures benchmarks logs; do
    [ -d "$RESULTS/$d" ] && cp -r "$RESULTS/$d" "$BUNDLE/"
done
small() {  # the named small outputs of every run in the results directory, as a tar stream on stdout
    local names=() name
    for name in "$@"; do names+=(-o -name "$name"); done
    ( cd "$RESULTS" && find train eval testtime data -maxdepth 3 \( "${names[@]:1}" \) -print0 2>/dev/null | tar --null -cf - -T - )
}
small metrics.jsonl best_dev.json select.json eval.json testtime.json DONE manifest.json | tar -C "$BUNDLE" -xf -
# what a later part's aggregate pools (no DONE or select.json: those would mark trainings finished whose
# checkpoints are not there)
[ -n "$PART" ] && small metrics.jsonl best_dev.json eval.json testtime.json | gzip > "$BUNDLE/carry.tar.gz"
cp "$RESULTS"/mlflow/mlflow.db "$BUNDLE/" 2>/dev/null
exit $code
