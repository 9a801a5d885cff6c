"""`repexp figures`: plotted data (index.json and the Axes), notes on missing runs, images, MLflow."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repexp import aggregate, cli, figures  # noqa: E402
from repexp.config import RunSpec, sweep_runs  # noqa: E402
from repexp.config import load as load_config  # noqa: E402

KS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
SEEDS = (41, 42, 43)
# pass@k = a + b·log2 k (capped at 1) per run: known seed means and SEMs
MATH = {"verl_grpo_s{}": (0.20, 0.25, 0.30), "verl_repexp_k32_b0.01_s{}": (0.25, 0.30, 0.38)}
MATH_BASE = 0.15
GSM8K = {"verl_grpo_s{}": (0.80, 0.82, 0.84), "verl_repexp_k32_b0.01_s{}": (0.85, 0.86)}  # no seed 43, no base
CONFIG = {
    "sweep": {"tasks": ["math", "gsm8k"], "backends": ["verl"], "sparse_dims": [32], "betas": [0.01],
              "seeds": list(SEEDS)},
    "task_overrides": {"gsm8k": {"sweep": {"sparse_dims": [32, 64]}}},
}


def curve(a, b=0.05, ks=KS):
    return {k: min(1.0, a + b * math.log2(k)) for k in ks}


def write_eval(root, task, run, values, n=256):
    path = root / task / run / "eval.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "pass_at_k": {str(k): v for k, v in values.items()}, "pass_at_k_sem": {str(k): 0.01 for k in values},
        "mean_at_n": values[1], "num_problems": 30, "n_samples": n, "per_problem": [], "model_path": "m",
        "checkpoint_step": 10, "engine": "hf", "sampling": {}, "seed": 0, "data_hash": "h", "task": task,
        "split": "test",
    }))


def training_records(seed, repexp):
    """metrics.jsonl lines: dev pass@1 every 10 steps, per-step rewards, policy entropy and rollout diversity
    (and bonuses for RepExp)."""
    lines = []
    for step in range(0, 21):
        record = {"step": step, "reward/verifier/mean": 0.3 + 0.01 * step + 0.001 * seed,
                  "actor/entropy": (1.2 if repexp else 1.0) * math.exp(-step / 15) + 0.03 * (seed - 41) ** 2,
                  "rollout/distinct_frac": min(1.0, 0.95 - (0.01 if repexp else 0.03) * step + 0.02 * (seed % 3))}
        if repexp:
            record["repexp/bonus_raw/mean"] = 2.0 + 0.1 * (seed - 41)
            record["repexp/bonus_scaled/mean"] = 0.01 * record["repexp/bonus_raw/mean"]
        record["reward/shaped/mean"] = record["reward/verifier/mean"] + record.get("repexp/bonus_scaled/mean", 0.0)
        lines.append(record)
        if step % 10 == 0:
            lines.append({"step": step, "dev/pass_at_1": 0.2 + 0.01 * step + 0.01 * (seed - 41)})
    return lines


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("figures")
    evals, train = root / "eval", root / "train"
    for task, runs in (("math", MATH), ("gsm8k", GSM8K)):
        for pattern, offsets in runs.items():
            for seed, a in zip(SEEDS, offsets):
                write_eval(evals, task, pattern.format(seed), curve(a, 0.03 if task == "gsm8k" else 0.05))
                if task == "math":
                    path = train / task / pattern.format(seed) / "metrics.jsonl"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text("".join(json.dumps(r) + "\n" for r in training_records(seed, "repexp" in pattern)))
    write_eval(evals, "math", "base", curve(MATH_BASE))
    aggregate.aggregate(aggregate.find_eval_files(evals), root / "aggregate")
    return root


@pytest.fixture(scope="module")
def table(workspace):
    return aggregate.read_table(workspace / "aggregate" / "pass_at_k.csv")


@pytest.fixture(scope="module")
def expected():
    return sweep_runs(load_config(CONFIG))


@pytest.fixture(scope="module")
def rendered(workspace, table, expected):
    """Every figure of the synthetic sweep, saved once; tests read index.json and the files."""
    curves = figures.training_curves_from_jsonl(workspace / "train", expected)
    out = workspace / "figures"
    figures.make_figures(table, out, expected=expected, curves=curves, curves_source="metrics.jsonl")
    return out, json.loads((out / "index.json").read_text())


def by_id(index, figure_id):
    return next(f for f in index["figures"] if f["id"] == figure_id)


def seed_stats(offsets, b=0.05):
    values = np.array([[min(1.0, a + b * math.log2(k)) for k in KS] for a in offsets])
    sem = values.std(axis=0, ddof=1) / math.sqrt(len(offsets)) if len(offsets) > 1 else None
    return values.mean(axis=0), sem


def test_pass_at_k_curves_are_seed_means_with_sem_bands(rendered):
    _, index = rendered
    record = by_id(index, "pass_at_k")
    panels = {p["task"]: p for p in record["panels"]}
    assert list(panels) == ["math", "gsm8k"] and panels["math"]["title"] == "MATH"
    series = {s["label"]: s for s in panels["math"]["series"]}
    assert list(series) == ["RepExp", "GRPO", "Base model"]
    for label, offsets in (("RepExp", MATH["verl_repexp_k32_b0.01_s{}"]), ("GRPO", MATH["verl_grpo_s{}"])):
        mean, sem = seed_stats(offsets)
        assert series[label]["k"] == KS and series[label]["seeds"] == list(SEEDS)
        np.testing.assert_allclose(series[label]["mean"], mean, rtol=1e-12)
        np.testing.assert_allclose(series[label]["sem"], sem, rtol=1e-9)
        np.testing.assert_allclose(series[label]["band"]["upper"], mean + sem, rtol=1e-9)
    base = series["Base model"]
    assert base["sem"] is None and base["band"] is None
    np.testing.assert_allclose(base["mean"], [MATH_BASE + 0.05 * math.log2(k) for k in KS])
    assert "±1 SEM band across seeds" in record["caption"]
    assert "Shaded bands: ±1 SEM across seeds (ddof 1)." in record["notes"]  # on the figure too (issue 39)


def test_axes_hold_the_plotted_values_and_limits_adapt(table, expected):
    fig, record = figures.plot_pass_at_k(table, tasks=["math", "gsm8k"], expected=expected)
    math_ax, gsm8k_ax = fig.axes
    lines = {line.get_label(): line for line in math_ax.lines}
    np.testing.assert_allclose(lines["GRPO"].get_ydata(), seed_stats(MATH["verl_grpo_s{}"])[0])
    assert list(lines["GRPO"].get_xdata()) == KS and math_ax.get_xscale() == "log"
    assert len(math_ax.collections) == 2  # SEM bands of RepExp and GRPO; none for the base model
    for ax, panel in ((math_ax, record["panels"][0]), (gsm8k_ax, record["panels"][1])):
        lo, hi = ax.get_ylim()
        values = [v for s in panel["series"] for key in ("mean",) for v in s[key]]
        values += [v for s in panel["series"] if s["band"] for v in s["band"]["lower"] + s["band"]["upper"]]
        assert lo < min(values) and hi > max(values)  # nothing cropped (upstream hard-coded limits did)
        assert hi - lo < 1.3 * (max(values) - min(values)) + 0.05  # and no wasted range
    assert gsm8k_ax.get_ylim()[1] <= 1.03  # values at 1.0 stay visible without a pointless margin
    matplotlib.pyplot.close(fig)


def test_missing_runs_are_named_on_the_figure_and_in_the_index(rendered):
    _, index = rendered
    missing = {"gsm8k/verl_repexp_k32_b0.01_s43", "gsm8k/base",
               *(f"gsm8k/verl_repexp_k64_b0.01_s{s}" for s in SEEDS)}
    assert set(index["missing_evaluations"]) == missing
    assert len(index["missing_training_metrics"]) == 9  # nothing logged for GSM8K in this workspace
    record = by_id(index, "pass_at_k")
    assert set(record["missing_runs"]) == missing
    note = " ".join(record["notes"])
    assert "GSM8K: missing runs:" in note and "verl_repexp_k32_b0.01_s43" in note and "base" in note
    assert "verl_repexp_k64_b0.01_s{41,42,43}" in note  # a whole missing sweep point reads as one entry
    gsm8k = {s["label"]: s for s in record["panels"][1]["series"]}
    assert gsm8k["RepExp"]["seeds"] == [41, 42] and gsm8k["RepExp"]["n_seeds"] == 2


def test_without_a_config_incomplete_seeds_and_methods_are_still_reported(table):
    fig, record = figures.plot_pass_at_k(table)
    matplotlib.pyplot.close(fig)
    assert "GSM8K: RepExp (dim=32, β=0.01): no seed 43" in record["notes"]
    assert "GSM8K: no base-model run" in record["notes"]
    assert record["missing_runs"] == ["gsm8k/verl_repexp_k32_b0.01_s43"]


def test_one_seed_has_no_band_and_says_so(tmp_path):
    for run, a in (("trl_grpo_s7", 0.3), ("trl_repexp_k8_b0.1_s7", 0.35), ("base", 0.2)):
        write_eval(tmp_path / "eval", "aime24", run, curve(a))
    aggregate.aggregate(aggregate.find_eval_files(tmp_path / "eval"), tmp_path / "agg")
    table = aggregate.read_table(tmp_path / "agg" / "pass_at_k.csv")
    fig, record = figures.plot_pass_at_k(table)
    assert not fig.axes[0].collections  # no bands at all
    matplotlib.pyplot.close(fig)
    assert all(s["sem"] is None for s in record["panels"][0]["series"])
    assert "one seed: no band" in record["caption"] and "Lines with one seed have no band." in record["notes"]
    assert record["panels"][0]["title"] == "AIME 2024"


def test_figures_take_a_runs_fields_from_the_table_never_from_its_name(tmp_path):
    """Runs outside any config (eval dirs aggregated by hand) plot from the table's columns."""
    for run in ("trl_grpo_s7", "trl_repexp_k8_b0.1_s7", "base"):
        write_eval(tmp_path / "eval", "aime24", run, curve(0.3))
    aggregate.aggregate(aggregate.find_eval_files(tmp_path / "eval"), tmp_path / "agg")
    table = aggregate.read_table(tmp_path / "agg" / "pass_at_k.csv")
    table["run"] = "renamed"  # not read
    assert figures.table_specs(table) == [RunSpec.of("aime24", "repexp", "trl", 7, sparse_dim=8, beta=0.1),
                                          RunSpec.of("aime24", "grpo", "trl", 7), RunSpec("aime24", "base")]


def test_many_sweep_points_keep_the_paper_setting_in_the_curves(tmp_path):
    points = [(8, 0.01), (32, 0.001), (32, 0.01), (32, 0.1), (128, 0.01)]
    for k, beta in points:
        write_eval(tmp_path / "eval", "math", f"trl_repexp_k{k}_b{beta}_s1", curve(0.3))
    write_eval(tmp_path / "eval", "math", "trl_grpo_s1", curve(0.25))
    aggregate.aggregate(aggregate.find_eval_files(tmp_path / "eval"), tmp_path / "agg")
    table = aggregate.read_table(tmp_path / "agg" / "pass_at_k.csv")
    fig, record = figures.plot_pass_at_k(table, max_repexp_lines=4)
    matplotlib.pyplot.close(fig)
    repexp = [s for s in record["panels"][0]["series"] if s["method"] == "repexp"]
    assert [(s["sparse_dim"], s["beta"]) for s in repexp] == [(32, 0.01)]
    assert any("4 further RepExp sweep points are in the heatmap" in n for n in record["notes"])
    assert figures.select_repexp_points("math", points[:4], 4) == sorted(points[:4])


def test_heatmaps_cover_the_configured_grid(rendered, table, expected):
    _, index = rendered
    # MATH's sweep is one point: no heatmap is drawn (its numbers are rows of the aggregate tables); the
    # cell values plot_heatmap would show are still checked here
    assert not any(f["id"] == "heatmap_math_verl_repexp" for f in index["figures"])
    assert not (rendered[0] / "heatmap_math_verl_repexp.png").exists()
    _, math_map = figures.plot_heatmap(table, "math", "verl", "repexp", expected=expected)
    assert (math_map["rows"], math_map["columns"]) == ("sparse_dim", "beta")
    assert math_map["row_values"] == [32] and math_map["column_values"] == [0.01]
    pass1, pass256, efficiency = math_map["panels"]
    mean, _ = seed_stats(MATH["verl_repexp_k32_b0.01_s{}"])
    assert pass1["cells"][0]["value"] == pytest.approx(mean[0]) and pass1["cells"][0]["n_seeds"] == 3
    assert pass256["metric"] == "pass@256" and pass256["cells"][0]["value"] == pytest.approx(mean[-1])
    assert pass1["grpo"] == pytest.approx(seed_stats(MATH["verl_grpo_s{}"])[0][0])
    # RepExp's mean curve is GRPO's + 0.06 → it reaches GRPO's pass@256 at log2 k = 8 − 0.06/0.05
    assert efficiency["cells"][0]["k_star"] == pytest.approx(2 ** (8 - 1.2))
    assert efficiency["cells"][0]["value"] == pytest.approx(2 ** 1.2)
    gsm8k_map = by_id(index, "heatmap_gsm8k_verl_repexp")
    assert gsm8k_map["row_values"] == [32, 64] and gsm8k_map["method"] == "repexp"
    cells = {(c["sparse_dim"], c["beta"]): c for c in gsm8k_map["panels"][0]["cells"]}
    assert cells[(32, 0.01)]["n_seeds"] == 2 and cells[(64, 0.01)]["value"] is None
    assert any("no seed 43" in n or "verl_repexp_k32_b0.01_s43" in n for n in gsm8k_map["notes"])


def test_training_curves_from_metrics_jsonl(rendered):
    _, index = rendered
    record = by_id(index, "training_math_verl")
    panels = {p["title"]: p for p in record["panels"]}
    dev = {s["label"]: s for s in panels["dev pass@1"]["series"]}
    assert dev["GRPO"]["step"] == [0, 10, 20]
    np.testing.assert_allclose(dev["GRPO"]["mean"], [0.21, 0.31, 0.41])  # seeds add 0, .01, .02
    np.testing.assert_allclose(dev["GRPO"]["sem"], [0.01 / math.sqrt(3)] * 3)
    bonus = panels["bonus (raw), mean"]["series"]
    assert [s["label"] for s in bonus] == ["RepExp"] and bonus[0]["mean"][0] == pytest.approx(2.1)
    reward = panels["reward: shaped (—) vs verifier (- -)"]["series"]
    assert {(s["label"], s["metric"]) for s in reward} == {  # GRPO (β = 0): shaped = verifier, drawn once
        ("RepExp", "reward/shaped/mean"), ("RepExp", "reward/verifier/mean"), ("GRPO", "reward/verifier/mean")}
    assert record["missing_runs"] == []
    gsm8k = by_id(index, "training_gsm8k_verl")  # no metrics.jsonl at all: the figure says so
    assert len(gsm8k["missing_runs"]) == 9 and "no training metrics" in gsm8k["notes"][0]


def test_every_file_exists_and_pngs_have_the_recorded_size(rendered):
    from PIL import Image

    out, index = rendered
    listed = [name for f in index["figures"] for name in f["files"]]
    spec = figures.figure_files(sweep_runs(load_config(CONFIG)))
    assert sorted(listed) == sorted(name for kind, names in spec.items() if kind != "index" for name in names)
    assert {"k_efficiency.png", "dynamics_math_verl.pdf", "dynamics_gsm8k_verl.png"} <= set(listed)
    for figure in index["figures"]:
        png, pdf = (out / name for name in figure["files"])
        assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 5000
        with Image.open(png) as image:
            assert list(image.size) == figure["size_px"]
            pixels = np.asarray(image.convert("L"), dtype=float)
        assert pixels.std() > 10  # drawn, not blank
        assert figure["caption"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp debris


def test_dynamics_figure_is_the_seed_mean_and_sem_of_metrics_jsonl(rendered):
    _, index = rendered
    record = by_id(index, "dynamics_math_verl")
    assert record["kind"] == "dynamics" and record["missing_runs"] == [] and record["notes"] == []
    panels = {tuple(p["metrics"]): p for p in record["panels"]}
    assert set(panels) == {("actor/entropy",), ("rollout/distinct_frac",)}
    for metric in ("actor/entropy", "rollout/distinct_frac"):
        series = {s["label"]: s for s in panels[(metric,)]["series"]}
        assert list(series) == ["RepExp", "GRPO"]
        for label, repexp in (("RepExp", True), ("GRPO", False)):
            # by hand, from the lines written to the three seeds' metrics.jsonl
            per_seed = np.array([[r[metric] for r in training_records(seed, repexp) if metric in r] for seed in SEEDS])
            line = series[label]
            assert line["step"] == list(range(21)) and line["n_seeds"] == [3] * 21 and len(line["runs"]) == 3
            np.testing.assert_allclose(line["mean"], per_seed.mean(axis=0), rtol=1e-12)
            np.testing.assert_allclose(line["sem"], per_seed.std(axis=0, ddof=1) / math.sqrt(3), rtol=1e-9)
    gsm8k = by_id(index, "dynamics_gsm8k_verl")  # no metrics.jsonl: the panels are empty and the runs named
    assert len(gsm8k["missing_runs"]) == 9 and not any(p["series"] for p in gsm8k["panels"])
    assert "no training metrics" in gsm8k["notes"][0]


def test_dynamics_panel_without_its_metric_says_what_is_missing(workspace, expected):
    curves = figures.training_curves_from_jsonl(workspace / "train", expected)
    for path, metrics in curves.items():
        if "grpo" in path:  # runs from before the trainers logged rollout diversity
            metrics.pop("rollout/distinct_frac")
    fig, record = figures.plot_dynamics(curves, "math", "verl", specs=expected, source="metrics.jsonl")
    matplotlib.pyplot.close(fig)
    diversity = record["panels"][1]
    assert [s["label"] for s in diversity["series"]] == ["RepExp"]
    assert diversity["runs_without_metric"] == [f"verl_grpo_s{s}" for s in SEEDS]
    assert any("rollout/distinct_frac not logged by verl_grpo_s{41,42,43}" in n for n in record["notes"])
    for metrics in curves.values():
        metrics.pop("rollout/distinct_frac", None)
    fig, record = figures.plot_dynamics(curves, "math", "verl", specs=expected, source="metrics.jsonl")
    texts = [t.get_text().replace("\n", " ") for t in fig.axes[1].texts]
    matplotlib.pyplot.close(fig)
    assert record["panels"][1]["series"] == [] and record["panels"][0]["series"]
    assert any("no rollout/distinct_frac logged by any run" in t for t in texts)
    assert any("no run logged rollout/distinct_frac" in n for n in record["notes"])


def test_k_efficiency_figure_without_counts_has_values_but_no_intervals(rendered):
    _, index = rendered
    record = by_id(index, "k_efficiency")
    assert record["kind"] == "k_efficiency" and record["bootstrap"] is None
    assert any(n.startswith("No bootstrap intervals") for n in record["notes"])
    math_panel = {p["task"]: p for p in record["panels"]}["math"]
    (line,) = math_panel["series"]
    assert line["reference_k"] == KS[1:] and line["lo"] == [None] * 8
    # RepExp = GRPO + 0.06 on a 0.05·log2 k slope: k* = ref / 2^1.2 at every reference k ≥ 4; at k = 2 RepExp's
    # pass@1 already beats GRPO's pass@2: reached at the smallest k, 2× (a lower bound, drawn as such)
    np.testing.assert_allclose(line["efficiency"], [2.0] + [2 ** 1.2] * 7)
    assert line["status"] == ["reached at the smallest k"] + ["reached"] * 7
    assert set(record["missing_runs"]) == set(index["missing_evaluations"])


def test_k_efficiency_figure_draws_the_bootstrap_intervals(tmp_path):
    from repexp import passk

    rng = np.random.default_rng(5)
    rate = rng.beta(0.6, 1.2, 40)
    n, ks = 16, passk.power_of_two_ks(16)

    def write_counts(run, counts):
        mean, _ = passk.summarize(passk.pass_at_k(np.full(len(counts), n), counts, ks))
        write_eval(tmp_path / "eval", "math", run, dict(zip(ks, mean.tolist())), n=n)
        path = tmp_path / "eval" / "math" / run / "eval.json"
        data = json.loads(path.read_text())
        data["per_problem"] = [{"problem_id": f"p{i}", "n": n, "c": int(c)} for i, c in enumerate(counts)]
        path.write_text(json.dumps(data))

    for seed in SEEDS:  # RepExp solves two more samples of every problem than the GRPO seed beside it
        grpo = rng.binomial(n, 0.6 * rate)
        write_counts(f"verl_grpo_s{seed}", grpo)
        write_counts(f"verl_repexp_k32_b0.01_s{seed}", np.minimum(n, grpo + 2))
    write_counts("verl_repexp_k32_b0.1_s41", np.zeros(40, dtype=int))  # solves nothing: never reaches GRPO
    assert cli.main(["aggregate", "--eval-dir", str(tmp_path / "eval"), "--out-dir", str(tmp_path / "agg")]) == 0
    # `repexp figures` finds k_efficiency_by_k.csv beside the table
    assert cli.main(["figures", "--table", str(tmp_path / "agg" / "pass_at_k.csv"),
                     "--out-dir", str(tmp_path / "figs")]) == 0
    index = json.loads((tmp_path / "figs" / "index.json").read_text())
    record = by_id(index, "k_efficiency")
    assert record["files"] == ["k_efficiency.png", "k_efficiency.pdf"]
    assert record["bootstrap"] == {"replicates": [aggregate.BOOTSTRAP_REPLICATES],
                                   "resampled": ["problems, GRPO seeds", "problems, RepExp seeds, GRPO seeds"]}
    assert "paired bootstrap" in record["caption"]
    by_k = aggregate.read_k_efficiency(tmp_path / "agg" / "k_efficiency_by_k.csv")
    (panel,) = record["panels"]
    lines = {line["beta"]: line for line in panel["series"]}
    good, bad = lines[0.01], lines[0.1]
    rows = by_k[by_k.beta == 0.01].set_index("reference_k")
    assert good["reference_k"] == [2, 4, 8, 16] and good["n_method_seeds"] == 3
    for i, k in enumerate(good["reference_k"]):
        row = rows.loc[k]
        assert good["efficiency"][i] == pytest.approx(row.efficiency)
        assert (good["lo"][i], good["hi"][i]) == (pytest.approx(row.efficiency_lo), pytest.approx(row.efficiency_hi))
        assert good["lo"][i] <= good["efficiency"][i] <= good["hi"][i] and good["drawn_at"][i] == good["efficiency"][i]
    # never reached: drawn on the bottom edge of the axis, with a note, never left out
    assert bad["status"] == ["not reached"] * 4 and bad["efficiency"] == [None] * 4
    assert bad["on_edge"] == [True] * 4 and bad["drawn_at"] == [panel["ylim"][0]] * 4 == [panel["edge"]] * 4
    assert bad["not_reached_fraction"] == [1.0] * 4
    assert any("RepExp (dim=32, β=0.1) at k = 2, 4, 8, 16: does not reach" in n for n in record["notes"])
    assert panel["ylim"][0] < 1.0 < panel["ylim"][1]

    # issue 39: the two points' markers at one k stay apart (the ▽ on the edge too), and every legend entry shows
    # a marker the plot has in that colour (β = 0.1 is all ▽: its legend is a ▽, not a square never drawn)
    table = aggregate.read_table(tmp_path / "agg" / "pass_at_k.csv")
    fig, _ = figures.plot_k_efficiency(by_k, table)
    fig.canvas.draw()
    (ax,) = [a for a in fig.axes if a.get_xlabel()]
    drawn = [(line.get_marker(), line.get_color(), x, y) for line in ax.get_lines() if line.get_marker() not in
             ("None", None, "", "_") and len(line.get_xdata()) == 1  # points, not error-bar caps (_)
             for x, y in zip(line.get_xdata(), line.get_ydata())]
    pixels = {}
    for _, _, x, y in drawn:
        pixels.setdefault(x and round(math.log2(x)), []).append(ax.transData.transform((x, y)))
    for at_k in pixels.values():  # markers are 6 pt wide (≈ 17 px at 200 dpi): centres at least that far apart
        for i, a in enumerate(at_k):
            assert all(np.hypot(*(a - b)) >= 6 * 200 / 72 for b in at_k[i + 1:]), at_k
    legend = [h for sub in fig.subfigs for lg in sub.legends for h in lg.legend_handles if h.get_marker() != "None"]
    assert legend and all((h.get_marker(), h.get_color()) in {(m, c) for m, c, _, _ in drawn} for h in legend)
    plt.close(fig)


def test_bad_inputs_fail_clearly(tmp_path, capsys):
    code = cli.main(["figures", "--table", str(tmp_path / "none.csv"), "--out-dir", str(tmp_path / "f")])
    assert code == 1 and "none.csv: pass@k table not found" in capsys.readouterr().err
    bad = tmp_path / "metrics.jsonl"
    bad.write_text('{"step": 1, "dev/pass_at_1": 0.5}\n{oops\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2: not valid JSON"):
        figures.read_metrics_jsonl(bad)


# --------------------------------------------------------------------------- MLflow


def mlflow_template(tmp_path_factory):
    """An initialised SQLite MLflow store, created once per session and copied per test (creation takes ~10 s)."""
    template = tmp_path_factory.getbasetemp() / "mlflow-template" / "mlflow.db"
    if not template.exists():
        from mlflow import MlflowClient

        template.parent.mkdir(parents=True, exist_ok=True)
        MlflowClient(tracking_uri=f"sqlite:///{template}").search_experiments()
    return template


def test_mlflow_curves_and_figures_run(workspace, tmp_path, tmp_path_factory, monkeypatch, capsys):
    """Training curves read back from a real SQLite store equal the metrics.jsonl ones; the CLI logs
    the figures and the tables as artifacts of a 'figures' run."""
    from mlflow import MlflowClient

    from repexp import tracking
    from repexp.jobs import FiguresJob
    from repexp.metrics import metric_name as mlflow_metric_name

    db = tmp_path / "mlflow" / "mlflow.db"
    db.parent.mkdir()
    shutil.copy(mlflow_template(tmp_path_factory), db)
    uri = f"sqlite:///{db}"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = load_config({**CONFIG, "name": "fig-test", "results_dir": str(tmp_path),
                          "tracking": {"tracking_uri": uri}})
    math_runs = [s for s in sweep_runs(config) if s.task == "math" and s.trains]
    for spec in math_runs:  # as the train node does: '@' → '_at_', step = training step
        with tracking.node_run("train", spec.task, spec.name, config=config) as node:
            lines = (workspace / "train" / spec.path / "metrics.jsonl").read_text().splitlines()
            rows = [[mlflow_metric_name(key), value, record["step"], 0]
                    for record in map(json.loads, lines) for key, value in record.items() if key != "step"]
            node.fill_metric_rows(rows)  # a trainer's curve keeps its digits (what nodes log is rounded)
    target = tracking.MlflowTarget(uri, "fig-test")
    from_mlflow = figures.training_curves_from_mlflow(target, math_runs)
    from_jsonl = figures.training_curves_from_jsonl(workspace / "train", math_runs)
    assert from_mlflow == from_jsonl and len(from_mlflow) == 6

    # inside the figures node, as `repexp run figures` runs its stage (repexp.tracking.run_stage), with a job
    # built by hand (MATH alone: fewer figures; curves from MLflow); the node run is the 'figures' run, the
    # tables are added to it
    math_only = workspace / "math_only"
    aggregate.aggregate(aggregate.find_eval_files(workspace / "eval"), math_only,
                        expected=[s for s in sweep_runs(config) if s.task == "math"], drop_unexpected=True)
    out = tmp_path / "figs"
    config_file = tmp_path / "config.yaml"
    config_file.write_text(json.dumps({**CONFIG, "name": "fig-test", "results_dir": str(tmp_path),
                                       "tracking": {"tracking_uri": uri}}))
    job = FiguresJob(table=str(math_only / "pass_at_k.csv"), out_dir=str(out), curves_from="mlflow")
    node = tracking.prepare_node("figures", config=str(config_file))
    code = tracking.run_stage(node, lambda: figures.run_job(job), job.outputs(), "repexp figures", in_run=True)
    assert code == 0, capsys.readouterr().err
    index = json.loads((out / "index.json").read_text())
    assert index["training_curves"] == "MLflow"
    assert by_id(index, "training_math_verl")["missing_runs"] == []
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("fig-test")
    (run,) = client.search_runs([experiment.experiment_id], filter_string="attributes.run_name = 'figures'")
    assert run.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    artifacts |= {a.path for a in client.list_artifacts(run.info.run_id, "table")}
    assert {"pass_at_k.png", "pass_at_k.pdf", "index.json", "training_math_verl.png", "table/pass_at_k.csv",
            "table/k_efficiency.csv", "table/pass_at_k.html"} <= artifacts

    # standalone (`--experiment`, no node): a run named 'figures' under the experiment's parent run
    standalone = figures.log_figures_run(target, [out / "pass_at_k.png", out / "index.json"],
                                         [math_only / "pass_at_k.csv"])
    logged = client.get_run(standalone)
    assert logged.info.run_name == "figures" and logged.info.status == "FINISHED"
    assert logged.data.tags["mlflow.parentRunId"] == run.data.tags["mlflow.parentRunId"]
    assert {a.path for d in ("figures", "table") for a in client.list_artifacts(standalone, d)} == {
        "figures/pass_at_k.png", "figures/index.json", "table/pass_at_k.csv"}


# --------------------------------------------------------------------------- real evaluations


@pytest.mark.slow
def test_figures_from_real_eval_outputs(tmp_path):
    """aggregate + figures on eval.json files written by `repexp eval` (the tiny model, real sampling and
    verifier). Set REPEXP_EVAL_DIR to a pipeline's results/eval to check a real run's outputs instead."""
    eval_dir = Path(os.environ["REPEXP_EVAL_DIR"]) if os.environ.get("REPEXP_EVAL_DIR") else None
    if eval_dir is None:
        eval_dir = tmp_path / "eval"
        produce_real_evals(tmp_path, eval_dir)
    out = tmp_path / "agg"
    assert cli.main(["aggregate", "--eval-dir", str(eval_dir), "--out-dir", str(out)]) == 0
    table = aggregate.read_table(out / "pass_at_k.csv")
    evals = {(p.parent.parent.name, p.parent.name): json.loads(p.read_text())
             for p in aggregate.find_eval_files(eval_dir)}
    for row in table.itertuples():
        assert row.pass_at_k == pytest.approx(evals[(row.task, row.run)]["pass_at_k"][str(row.k)])
    assert cli.main(["figures", "--table", str(out / "pass_at_k.csv"), "--out-dir", str(tmp_path / "figs")]) == 0
    index = json.loads((tmp_path / "figs" / "index.json").read_text())
    for panel in by_id(index, "pass_at_k")["panels"]:
        for series in panel["series"]:
            runs = [evals[(panel["task"], run)] for run in series["runs"]]
            expected = [np.mean([r["pass_at_k"][str(k)] for r in runs]) for k in series["k"]]
            np.testing.assert_allclose(series["mean"], expected)
            assert panel["ylim"][0] <= min(series["mean"]) and panel["ylim"][1] >= max(series["mean"])


def produce_real_evals(tmp_path, eval_dir):
    """Three `repexp eval` runs of the tiny model standing in for base, GRPO and RepExp checkpoints."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from repexp.models import build_tiny_qwen2

    model = build_tiny_qwen2(tmp_path / "tiny", seed=0)
    rows = [{"data_source": "openai/gsm8k",
             "prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer after ####."}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
             "extra_info": {"split": "test", "index": i, "problem_id": f"gsm8k/test/{i}"}}
            for i, (a, b) in enumerate([(1, 1), (2, 3), (4, 4)])]
    data = tmp_path / "data" / "gsm8k" / "test.parquet"
    data.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), data)
    for run, seed in (("base", 42), ("trl_grpo_s42", 42), ("trl_repexp_k8_b0.01_s42", 43)):
        code = cli.main(["eval", "--model", str(model), "--data", str(data), "--out", str(eval_dir / "gsm8k" / run),
                         "--task", "gsm8k", "--seed", str(seed), "--no-progress", "--set", "eval.n_samples=4",
                         "eval.max_new_tokens=6", "eval.batch_size=12", "eval.shard_size=3"])
        assert code == 0


# --------------------------------------------------------------------------- figures that tell the truth (issue 25)


def test_a_repexp_curve_equal_to_grpos_is_drawn_on_top_and_said(tmp_path):
    """RepExp = GRPO at every k (the README run's case): the note says so, RepExp is drawn dashed with
    hollow markers above GRPO, in the pass@k and in the test-time figure."""
    evals = tmp_path / "eval"
    for seed in SEEDS:
        for run in (f"verl_grpo_s{seed}", f"verl_repexp_k32_b0.01_s{seed}"):
            write_eval(evals, "math", run, curve(0.2 + 0.01 * (seed - 41)))
    write_eval(evals, "math", "base", curve(MATH_BASE))
    aggregate.aggregate(aggregate.find_eval_files(evals), tmp_path / "agg")
    same = aggregate.read_table(tmp_path / "agg" / "pass_at_k.csv")
    specs = [s for s in sweep_runs(load_config(CONFIG)) if s.task == "math"]
    fig, record = figures.plot_pass_at_k(same, expected=specs)
    assert any("RepExp = GRPO at every k" in note for note in record["notes"]), record["notes"]
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert lines["RepExp"].get_linestyle() == "--" and lines["RepExp"].get_markerfacecolor() == "none"
    assert lines["RepExp"].get_zorder() > lines["GRPO"].get_zorder() > lines["Base model"].get_zorder()
    fig, _ = figures.plot_pass_at_k(aggregate.read_table(tmp_path / "agg" / "pass_at_k.csv").assign(
        pass_at_k=lambda t: t["pass_at_k"] + (t["run"].str.contains("repexp") * 0.01)), expected=specs)
    assert {line.get_label(): line for line in fig.axes[0].get_lines()}["RepExp"].get_linestyle() == "-"


def test_training_figure_scales_marks_switched_off_bonus_and_shows_both_reward_styles(tmp_path):
    specs = [s for s in sweep_runs(load_config(CONFIG)) if s.task == "math" and s.trains]
    curves = {}
    for spec in specs:
        steps = range(1, 6)
        run = {"reward/verifier/mean": {s: 0.3 for s in steps}, "reward/shaped/mean": {s: 0.3 for s in steps}}
        if spec.method == "repexp":  # 1.5e-4 of noise around 0.875, switched off in some groups at step 3
            run["repexp/bonus_raw/mean"] = {s: 0.87475 + 0.00003 * (s % 5) for s in steps}
            run["repexp/bonus_scaled/mean"] = {s: 0.0087 if s != 3 else 0.004 for s in steps}
            run["repexp/bonus_turned_off_frac"] = {s: 0.5 if s == 3 else 0.0 for s in steps}
        curves[spec.path] = run
    fig, record = figures.plot_training(curves, "math", "verl", specs=specs, source="metrics.jsonl")
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    low, high = axes["bonus (raw), mean"].get_ylim()
    assert high - low >= 0.05 * 0.875 * 0.99  # noise of 1.5e-4 is drawn nearly flat, not axis-filling
    assert any("× along the bottom marks steps where the bonus was switched off" in note for note in record["notes"])
    marks = [line for line in axes["bonus (× β), mean"].get_lines() if line.get_marker() == "x"]
    assert marks and list(marks[0].get_xdata()) == [3]
    # in a strip inside the axes below every data point (issue 39): it hides no point, the axis line cuts none
    panel = axes["bonus (× β), mean"]
    low, high = panel.get_ylim()
    points = [(y - low) / (high - low) for line in panel.get_lines() if line.get_marker() != "x"
              for y in line.get_ydata()]
    (mark_y,) = set(marks[0].get_ydata())
    assert marks[0].get_transform() == panel.get_xaxis_transform()  # y in axes fractions
    assert 0.03 < mark_y < min(points) - 0.04, (mark_y, min(points))
    reward = axes["reward: shaped (—) vs verifier (- -)"].get_lines()
    dashed = [line for line in reward if line.get_linestyle() == "--"]
    assert dashed and all(d.get_zorder() > s.get_zorder() for d in dashed for s in reward if s.get_linestyle() == "-")
    legend = [text.get_text() for sub in fig.subfigs for legend in sub.legends for text in legend.get_texts()]
    assert "shaped reward (—)" in legend and "verifier reward (- -)" in legend
    # GRPO's one line there (its verifier reward) equals RepExp's: lifted above it, and said (the README run's case)
    grpo_color = {line.get_color() for line in reward if line.get_linestyle() == "--"}
    assert len(grpo_color) == 2, grpo_color
    top = max(dashed, key=lambda line: line.get_zorder())
    assert all(top.get_zorder() > line.get_zorder() for line in reward if line is not top)
    assert top.get_color() not in {line.get_color() for line in reward if line.get_linestyle() == "-"}  # GRPO's
    assert any("GRPO's verifier reward = RepExp's at every step" in note for note in record["notes"]), record["notes"]

    for run in curves.values():  # the same entropy for both: RepExp drawn dashed on top, and said
        run["actor/entropy"] = {s: 1.0 - 0.1 * s for s in range(1, 6)}
    fig, record = figures.plot_dynamics(curves, "math", "verl", specs=specs, source="metrics.jsonl")
    assert any("policy entropy: RepExp = GRPO at every step" in note for note in record["notes"]), record["notes"]
    # the lines, not the bands' dotted edges
    entropy = {line.get_color(): line for line in fig.axes[0].get_lines() if line.get_linestyle() != ":"}
    assert sorted(line.get_linestyle() for line in entropy.values()) == ["-", "--"]


def test_legends_fit_the_figure_with_two_repexp_points(table):
    """The pilot's shape (two β points, GRPO, base) on one task: every legend row lies inside the figure; the
    test-time figure's six entries once ran past both edges, cutting the RepExp handles off (2026-12-04)."""
    math_rows = table[table.task == "math"].copy()
    second = math_rows[math_rows.method == "repexp"].copy()
    second["beta"] = 0.1
    second["run"] = second["run"].str.replace("_b0.01_", "_b0.1_")
    pilot = pd.concat([math_rows, second], ignore_index=True)
    pilot["testtime_pass_at_k"] = pilot["pass_at_k"]
    for fig, _ in (figures.plot_testtime(pilot, tasks=["math"]), figures.plot_pass_at_k(pilot, tasks=["math"])):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legends = [legend for sub in fig.subfigs for legend in sub.legends]
        assert legends
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert 0 <= box.x0 and box.x1 <= fig.bbox.width, (box, fig.bbox.width)
        plt.close(fig)


def test_a_bonus_switched_off_at_most_steps_is_said_not_marked(tmp_path):
    """The pilot's case: groups with no correct rollout at nearly every step. A × on every step hid the curve;
    the note says how often instead, and a bonus off at a few steps is still marked."""
    specs = [s for s in sweep_runs(load_config(CONFIG)) if s.task == "math" and s.method == "repexp"]
    steps = range(1, 11)
    curves = {spec.path: {"repexp/bonus_scaled/mean": {s: 0.01 for s in steps},
                          "repexp/bonus_turned_off_frac": {s: 0.5 for s in steps}} for spec in specs}
    fig, record = figures.plot_training(curves, "math", "verl", specs=specs, source="metrics.jsonl")
    panel = next(ax for ax in fig.axes if ax.get_title() == "bonus (× β), mean")
    assert not [line for line in panel.get_lines() if line.get_marker() == "x"]
    notes = record["notes"]
    assert any("switched off in some groups at most steps (RepExp 10 of 10" in note for note in notes), notes
    plt.close(fig)
    for run in curves.values():  # off at 2 of 10 steps: marked
        run["repexp/bonus_turned_off_frac"] = {s: 0.5 if s in (3, 7) else 0.0 for s in steps}
    fig, record = figures.plot_training(curves, "math", "verl", specs=specs, source="metrics.jsonl")
    panel = next(ax for ax in fig.axes if ax.get_title() == "bonus (× β), mean")
    assert [list(line.get_xdata()) for line in panel.get_lines() if line.get_marker() == "x"] == [[3, 7]]
    assert not any("at most steps" in note for note in record["notes"])
    plt.close(fig)


def test_a_k_efficiency_interval_of_one_value_is_said(tmp_path):
    """Issue 39: the README run's RepExp equals GRPO in every bootstrap replicate (identical samples): its
    intervals are [1×, 1×], bars of no length; the figure says so instead of promising bars it cannot draw."""
    from repexp import passk

    n, ks, counts = 16, passk.power_of_two_ks(16), np.arange(30) % 5
    mean, _ = passk.summarize(passk.pass_at_k(np.full(30, n), counts, ks))
    for run in ("verl_grpo_s42", "verl_repexp_k32_b0.01_s42"):  # the same samples
        write_eval(tmp_path / "eval", "math", run, dict(zip(ks, mean.tolist())), n=n)
        path = tmp_path / "eval" / "math" / run / "eval.json"
        data = json.loads(path.read_text())
        data["per_problem"] = [{"problem_id": f"p{i}", "n": n, "c": int(c)} for i, c in enumerate(counts)]
        path.write_text(json.dumps(data))
    assert cli.main(["aggregate", "--eval-dir", str(tmp_path / "eval"), "--out-dir", str(tmp_path / "agg")]) == 0
    by_k = aggregate.read_k_efficiency(tmp_path / "agg" / "k_efficiency_by_k.csv")
    assert (by_k.efficiency_lo == by_k.efficiency_hi).all()
    _, record = figures.plot_k_efficiency(by_k, aggregate.read_table(tmp_path / "agg" / "pass_at_k.csv"))
    assert any("the 95% bootstrap interval is a single value" in note and "no bar to draw" in note
               for note in record["notes"]), record["notes"]


def test_a_grpo_dev_curve_hidden_under_repexps_for_some_steps_is_said(tmp_path):
    """Issue 39: GRPO's line is drawn under RepExp's; where the two are equal over adjacent steps (the README
    run's dev pass@1 at steps 0 and 2), that stretch of GRPO is hidden, and the figure says so."""
    specs = [s for s in sweep_runs(load_config(CONFIG)) if s.task == "math" and s.trains]
    curves = {spec.path: {"dev/pass_at_1": {0: 0.1, 10: 0.25, 20: 0.44 if spec.method == "repexp" else 0.41}}
              for spec in specs}
    _, record = figures.plot_training(curves, "math", "verl", specs=specs, source="metrics.jsonl")
    assert "dev pass@1: GRPO = RepExp at steps 0, 10 (to 0.2% of the values): GRPO's line is under it there" in (
        record["notes"]), record["notes"]
    curves = {path: {"dev/pass_at_1": {0: 0.1, 10: 0.25 + 0.05 * ("repexp" in path), 20: 0.4}} for path in curves}
    _, record = figures.plot_training(curves, "math", "verl", specs=specs, source="metrics.jsonl")
    assert not any("under it" in note for note in record["notes"])  # equal at single steps only: nothing hidden


def test_training_panels_keep_collapsed_and_small_curves_readable(tmp_path):
    """Issue 39 (the pilot's figures): entropy collapsing from 2 to 0.1 and β = 0.1's scaled bonus (10× β = 0.01's)
    are drawn on log axes, so the comparison after the collapse and β = 0.01's curve fill the panel instead of
    its bottom edge; every SEM band has its edges drawn in its series' colour (overlapping fills blend); the
    reward panel, two lines per series, draws no bands and says so."""
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_hex

    two_betas = {**CONFIG, "sweep": {**CONFIG["sweep"], "betas": [0.01, 0.1]}}
    specs = [s for s in sweep_runs(load_config(two_betas)) if s.task == "math" and s.trains]
    steps = range(1, 41)
    curves = {}
    for spec in specs:
        beta, wobble = (spec.param_dict.get("beta") if spec.method == "repexp" else None), 0.01 * (spec.seed - 41)
        floor = 0.1 if spec.method == "grpo" else 0.3
        run = {"actor/entropy": {t: floor + 1.9 * math.exp(-t / 4) + wobble for t in steps},
               "reward/verifier/mean": {t: 0.3 + wobble for t in steps}, "reward/shaped/mean": {t: 0.31 for t in steps}}
        if beta:
            run["repexp/bonus_scaled/mean"] = {t: beta * (0.2 + wobble) for t in steps}
        curves[spec.path] = run
    fig, record = figures.plot_dynamics(curves, "math", "verl", specs=specs, source="metrics.jsonl")
    entropy = fig.axes[0]
    assert entropy.get_yscale() == "log"
    low, high = (math.log10(v) for v in entropy.get_ylim())
    late = [math.log10(y) for line in entropy.get_lines() if line.get_linestyle() == "-"
            for x, y in zip(line.get_xdata(), line.get_ydata()) if x > 15]
    assert (max(late) - min(late)) / (high - low) > 0.3  # not squeezed into the bottom fifth
    for line in [ln for ln in entropy.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) > 1]:
        edges = [ln for ln in entropy.get_lines() if ln.get_linestyle() == ":"
                 and to_hex(ln.get_color()) == to_hex(line.get_color())]
        assert len(edges) == 2, line.get_color()  # the band's two edges, in the series' colour
    plt.close(fig)
    fig, record = figures.plot_training(curves, "math", "verl", specs=specs, source="metrics.jsonl")
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    scaled = axes["bonus (× β), mean"]
    assert scaled.get_yscale() == "log"  # β = 0.01's curve is not flattened by β = 0.1's ten times larger one
    reward = axes["reward: shaped (—) vs verifier (- -)"]
    assert not [c for c in reward.collections if isinstance(c, PolyCollection)]  # no bands among six lines
    assert any("reward: shaped (—) vs verifier (- -): seed means without ±1 SEM bands" in n for n in record["notes"])
    plt.close(fig)
