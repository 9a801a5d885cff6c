"""verl against TRL on the pilot's task: the targets of the GPU run, then the overlay and the tolerance
fixed before it ran (docs/verl_backend.md, "verl against TRL on the GPU").

    python3 benchmarks/parity_report.py --targets [--with-trl]     # the Snakemake targets of the GPU run
    python3 benchmarks/parity_report.py --results results/parity --trl docs/pilot/train --out docs/parity

The TRL side is the pilot's third run (configs/pilot.yaml, seeds 1-3, committed under docs/pilot/train)
plus whatever TRL runs of configs/overlays/parity.yaml exist under --results; the verl side is that
overlay's runs.

The tolerance, per method (GRPO, RepExp beta 0.01), metric and window of 20 steps after step 20
(21-40, 41-60, 61-80): each run's window mean; the backends agree in a cell when
|mean over verl seeds - mean over TRL seeds| <= max(FLOOR[metric], T_CRIT * SE), with
SE = sqrt(sd_trl^2 / n_trl + sd_verl^2 / n_verl) over seeds (a seed-level two-sample bound; T_CRIT is
Student's t at 0.975 with 4 degrees of freedom, 3 + 3 seeds). Parity holds when every cell agrees.
The other methods (one seed per backend) are drawn and tabulated, not tested.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

TASK = "arith-mid"
SEEDS = (1, 2, 3)
TESTED = {"grpo": "grpo", "repexp": "repexp_k32_b0.01"}  # method -> run name without backend and seed
DESCRIBED = {"passk": "passk_k4", "outcome": "outcome_historical_c1", "cov": "kl_cov_r0.002"}
METRICS = {  # what the issue asks to overlay -> the metrics.jsonl key both backends write
    "entropy": "actor/entropy",
    "verifier reward": "reward/verifier/mean",
    "raw bonus spread (std)": "repexp/bonus_raw/std",
    "distinct rollouts": "rollout/distinct_frac",
}
FLOOR = {"entropy": 0.05, "verifier reward": 0.03, "raw bonus spread (std)": 0.03, "distinct rollouts": 0.03}
WINDOWS = ((21, 40), (41, 60), (61, 80))
T_CRIT = 2.776


def targets(with_trl: bool, results: str = "results/parity", described: bool = True) -> list[str]:
    """The tested runs (GRPO and RepExp, every seed on verl); with `described` also the other methods'
    seed 1; with `with_trl` those on TRL too and a TRL rerun of seed 1 of each tested method."""
    runs = [f"verl_{name}_s{seed}" for name in TESTED.values() for seed in SEEDS]
    if described:
        runs += [f"verl_{name}_s1" for name in DESCRIBED.values()]
    if with_trl:  # the other methods on TRL, and a rerun of the committed TRL seed 1 of each tested method
        runs += [f"trl_{name}_s1" for name in DESCRIBED.values()] + [f"trl_{name}_s1" for name in TESTED.values()]
    return [f"{results}/train/{TASK}/{run}/DONE" for run in runs]


def read_curve(path: Path, key: str) -> dict[int, float]:
    """step -> value of `key` (training steps only: validation lines carry no such key)."""
    curve = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if key in row and row["step"] >= 1:
            curve[int(row["step"])] = float(row[key])
    return curve


def window_mean(curve: dict[int, float], window: tuple[int, int]) -> float | None:
    """The mean over the window's steps; None unless the run logged every one of them."""
    values = [curve.get(step) for step in range(window[0], window[1] + 1)]
    return None if None in values else statistics.fmean(values)


def partial_window(curves: list[dict[int, float]], window: tuple[int, int]) -> tuple[int, int] | None:
    """The steps of `window` that every run logged (from its start), for a descriptive value of a cell
    the run did not complete; None when there are none."""
    last = window[0] - 1
    while last < window[1] and all(last + 1 in curve for curve in curves):
        last += 1
    return (window[0], last) if curves and last >= window[0] else None


def agree(trl: list[float], verl: list[float], floor: float) -> dict:
    """The pre-registered test of one cell: seed-level window means of each backend."""
    mean_t, mean_v = statistics.fmean(trl), statistics.fmean(verl)
    var_t = statistics.variance(trl) if len(trl) > 1 else 0.0
    var_v = statistics.variance(verl) if len(verl) > 1 else 0.0
    se = math.sqrt(var_t / len(trl) + var_v / len(verl))
    bound = max(floor, T_CRIT * se)
    return {"trl": mean_t, "verl": mean_v, "delta": mean_v - mean_t, "se": se, "bound": bound,
            "agree": abs(mean_v - mean_t) <= bound, "n_trl": len(trl), "n_verl": len(verl)}


def find_runs(results: Path, trl_dir: Path, backend: str, name: str) -> dict[int, Path]:
    """seed -> metrics.jsonl; TRL from the committed pilot files, a rerun under --results where it exists
    only for seeds the pilot lacks (the committed run is the reference)."""
    found = {}
    for seed in SEEDS:
        run = f"{backend}_{name}_s{seed}"
        committed = trl_dir / f"{run}.jsonl"
        fresh = results / "train" / TASK / run / "metrics.jsonl"
        if backend == "trl" and committed.exists():
            found[seed] = committed
        elif fresh.exists():
            found[seed] = fresh
    return found


def report(results: Path, trl_dir: Path) -> dict:
    cells = []
    for method, name in TESTED.items():
        trl_runs, verl_runs = find_runs(results, trl_dir, "trl", name), find_runs(results, trl_dir, "verl", name)
        for label, key in METRICS.items():
            if method == "grpo" and key.startswith("repexp/"):
                continue  # GRPO has no bonus
            for window in WINDOWS:
                trl = [v for v in (window_mean(read_curve(p, key), window) for p in trl_runs.values()) if v is not None]
                verl = [v for v in (window_mean(read_curve(p, key), window) for p in verl_runs.values())
                        if v is not None]
                cell = {"method": method, "metric": label, "window": f"{window[0]}-{window[1]}"}
                if len(trl) == len(trl_runs) and len(verl) == len(verl_runs) and trl and verl:
                    cells.append({**cell, **agree(trl, verl, FLOOR[label])})
                    continue
                # not tested: some run did not log the whole window; the steps all runs have, described
                cell.update(agree=None, why=f"{len(trl)}/{len(trl_runs)} TRL and {len(verl)}/{len(verl_runs)} verl "
                            "runs logged the whole window")
                curves = {backend: [read_curve(p, key) for p in runs.values()]
                          for backend, runs in (("trl", trl_runs), ("verl", verl_runs))}
                steps = partial_window(curves["trl"] + curves["verl"], window)
                if steps and curves["trl"] and curves["verl"]:
                    described = {backend: [window_mean(curve, steps) for curve in group]
                                 for backend, group in curves.items()}
                    cell["descriptive"] = {"steps": f"{steps[0]}-{steps[1]}",
                                           **agree(described["trl"], described["verl"], FLOOR[label])}
                cells.append(cell)
    tested = [cell for cell in cells if cell["agree"] is not None]
    complete = len(tested) == len(cells)
    # parity is decided only when every pre-registered cell could be tested
    return {"cells": cells, "parity": all(cell["agree"] for cell in tested) if complete else None,
            "cells_tested": len(tested), "cells_missing": len(cells) - len(tested)}


def figure(results: Path, trl_dir: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = {**TESTED, **DESCRIBED}
    runs = {method: {backend: find_runs(results, trl_dir, backend, name) for backend in ("trl", "verl")}
            for method, name in methods.items()}
    # a method none of whose runs logged a training step gets no row (the report says which runs are missing)
    methods = {method: name for method, name in methods.items()
               if any(read_curve(path, METRICS["entropy"])
                      for paths in runs[method].values() for path in paths.values())}
    fig, axes = plt.subplots(len(methods), len(METRICS), figsize=(4.2 * len(METRICS), 2.7 * len(methods)),
                             sharex=True, squeeze=False)
    colours = {"trl": "#1f77b4", "verl": "#d62728"}
    for row, method in enumerate(methods):
        for col, (label, key) in enumerate(METRICS.items()):
            ax = axes[row][col]
            drawn = False
            for backend, paths in runs[method].items():
                curves = [curve for curve in (read_curve(path, key) for path in paths.values()) if curve]
                if not curves:
                    continue
                drawn = True
                steps = sorted(set.intersection(*(set(curve) for curve in curves)))
                values = [[curve[step] for curve in curves] for step in steps]
                if len(curves) > 1 and backend == "trl":
                    ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values],
                                    color=colours[backend], alpha=0.2, linewidth=0)
                    ax.plot(steps, [statistics.fmean(v) for v in values], color=colours[backend], linewidth=1.4,
                            label=f"trl ({len(curves)} seeds: mean, band min-max)")
                    continue
                seeds = f"{len(curves)} seed{'s' if len(curves) > 1 else ''}, one line each"
                for i, curve in enumerate(curves):  # verl (and single runs): each seed its own line
                    ax.plot(sorted(curve), [curve[step] for step in sorted(curve)], color=colours[backend],
                            linewidth=1.0, alpha=0.9, label=f"{backend} ({seeds})" if i == 0 else None)
            ax.axvline(20.5, color="0.6", linewidth=0.8, linestyle=":")
            if drawn:
                ax.legend(fontsize=7, loc="best")
            else:
                ax.text(0.5, 0.5, "no bonus" if key.startswith("repexp/") else "not logged", ha="center",
                        va="center", transform=ax.transAxes, color="0.5")
            if row == 0:
                ax.set_title(label, fontsize=10)
            if col == 0:
                ax.set_ylabel(method)
            if row == len(methods) - 1:
                ax.set_xlabel("training step")
    fig.suptitle(f"verl against TRL on {TASK} (configs/pilot.yaml + configs/overlays/parity.yaml); dotted: step 20, "
                 "after which the tolerance applies", fontsize=10)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / f"parity_{TASK}.png", dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", action="store_true", help="print the GPU run's Snakemake targets")
    parser.add_argument("--with-trl", action="store_true", help="with --targets: the TRL runs too")
    parser.add_argument("--tested-only", action="store_true",
                        help="with --targets: only the runs the tolerance tests (GRPO and RepExp on verl)")
    parser.add_argument("--results", type=Path, default=Path("results/parity"))
    parser.add_argument("--trl", type=Path, default=Path("docs/pilot/train"), help="the committed TRL curves")
    parser.add_argument("--out", type=Path, help="where parity.json and the figure go")
    args = parser.parse_args()
    if args.targets:
        print(" ".join(targets(args.with_trl, str(args.results), described=not args.tested_only)))
        return
    if args.out is None:
        parser.error("--out is required unless --targets")
    result = report(args.results, args.trl)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parity.json").write_text(json.dumps(result, indent=1) + "\n")
    figure(args.results, args.trl, args.out)
    for cell in result["cells"]:
        if cell["agree"] is None:
            line = f"{cell['method']:7} {cell['metric']:24} {cell['window']:6} not tested: {cell['why']}"
            if "descriptive" in cell:
                d = cell["descriptive"]
                line += (f"; steps {d['steps']} (descriptive): TRL {d['trl']:.3f} verl {d['verl']:.3f} "
                         f"delta {d['delta']:+.3f} (bound {d['bound']:.3f})")
            print(line)
        else:
            print(f"{cell['method']:7} {cell['metric']:24} {cell['window']:6} TRL {cell['trl']:.3f} "
                  f"verl {cell['verl']:.3f} delta {cell['delta']:+.3f} bound {cell['bound']:.3f} "
                  f"{'agree' if cell['agree'] else 'DIFFER'}")
    verdict = {True: "holds", False: "FAILS", None: "undecided (not every cell could be tested)"}[result["parity"]]
    print(f"parity {verdict}: {result['cells_tested']} cells tested, {result['cells_missing']} not")


if __name__ == "__main__":
    main()
