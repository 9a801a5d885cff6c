"""Batched elliptical bonus vs the sequential Sherman–Morrison loop, same inputs, one run.

    python benchmarks/elliptical.py --device cpu
    python benchmarks/elliptical.py --device cuda --profile --out results.json

Every timed call starts from hidden states [B, 3584] (float32) and includes the sparse
projection to --sparse-dim, as in training. Variants:
- sequential: upstream's structure (§6.4 of upstream_recipe.md): for each uid, a numpy
  mask over the batch, centre, one Sherman–Morrison update per rollout from I/λ, then the
  bonuses. It divides by the 1×1 denominator instead of upstream's torch.inverse, so it is
  a slightly faster baseline than upstream itself.
- batched: `bonuses(hidden @ P, uid_strings)`: label mapping and host syncs included.
- layout: `group_layout(uids, device=...)`, the host-side label mapping a trainer does once per
  step (timed on its own; the fast variants below take it as input).
- fast: `bonuses(hidden @ P, layout, check_finite=False)`: no host sync; solver "auto".
- fast n×n / fast d×d: the same with the kernel or the covariance form forced.
- CUDA graph (cuda only): the fast path captured once and replayed; launch overhead removed.
Latency = median over repeats of (sync; call; sync). Ratios are against sequential.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from repexp.elliptical import bonuses, choose_solver, group_layout, sparse_projection  # noqa: E402


def sequential_bonuses(hidden, uids, projection, lamb, reward_type, out_dtype=torch.float32):
    """Upstream-shaped loop: per uid mask, centre, rank-1 inverse updates, per-row bonus."""
    features = (hidden.float() @ projection).to(torch.float64)
    out = torch.zeros(features.shape[0], dtype=torch.float64, device=features.device)
    dim = features.shape[1]
    seen = set()
    for uid in uids:
        if uid in seen:
            continue
        seen.add(uid)
        mask = torch.as_tensor(uids == uid, device=features.device)
        rows = features[mask]
        rows = rows - rows.mean(dim=0)
        inverse = torch.eye(dim, dtype=torch.float64, device=features.device) / lamb
        for row in rows:
            projected = inverse @ row
            inverse = inverse - torch.outer(projected, projected) / (1.0 + row @ projected)
        leverage = torch.einsum("id,de,ie->i", rows, inverse, rows)
        out[mask] = leverage if reward_type == "leverage" else leverage / (1.0 - leverage)
    return out.to(out_dtype)


def sequential_bonuses_float64(hidden, uids, projection, lamb, reward_type):
    return sequential_bonuses(hidden, uids, projection, lamb, reward_type, out_dtype=torch.float64)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def latency_ms(fn, device, repeats, warmup):
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def make_inputs(num_groups, group_size, hidden_dim, device, seed):
    """Hidden states and uuid-string uids, groups interleaved in shuffled order like a balanced batch."""
    rng = np.random.default_rng(seed)
    uids = np.array([str(uuid.UUID(int=int(rng.integers(2**63)))) for _ in range(num_groups)], dtype=object)
    uids = np.repeat(uids, group_size)
    rng.shuffle(uids)
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(uids.size, hidden_dim, generator=generator).to(device)
    return hidden, uids


def cuda_graph_runner(fn, example):
    """Capture fn(static_input) once; return a replay function and the static output."""
    static_input = example.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(static_input)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_output = fn(static_input)
    return graph.replay, static_output


def enqueue_ms(fn, device, repeats):
    """Host time to issue one call without waiting for the GPU: the launch-side cost."""
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    sync(device)
    return statistics.median(times)


def profile_fast_path(fast, device, calls=10):
    """Where the time of one fast call goes: kernels launched and their summed GPU time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for _ in range(5):
        fast()
    sync(device)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fast()
        sync(device)
    averages = prof.key_averages()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    device_us = sum(e.time_range.elapsed_us() for e in kernels) / calls  # GPU busy time, kernels only
    cpu_us = sum(e.self_cpu_time_total for e in averages) / calls
    sort_key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return {
        "kernels_per_call": len(kernels) / calls,
        "gpu_kernel_time_us_per_call": device_us,
        "cpu_op_time_us_per_call": cpu_us,
        "table": averages.table(sort_by=sort_key, row_limit=25),
    }


def run(args):
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device available")
    torch.manual_seed(0)
    projection = sparse_projection(args.hidden_dim, args.sparse_dim, seed=0, device=device)
    rows = []
    profile_result = None
    for spec in args.configs.split(","):
        num_groups, group_size = (int(part) for part in spec.lower().split("x"))
        hidden, uids = make_inputs(num_groups, group_size, args.hidden_dim, device, seed=num_groups * 1000 + group_size)
        layout = group_layout(uids, device=device)
        for reward_type in ("leverage", "leave_one_out"):
            common = {"lamb": args.lamb, "reward_type": reward_type}

            def sequential():
                return sequential_bonuses(hidden, uids, projection, args.lamb, reward_type)

            def batched():
                return bonuses(hidden @ projection, uids, **common)

            def fast_from(inputs, solver="auto"):
                return bonuses(inputs @ projection, layout, check_finite=False, solver=solver, **common)

            # accuracy in float64 (the float32 outputs agree to the last bit at these sizes)
            reference = sequential_bonuses_float64(hidden, uids, projection, args.lamb, reward_type)
            candidate = bonuses(hidden @ projection, uids, out_dtype=torch.float64, **common)
            error = ((candidate - reference).abs().max() / reference.abs().max()).item()
            row = {
                "config": f"{num_groups}x{group_size}",
                "rows": num_groups * group_size,
                "sparse_dim": args.sparse_dim,
                "reward_type": reward_type,
                "auto_solver": choose_solver(group_size, args.sparse_dim, device),
                "max_rel_diff": error,
                "sequential_ms": latency_ms(sequential, device, args.seq_repeats, 1),
                "batched_ms": latency_ms(batched, device, args.repeats, 5),
                "layout_ms": latency_ms(lambda: group_layout(uids, device=device), device, args.repeats, 5),
                "fast_ms": latency_ms(lambda: fast_from(hidden), device, args.repeats, 5),
                "fast_kernel_ms": latency_ms(lambda: fast_from(hidden, "kernel"), device, args.repeats, 5),
                "fast_covariance_ms": latency_ms(lambda: fast_from(hidden, "covariance"), device, args.repeats, 5),
            }
            if device.type == "cuda":
                row["fast_enqueue_ms"] = enqueue_ms(lambda: fast_from(hidden), device, args.repeats)
                replay, graph_out = cuda_graph_runner(fast_from, hidden)
                replay()
                sync(device)
                torch.testing.assert_close(graph_out, fast_from(hidden), rtol=1e-6, atol=1e-6)
                row["cuda_graph_ms"] = latency_ms(replay, device, args.repeats, 5)
            if args.profile and spec == "256x8" and reward_type == "leverage":
                profile_result = profile_fast_path(lambda: fast_from(hidden), device)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows, profile_result


def environment(args):
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": args.device,
        "cpu_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "command": " ".join([Path(sys.executable).name] + sys.argv),
    }
    if args.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def markdown(rows, cuda):
    header = ["config", "d", "reward", "sequential ms", "batched ms", "layout ms", "fast ms (auto)",
              "fast n×n ms", "fast d×d ms"]
    header += ["fast enqueue ms", "CUDA graph ms"] if cuda else []
    header += ["seq/batched", "seq/fast"] + (["seq/graph"] if cuda else []) + ["max rel diff"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["config"], str(row["sparse_dim"]), row["reward_type"], f"{row['sequential_ms']:.1f}",
                 f"{row['batched_ms']:.3f}", f"{row['layout_ms']:.3f}",
                 f"{row['fast_ms']:.3f} ({'n×n' if row['auto_solver'] == 'kernel' else 'd×d'})",
                 f"{row['fast_kernel_ms']:.3f}", f"{row['fast_covariance_ms']:.3f}"]
        cells += [f"{row['fast_enqueue_ms']:.3f}", f"{row['cuda_graph_ms']:.3f}"] if cuda else []
        cells += [f"{row['sequential_ms'] / row['batched_ms']:.0f}×", f"{row['sequential_ms'] / row['fast_ms']:.0f}×"]
        cells += [f"{row['sequential_ms'] / row['cuda_graph_ms']:.0f}×"] if cuda else []
        cells += [f"{row['max_rel_diff']:.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--configs", default="64x8,256x8,512x16", help="comma-separated GROUPSxSIZE")
    parser.add_argument("--hidden-dim", type=int, default=3584)
    parser.add_argument("--sparse-dim", type=int, default=32)
    parser.add_argument("--lamb", type=float, default=0.01)
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per batched variant")
    parser.add_argument("--seq-repeats", type=int, default=3, help="timed calls of the sequential loop")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: OpenMP spin-waiting collapses on a shared, loaded machine)")
    parser.add_argument("--profile", action="store_true", help="profile the fast path at 256x8 (leverage)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    info = environment(args)
    print(json.dumps(info), flush=True)
    rows, profile_result = run(args)
    print()
    print(markdown(rows, args.device == "cuda"))
    if profile_result:
        print(f"\nfast path 256x8 leverage: {profile_result['kernels_per_call']:.0f} kernels/call, "
              f"{profile_result['gpu_kernel_time_us_per_call']:.1f} µs summed GPU kernel time/call, "
              f"{profile_result['cpu_op_time_us_per_call']:.1f} µs summed CPU op time/call")
        print(profile_result["table"])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"environment": info, "rows": rows, "profile": profile_result}
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
