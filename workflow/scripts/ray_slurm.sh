#!/usr/bin/env bash
# Run a training command, across several SLURM nodes through one Ray cluster when asked to.
#
#   ray_slurm.sh NODES GPUS_PER_NODE CPUS_PER_NODE COMMAND [ARGS...]
#
# NODES <= 1: exec COMMAND (single node; verl starts its own local Ray).
# NODES  > 1: called by the `train` rule inside a multi-node allocation (resources nodes=N,
# tasks=N, mpi="srun": the Snakemake jobstep runs this script once, in the batch step, on the
# allocation's first node). The jobstep strips SLURM_* variables except SLURM_JOB_ID
# (orchestration notes §2.4), so the node list comes from squeue/scontrol, not from
# SLURM_JOB_NODELIST, and the counts come from the arguments (the rule's resources).
# Starts a Ray head here and one worker per other node (srun --overlap), waits until all nodes
# joined, exports RAY_ADDRESS for verl's ray.init(), runs COMMAND here, and stops Ray on exit.
set -euo pipefail

if [ "$#" -lt 4 ]; then
    echo "usage: $0 NODES GPUS_PER_NODE CPUS_PER_NODE COMMAND [ARGS...]" >&2
    exit 2
fi
nodes=$1 gpus=$2 cpus=$3
shift 3

if [ "$nodes" -le 1 ]; then
    exec "$@"
fi

if [ -z "${SLURM_JOB_ID:-}" ]; then
    echo "ray_slurm.sh: $nodes nodes requested but not inside a SLURM allocation (SLURM_JOB_ID unset)" >&2
    exit 2
fi
for tool in squeue scontrol srun ray; do
    command -v "$tool" >/dev/null || { echo "ray_slurm.sh: $tool not found" >&2; exit 2; }
done

mapfile -t hosts < <(scontrol show hostnames "$(squeue -h -j "$SLURM_JOB_ID" -o %N)")
if [ "${#hosts[@]}" -lt "$nodes" ]; then
    echo "ray_slurm.sh: allocation $SLURM_JOB_ID has ${#hosts[@]} node(s) (${hosts[*]}), $nodes needed" >&2
    exit 2
fi
head_node=${hosts[0]}
head_ip=$(srun --overlap --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | awk '{print $1}')
port=${REPEXP_RAY_PORT:-6379}
export RAY_ADDRESS="$head_ip:$port"
# Ray's temp dir per job: several jobs may share a node.
ray_tmp="${TMPDIR:-/tmp}/ray-$SLURM_JOB_ID"

pids=()
cleanup() {
    for host in "${hosts[@]:0:$nodes}"; do
        srun --overlap --nodes=1 --ntasks=1 -w "$host" ray stop --force >/dev/null 2>&1 || true
    done
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

echo "ray_slurm.sh: head $head_node ($RAY_ADDRESS), workers ${hosts[*]:1:$((nodes - 1))}" >&2
srun --overlap --nodes=1 --ntasks=1 -w "$head_node" \
    ray start --head --node-ip-address="$head_ip" --port="$port" --temp-dir="$ray_tmp" \
    --num-cpus="$cpus" --num-gpus="$gpus" --block &
pids+=($!)
sleep 10
for host in "${hosts[@]:1:$((nodes - 1))}"; do
    srun --overlap --nodes=1 --ntasks=1 -w "$host" \
        ray start --address="$RAY_ADDRESS" --num-cpus="$cpus" --num-gpus="$gpus" --block &
    pids+=($!)
done

# Wait (up to 5 minutes) until every node has joined.
for _ in $(seq 60); do
    alive=$(python -c "import ray; ray.init(address='$RAY_ADDRESS', logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))" 2>/dev/null || echo 0)
    [ "$alive" -ge "$nodes" ] && break
    sleep 5
done
if [ "${alive:-0}" -lt "$nodes" ]; then
    echo "ray_slurm.sh: only ${alive:-0}/$nodes Ray nodes joined" >&2
    exit 1
fi

"$@"
