#!/usr/bin/env bash
# Run a training command, across several SLURM nodes through one Ray cluster when asked to.
#
#   ray_slurm.sh NODES GPUS_PER_NODE CPUS_PER_NODE COMMAND [ARGS...]
#
# NODES <= 1: exec COMMAND (single node; verl starts its own local Ray).
# NODES  > 1: inside the train rule's multi-node allocation (repexp.pipeline.Pipeline.resources), run
# once in the batch step on the first node. The jobstep strips SLURM_* variables except SLURM_JOB_ID
# (orchestration notes §2.4): the node list comes from squeue/scontrol, the counts from the arguments.
# Starts a Ray head here and one worker per other node, each a job step binding the node's share
# (--cpus-per-task, --gres: under cgroup confinement a step without them gets one CPU and no GPU),
# waits until all joined, exports RAY_ADDRESS for verl's ray.init(), runs COMMAND, stops Ray on exit.
#
# REPEXP_RAY_MIN_NODES=1 sends a one-node allocation through the multi-node path (how the test
# cluster, which has one node, checks the srun steps; docs/slurm.md).
set -euo pipefail

if [ "$#" -lt 4 ]; then
    echo "usage: $0 NODES GPUS_PER_NODE CPUS_PER_NODE COMMAND [ARGS...]" >&2
    exit 2
fi
nodes=$1 gpus=$2 cpus=$3
shift 3

if [ "$nodes" -lt "${REPEXP_RAY_MIN_NODES:-2}" ]; then
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
# One task per node holding that node's share of the allocation; --overlap lets these steps share
# it with the batch step (COMMAND) and with each other.
step=(srun --overlap --nodes=1 --ntasks=1 --cpus-per-task="$cpus")
[ "$gpus" -eq 0 ] || step+=(--gres="gpu:$gpus")
head_node=${hosts[0]}
head_ip=$(srun --overlap --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | awk '{print $1}')
port=${REPEXP_RAY_PORT:-6379}
export RAY_ADDRESS="$head_ip:$port"
# Ray 2.60 turns token authentication on for a head that `ray start` creates, and a node or driver
# without the head's token is refused. One fresh token per job, exported so that every srun step
# (srun passes the environment on) and COMMAND's ray.init() hold it; never ~/.ray/auth_token, which
# every job and the user's own clusters share.
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(32))')
export RAY_AUTH_TOKEN
# Ray's temp dir per job: several jobs may share a node.
ray_tmp="${TMPDIR:-/tmp}/ray-$SLURM_JOB_ID"

pids=()
cleanup() {
    # Each step's `ray start --block` stops the Ray processes it started when srun forwards SIGTERM;
    # never `ray stop --force`, which kills every Ray instance on the host, other jobs' included.
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

echo "ray_slurm.sh: head $head_node ($RAY_ADDRESS), workers ${hosts[*]:1:$((nodes - 1))}," \
    "$cpus CPUs and $gpus GPUs per node" >&2
"${step[@]}" -w "$head_node" \
    ray start --head --node-ip-address="$head_ip" --port="$port" --temp-dir="$ray_tmp" \
    --num-cpus="$cpus" --num-gpus="$gpus" --include-dashboard=false --block &
pids+=($!)
sleep 10
for host in "${hosts[@]:1:$((nodes - 1))}"; do
    "${step[@]}" -w "$host" \
        ray start --address="$RAY_ADDRESS" --num-cpus="$cpus" --num-gpus="$gpus" --block &
    pids+=($!)
done

# Wait (up to 5 minutes) until every node has joined with its CPUs and GPUs.
want_cpus=$((nodes * cpus)) want_gpus=$((nodes * gpus))
ready() { [ "${alive:-0}" -ge "$nodes" ] && [ "${have_cpus:-0}" -ge "$want_cpus" ] && [ "${have_gpus:-0}" -ge "$want_gpus" ]; }
for _ in $(seq 60); do
    read -r alive have_cpus have_gpus < <(python -c "
import ray
ray.init(address='$RAY_ADDRESS', logging_level='ERROR')
total = ray.cluster_resources()
print(sum(n['Alive'] for n in ray.nodes()), int(total.get('CPU', 0)), int(total.get('GPU', 0)))
" 2>/dev/null || echo 0 0 0)
    ready && break
    sleep 5
done
if ! ready; then
    echo "ray_slurm.sh: Ray has ${alive:-0}/$nodes nodes, ${have_cpus:-0}/$want_cpus CPUs, ${have_gpus:-0}/$want_gpus GPUs" >&2
    exit 1
fi
echo "ray_slurm.sh: Ray ready: $alive nodes, $have_cpus CPUs, $have_gpus GPUs" >&2

"$@"
