"""How long `snakemake -n all` takes on a 300-point sweep, against baselines measured in the same run.

    .venv/bin/python benchmarks/dry_run.py [--repeats 3] [--profile-out prof.out]

Three commands, each run `--repeats` times in fresh processes (median reported):

- startup: `snakemake --version` (the interpreter + Snakemake import floor);
- small:   `snakemake -n all` on configs/test.yaml (12 jobs);
- sweep:   `snakemake -n all` on 3 tasks x 4 sparse_dims x 5 betas x 5 seeds = 300 RepExp points,
           verl backend (+ 15 GRPO, 3 base: 1,271 jobs incl. merge, aggregate, figures and the two
           download rules of the hub model and datasets).

Target (issue 7): the sweep dry run under 10 s. With --profile-out the sweep run is repeated
under cProfile and the time spent in the workflow's own Python (common.smk, repexp.config) is
printed next to Snakemake's.
"""

from __future__ import annotations

import argparse
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

SWEEP = {
    "name": "bench-300",
    "model": "Qwen/Qwen2.5-7B-Instruct",
    "data": {"source": "hf"},
    "sweep": {
        "tasks": ["math", "gsm8k", "aime24"],
        "backends": ["verl"],
        "sparse_dims": [8, 16, 32, 64],
        "betas": [0.001, 0.003, 0.01, 0.03, 0.1],
        "seeds": [1, 2, 3, 4, 5],
    },
    "resources": {"train": {"gpu": 8}},
}


def timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout + proc.stderr


def job_total(output: str) -> int:
    for line in output.splitlines():
        if line.startswith("total"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile-out", type=Path, help="also profile the sweep dry run (cProfile) into this file")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="repexp-dryrun-") as tmp:
        tmp = Path(tmp)
        sweep_cfg = tmp / "sweep300.yaml"
        sweep_cfg.write_text(yaml.safe_dump({**SWEEP, "results_dir": str(tmp / "results-300")}))
        small = ["--configfile", str(REPO / "configs" / "test.yaml"),
                 "--config", f"results_dir={tmp / 'results-small'}"]
        dry = [SNAKEMAKE, "all", "-n", "--quiet", "rules", "--directory", str(tmp)]
        commands = {
            "startup (snakemake --version)": [SNAKEMAKE, "--version"],
            "small DAG (configs/test.yaml)": [*dry, *small],
            "300-point sweep": [*dry, "--configfile", str(sweep_cfg)],
        }
        results = {}
        for name, cmd in commands.items():
            times, jobs = [], 0
            for _ in range(args.repeats):
                elapsed, out = timed(cmd, REPO)
                times.append(elapsed)
                jobs = job_total(out)
            results[name] = (statistics.median(times), min(times), jobs)

        load = os.getloadavg()[0]
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"load average {load:.1f}, python {platform.python_version()}")
        print(f"{'command':34s} {'jobs':>6s} {'median s':>9s} {'min s':>7s}")
        for name, (median, best, jobs) in results.items():
            print(f"{name:34s} {jobs:6d} {median:9.2f} {best:7.2f}")
        startup = results["startup (snakemake --version)"][0]
        small_t = results["small DAG (configs/test.yaml)"][0]
        sweep_t, _, sweep_jobs = results["300-point sweep"]
        print(f"sweep / small DAG: {sweep_t / small_t:.2f}x; sweep minus startup: {sweep_t - startup:.2f} s "
              f"({1000 * (sweep_t - startup) / max(sweep_jobs, 1):.2f} ms per job); "
              f"target < 10 s: {'met' if sweep_t < 10 else 'MISSED'}")

        if args.profile_out:
            subprocess.run([sys.executable, "-m", "cProfile", "-o", str(args.profile_out), SNAKEMAKE, "all", "-n",
                            "--quiet", "rules", "--directory", str(tmp), "--configfile", str(sweep_cfg)],
                           cwd=REPO, capture_output=True, check=True)
            stats = pstats.Stats(str(args.profile_out))
            total = stats.total_tt
            ours = sum(v[3] for k, v in stats.stats.items()  # cumulative time of top-level workflow functions
                       if k[0].endswith("common.smk") and k[2] != "<module>")
            module = sum(v[3] for k, v in stats.stats.items() if k[0].endswith("common.smk") and k[2] == "<module>")
            print(f"profile (cProfile inflates everything): total {total:.2f} s; common.smk module body "
                  f"{module:.2f} s; common.smk helper calls {ours:.2f} s (params, inputs, hashes)")


if __name__ == "__main__":
    main()
