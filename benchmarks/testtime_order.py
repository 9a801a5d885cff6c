"""Test-time RepExp ordering: the per-step solve (definition) vs `greedy_order`, same pools, one run.

    python benchmarks/testtime_order.py                       # CPU, and the GPU too when one is present
    python benchmarks/testtime_order.py --out bench/testtime  # also writes testtime_order.{json,md}

Pools are random features [n, d] per problem (a few duplicated rows each), G problems. Variants:
- reference: `greedy_order_reference`, one pool at a time, a fresh d×d solve per step (the definition).
  On large configs it is timed on the first --reference-pools pools and scaled linearly (marked "×G/N").
- per-pool: `greedy_order` called on one pool at a time (the update rule without the batching).
- batched cpu / batched cuda: `greedy_order` on all G pools at once (cuda only when available).
Orders are checked equal to the reference on the pools it ran. Latency: median of --repeats
(sync; call; sync); ratios are against the reference in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' oracle; last: shadows nothing

from greedy_reference import greedy_order_reference  # noqa: E402

from repexp.elliptical_order import greedy_order, pad_pools  # noqa: E402

CPU_CONFIGS = ("32x64x32", "128x256x32", "32x256x128")
GPU_CONFIGS = ("128x256x32", "1319x256x32", "1319x256x128", "5000x256x32")
LAMB = 0.01


def make_pools(groups: int, n: int, dim: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    pools = rng.normal(size=(groups, n, dim))
    for pool in pools:  # duplicates, as sampled responses have
        src = rng.choice(n, max(1, n // 16), replace=False)
        pool[rng.choice(n, len(src), replace=False)] = pool[src]
    return list(pools)


def timed(fn, device: str, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def bench(config: str, devices: list[str], repeats: int, reference_pools: int) -> dict:
    groups, n, dim = (int(x) for x in config.split("x"))
    pools = make_pools(groups, n, dim)
    row: dict = {"config": config, "groups": groups, "n": n, "dim": dim, "variants": {}}
    used = min(groups, reference_pools)
    ref_time, ref_orders = timed(lambda: [greedy_order_reference(p, lamb=LAMB)[0] for p in pools[:used]], "cpu", 1)
    row["variants"]["reference"] = {"seconds": ref_time * groups / used, "measured_pools": used}
    per_time, _ = timed(lambda: [greedy_order(p, lamb=LAMB).order for p in pools[:used]], "cpu", 1)
    row["variants"]["per-pool"] = {"seconds": per_time * groups / used, "measured_pools": used}
    for device in devices:
        padded, sizes = pad_pools(pools, device=device)
        greedy_order(padded[:2], sizes[:2], lamb=LAMB)  # warm-up (CUDA context, kernels)
        seconds, result = timed(lambda: greedy_order(padded, sizes, lamb=LAMB), device, repeats)
        got = result.order[:used].cpu().tolist()
        same = all(g == r for g, r in zip(got, ref_orders))
        row["variants"][f"batched {device.split(':')[0]}"] = {"seconds": seconds, "orders_match_reference": same}
    base = row["variants"]["reference"]["seconds"]
    for variant in row["variants"].values():
        variant["speedup_vs_reference"] = base / variant["seconds"]
    return row


def markdown(rows: list[dict], env: dict) -> str:
    title = f"# test-time ordering benchmark ({env['device_name']}, torch {env['torch']}, {env['threads']} threads)"
    lines = [title, "",
             "| G × n × d | variant | seconds | vs reference | orders = reference |", "|---|---|---|---|---|"]
    for row in rows:
        for name, v in row["variants"].items():
            measured = v.get("measured_pools", row["groups"])
            scaled = f" (×{row['groups']}/{measured})" if measured < row["groups"] else ""
            match = {True: "yes", False: "NO"}.get(v.get("orders_match_reference"), "–")
            lines.append(f"| {row['config']} | {name}{scaled} | {v['seconds']:.4f} | "
                         f"{v['speedup_vs_reference']:.1f}× | {match} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="*", help="GxNxD configs (default: CPU set, plus the GPU set on a GPU)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reference-pools", type=int, default=16, help="pools the slow variants are timed on")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", type=Path, help="directory for testtime_order.json and testtime_order.md")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    configs = args.configs or (list(dict.fromkeys(CPU_CONFIGS + (GPU_CONFIGS if cuda else ()))))
    env = {"torch": torch.__version__, "threads": torch.get_num_threads(),
           "cpu": platform.processor() or platform.machine(),
           "device_name": torch.cuda.get_device_name(0) if cuda else "CPU only", "load": os.getloadavg()[0]}
    rows = []
    for config in configs:
        devices = ["cpu"] + (["cuda"] if cuda else [])
        if cuda and config in GPU_CONFIGS and config not in CPU_CONFIGS:
            devices = ["cuda"]  # the large configs only where they are meant to run
        row = bench(config, devices, args.repeats, args.reference_pools)
        rows.append(row)
        print("\n".join(markdown([row], env).splitlines()[4:]), flush=True)
    report = markdown(rows, env)
    print(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "testtime_order.json").write_text(json.dumps({"env": env, "rows": rows}, indent=2))
        (args.out / "testtime_order.md").write_text(report)
    return 0 if all(v.get("orders_match_reference", True) for r in rows for v in r["variants"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
