"""Everything downstream of evaluation follows the method table (`repexp.methods.METHODS`): a results directory
with runs of every method (GRPO, RepExp, pass@k, outcome, KL-Cov/Clip-Cov) and the base model gives every method
its rows in the tidy table, a k-efficiency row per method point vs GRPO, and its own colour in every figure;
the MLflow view's columns and `repexp plan`'s GPU-hours follow the sweep's methods."""

from __future__ import annotations

import json
import math

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repexp import aggregate, figures, layout  # noqa: E402
from repexp import config as C  # noqa: E402
from repexp.aggregate import tables  # noqa: E402
from repexp.methods import BASE, METHODS, label  # noqa: E402

KS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
SEEDS = (41, 42)
# every method of the table; RepExp and Clip-/KL-Cov with two points each (shades of one colour)
SWEEP = {
    "name": "methods-test",
    "sweep": {"tasks": ["math"], "backends": ["verl"], "seeds": list(SEEDS), "methods": {
        "repexp": {"sparse_dim": [32], "beta": [0.01, 0.1]}, "grpo": {}, "passk": {"passk_k": [4]},
        "outcome": {"outcome_mode": ["historical"], "outcome_c": [1.0]},
        "cov": {"loss_mode": ["kl_cov", "clip_cov"], "cov_ratio": [0.002]}}},
}
OFFSET = {"grpo": 0.30, "repexp": 0.36, "passk": 0.34, "outcome": 0.33, "cov": 0.25, "base": 0.2}


def curve(a, b=0.05):
    return {k: min(1.0, a + b * math.log2(k)) for k in KS}


def write_eval(root, spec, values):
    path = root / spec.task / spec.name / "eval.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "pass_at_k": {str(k): v for k, v in values.items()}, "pass_at_k_sem": {str(k): 0.01 for k in values},
        "mean_at_n": values[1], "num_problems": 30, "n_samples": 256, "per_problem": [], "model_path": "m",
        "checkpoint_step": None if spec.method == BASE else 10, "engine": "hf", "sampling": {}, "seed": 0,
        "data_hash": "h", "task": spec.task, "split": "test"}))
    return path


def write_testtime(root, spec, values):
    """A `repexp testtime` result whose RepExp-order pass@k lies 0.02 above the random order's."""
    path = root / spec.task / spec.name / "testtime.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "k": KS, "pass_at_k_repexp": [min(1.0, values[k] + 0.02) for k in KS],
        "efficiency": {"reference_k": [16, 256], "ratio": [1.5, 1.0]},
        "samples_to_correct": {"repexp": 3.0, "random": 4.0, "ratio": 1.33, "ratio_ci95": [1.1, 1.6],
                               "num_solved": 20}, "data_hash": "h"}))
    return path


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """eval.json and testtime.json of every run of SWEEP (seeds apart by 0.01; a method point by 0.01 per index)."""
    root = tmp_path_factory.mktemp("methods")
    cfg = C.load(SWEEP)
    runs = C.sweep_runs(cfg)
    evals, testtimes = [], []
    points: dict[str, list[str]] = {}
    for spec in runs:
        points.setdefault(spec.method, [])
        if spec.point not in points[spec.method]:
            points[spec.method].append(spec.point)
        a = OFFSET[spec.method] + 0.01 * points[spec.method].index(spec.point) + 0.01 * ((spec.seed or 41) - 41)
        values = curve(a)
        evals.append(write_eval(root / "eval", spec, values))
        testtimes.append(write_testtime(root / "testtime", spec, values))
    result = aggregate.aggregate(evals, root / "aggregate", expected=runs, testtime_paths=testtimes)
    return {"root": root, "cfg": cfg, "runs": runs, "result": result}


def test_every_method_has_its_rows_point_label_and_parameters(results):
    table = results["result"]["table"]
    assert list(dict.fromkeys(table["method"])) == [*METHODS, BASE]  # the table's order, the base model last
    assert results["result"]["missing"] == []
    runs = table.drop_duplicates("run").set_index("run")
    for spec in results["runs"]:
        row = runs.loc[spec.name]
        assert (row.method, row.point) == (spec.method, spec.point)
        for name in tables.PARAM_COLUMNS:  # its own parameters; NA where they are another method's
            if name in spec.param_dict:
                assert row[name] == spec.param_dict[name]
            else:
                assert pd.isna(row[name])
    assert set(tables.param_columns(METHODS)) <= set(table.columns)
    assert runs.loc["verl_passk_k4_s41", "label"] == "pass@k training (k=4)"
    assert runs.loc["verl_clip_cov_r0.002_s42", "label"] == "Clip-Cov (r=0.002)"
    # read back with the same columns and values (text parameters as text, NA as None)
    back = aggregate.read_table(results["root"] / "aggregate" / "pass_at_k.csv")
    assert list(back.columns) == list(table.columns)
    assert back.loc[back.run == "verl_kl_cov_r0.002_s41", "loss_mode"].iloc[0] == "kl_cov"
    assert back.loc[back.run == "base", "loss_mode"].iloc[0] is None
    # the sort: methods in table order, then parameters, then seed
    order = list(runs.index)
    assert order.index("verl_repexp_k32_b0.01_s42") < order.index("verl_repexp_k32_b0.1_s41")
    assert order.index("verl_clip_cov_r0.002_s41") < order.index("verl_kl_cov_r0.002_s41")  # clip_cov < kl_cov


def test_k_efficiency_has_a_row_per_method_point_vs_grpo(results):
    keff = results["result"]["k_efficiency"]
    compared = [s for s in results["runs"] if s.method not in ("grpo", BASE)]
    # in the tidy table's order: methods in table order, then their parameters (clip_cov before kl_cov)
    table = results["result"]["table"]
    assert list(keff["point"]) == list(dict.fromkeys(table.loc[table.method.isin(["repexp", "passk", "outcome",
                                                                                   "cov"]), "point"]))
    assert set(keff["point"]) == {s.point for s in compared}
    assert set(keff["method"]) == set(METHODS) - {"grpo"}
    assert (keff["n_method_seeds"] == 2).all() and (keff["n_grpo_seeds"] == 2).all()
    assert list(keff.columns) == tables.k_efficiency_columns(["repexp", "passk", "outcome", "cov"])
    by_point = keff.set_index("point")
    # pass@k training at GRPO + 0.04 reaches GRPO's pass@256 0.8 log2 steps earlier; KL-Cov below GRPO never does
    assert by_point.loc["passk_k4", "efficiency"] == pytest.approx(2 ** 0.8)
    assert by_point.loc["passk_k4", "method_pass_at_ref"] == pytest.approx(min(1.0, 0.345 + 0.4))
    assert by_point.loc["kl_cov_r0.002", "status"] == tables.STATUS_NOT_REACHED
    assert by_point.loc["outcome_historical_c1", "label"] == "Outcome exploration (historical, c=1)"
    on_disk = aggregate.read_k_efficiency(results["root"] / "aggregate" / "k_efficiency.csv")
    assert list(on_disk["point"]) == list(keff["point"]) and on_disk.loc[3, "outcome_mode"] == "historical"
    md = (results["root"] / "aggregate" / "pass_at_k.md").read_text()
    section = md.split("## k-efficiency (each method vs GRPO)")[1].split("##")[0]
    for point in keff.itertuples():
        assert f"| math | verl | {point.label} | 2/2 |" in section
    # the seed means, the test-time table and the per-run table name every method
    for spec in results["runs"]:
        assert tables.point_label(spec.method, spec.param_dict) in md
    testtime = md.split("## Test-time RepExp")[1].split("##")[0]
    assert "| math | verl_passk_k4_s41 | pass@k training (k=4) |" in testtime


def test_every_figure_shows_every_method_in_its_own_colour(results, tmp_path):
    root = results["root"]
    table = aggregate.read_table(root / "aggregate" / "pass_at_k.csv")
    keff = aggregate.read_k_efficiency(root / "aggregate" / "k_efficiency_by_k.csv")
    index = figures.make_figures(table, tmp_path, expected=results["runs"], k_efficiency=keff)
    by_id = {f["id"]: f for f in index["figures"]}
    every = [*METHODS, BASE]
    for figure_id, methods in (("pass_at_k", every), ("testtime_pass_at_k", every),
                               ("k_efficiency", [m for m in METHODS if m != "grpo"])):
        (panel,) = by_id[figure_id]["panels"]
        series = {(s["method"], s["point"]): s for s in panel["series"]}
        assert list(dict.fromkeys(m for m, _ in series)) == methods, figure_id
        # one colour per method point, each a shade of its method's; one label each
        colours = {key: s["color"] for key, s in series.items()}
        assert len(set(colours.values())) == len(colours), (figure_id, colours)
        assert len({s["label"] for s in series.values()}) == len(series)
        for (method, _), s in series.items():
            points = [p for m, p in series if m == method]
            if len(points) == 1:
                assert s["color"] == (METHODS[method].color if method != BASE else "#7f7f7f")
                assert s["label"] == label(method)
            else:  # RepExp's and Cov's two points: shades, their own markers, the point in the label
                assert s["label"].endswith(")") and " (" in s["label"]
        assert len({s["marker"] for (m, _), s in series.items() if m == "repexp"}) == 2
    assert "pass@k training (k=4)" not in by_id["pass_at_k"]["notes"]
    legend = [s["label"] for s in by_id["pass_at_k"]["panels"][0]["series"]]
    assert legend[:2] == ["RepExp (dim=32, β=0.01)", "RepExp (dim=32, β=0.1)"] and legend[-1] == "Base model"
    assert "Clip-Cov (r=0.002)" in legend and "KL-Cov (r=0.002)" in legend and "GRPO" in legend
    # heatmaps: RepExp (sparse_dim × β, two points) and Cov (loss_mode × cov_ratio, two points); pass@k
    # training (one named parameter) and outcome (one point) get none
    assert layout.heatmap_grids(results["runs"]) == [("math", "verl", "repexp"), ("math", "verl", "cov")]
    cov_map = by_id["heatmap_math_verl_cov"]
    assert (cov_map["rows"], cov_map["columns"], cov_map["row_values"]) == ("loss_mode", "cov_ratio",
                                                                           ["clip_cov", "kl_cov"])
    efficiency = {c["loss_mode"]: c for c in cov_map["panels"][2]["cells"]}
    assert efficiency["kl_cov"]["status"] == tables.STATUS_NOT_REACHED
    assert sorted(index["missing_evaluations"]) == []


def test_the_mlflow_view_and_the_plan_follow_the_sweeps_methods(results):
    from repexp import plan
    from repexp.tracking import ui

    cfg = results["cfg"]
    params = ui.columns(cfg)
    assert params == ("task", "method", "seed", "sparse_dim", "beta", "passk_k", "outcome_mode", "outcome_c",
                      "loss_mode", "cov_ratio")  # the swept ones: the parameters in the run names
    state = ui.view_state("test/pass_at_256", "r1", params)
    assert state["selectedColumns"][1:] == [ui.column("params", name) for name in params]
    jobs = plan.job_costs(cfg, 1.54e9)
    per_method = plan.method_gpu_hours(jobs)
    assert list(per_method) == [*METHODS, BASE]
    assert sum(sum(v.values()) for v in per_method.values()) == pytest.approx(sum(j.hours * j.gpus for j in jobs))
    assert per_method[BASE].get("train", 0.0) == 0.0  # evaluated, never trained
    text = plan.report(cfg, gpus=8, params=1.54e9)
    for method in [*METHODS, BASE]:
        assert f"| {label(method)} | " in text
    assert "| RepExp | 4 |" in text and "| KL-Cov / Clip-Cov | 4 |" in text  # runs per method
