"""`repexp aggregate`: tidy pass@k table, k-efficiency, rendering, errors, MLflow sweep-point metrics."""

from __future__ import annotations

import json
import math
import shutil

import pandas as pd
import pytest

from repexp import aggregate, cli
from repexp.aggregate import crossing_k

KS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def log_linear(a, b=0.05, ks=KS, cap=1.0):
    """pass@k = a + b·log2 k (capped): a curve whose log2-k crossings are known exactly."""
    return {k: min(cap, a + b * math.log2(k)) for k in ks}


def write_eval(root, task, run, curve, *, n=256, sem=0.01, **extra):
    path = root / task / run / "eval.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "pass_at_k": {str(k): v for k, v in curve.items()},
        "pass_at_k_sem": {str(k): sem for k in curve},
        "mean_at_n": curve[min(curve)], "num_problems": 50, "n_samples": n,
        "per_problem": [], "model_path": f"/models/{run}", "checkpoint_step": None if run == "base" else 40,
        "engine": "hf", "sampling": {"n": n, "temperature": 1.0}, "seed": 7, "data_hash": "sha256:abc",
        "task": task, "split": "test", **extra,
    }
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def sweep(tmp_path):
    """MATH: GRPO seeds 41/42 at 0.5 + 0.05·log2 k (pass@256 = 0.9); RepExp k32 β0.01 seeds at
    0.55/0.60 + … (seed mean crosses 0.9 at log2 k = 6.5); RepExp k32 β0.1 never reaches 0.9; base."""
    root = tmp_path / "eval"
    for seed in (41, 42):
        write_eval(root, "math", f"verl_grpo_s{seed}", log_linear(0.5))
    write_eval(root, "math", "verl_repexp_k32_b0.01_s41", log_linear(0.55))
    write_eval(root, "math", "verl_repexp_k32_b0.01_s42", log_linear(0.60))
    write_eval(root, "math", "verl_repexp_k32_b0.1_s41", log_linear(0.45))
    write_eval(root, "math", "verl_repexp_k32_b0.1_s42", log_linear(0.45))
    write_eval(root, "math", "base", log_linear(0.4))
    return root


def test_tidy_table_has_config_columns_and_values(sweep, tmp_path):
    result = aggregate.aggregate(aggregate.find_eval_files(sweep), tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "pass_at_k.csv")
    assert list(table.columns) == list(aggregate.TIDY_COLUMNS)
    assert len(table) == 7 * len(KS)
    row = table[(table.run == "verl_repexp_k32_b0.01_s42") & (table.k == 16)].iloc[0]
    point = (row.task, row.method, row.backend, row.sparse_dim, row.beta, row.seed)
    assert point == ("math", "repexp", "verl", 32, 0.01, 42)
    assert row.pass_at_k == pytest.approx(0.60 + 0.05 * 4)
    assert (row["sem"], row.n_samples, row.num_problems, row.checkpoint_step, row.split) == (0.01, 256, 50, 40, "test")
    base = table[table.run == "base"].iloc[0]
    assert base.method == "base" and pd.isna(base.seed) and pd.isna(base.sparse_dim) and pd.isna(base.checkpoint_step)
    # the reader restores the dtypes the writer had
    back = aggregate.read_table(tmp_path / "out" / "pass_at_k.csv")
    assert back["seed"].dtype == "Int64" and back.loc[back.run == "base", "backend"].iloc[0] is None
    assert result["missing"] == [] and not list((tmp_path / "out").glob(".*"))  # no temp debris


def test_k_efficiency_interpolates_on_log2_k_over_seed_means(sweep, tmp_path):
    keff = aggregate.aggregate(aggregate.find_eval_files(sweep), tmp_path / "out")["k_efficiency"]
    reached = keff[keff.beta == 0.01].iloc[0]
    assert reached.reference_k == 256 and reached.grpo_pass_at_ref == pytest.approx(0.9)
    assert reached.k_star == pytest.approx(2 ** 6.5) and reached.k_star_evaluated == 128
    assert reached.k_grpo == pytest.approx(256) and reached.efficiency == pytest.approx(256 / 2 ** 6.5)
    assert (reached.n_repexp_seeds, reached.n_grpo_seeds, reached.status) == (2, 2, aggregate.STATUS_REACHED)
    missed = keff[keff.beta == 0.1].iloc[0]
    assert missed.status == aggregate.STATUS_NOT_REACHED
    assert math.isnan(missed.k_star) and math.isnan(missed.efficiency) and pd.isna(missed.k_star_evaluated)
    on_disk = pd.read_csv(tmp_path / "out" / "k_efficiency.csv")
    assert list(on_disk.columns) == list(aggregate.K_EFFICIENCY_COLUMNS)
    assert on_disk.loc[on_disk.beta == 0.1, "k_star"].isna().all()


def test_k_efficiency_edge_cases(tmp_path):
    root = tmp_path / "eval"
    ks100 = [1, 2, 4, 8, 16, 32, 64, 100]  # n = 100 samples: the reference is the largest k
    write_eval(root, "gsm8k", "trl_grpo_s1", log_linear(0.5, ks=ks100), n=100)
    write_eval(root, "gsm8k", "trl_repexp_k8_b0.5_s1", log_linear(0.55, ks=ks100), n=100)
    # already at the target at k = 1
    write_eval(root, "gsm8k", "trl_repexp_k8_b1_s1", {k: 0.99 for k in ks100}, n=100)
    # GRPO saturates at k = 4: efficiency compares where each curve first reaches the plateau
    write_eval(root, "math", "trl_grpo_s1", log_linear(0.8, b=0.1))
    write_eval(root, "math", "trl_repexp_k8_b0.5_s1", log_linear(0.9, b=0.1))
    # a backend without GRPO
    write_eval(root, "math", "verl_repexp_k8_b0.5_s1", log_linear(0.9))
    keff = aggregate.aggregate(aggregate.find_eval_files(root), tmp_path / "out")["k_efficiency"]
    by = {(r.task, r.backend, r.beta): r for r in keff.itertuples()}
    r = by[("gsm8k", "trl", 0.5)]
    target = 0.5 + 0.05 * math.log2(100)
    assert r.reference_k == 100 and r.grpo_pass_at_ref == pytest.approx(target)
    # RepExp = GRPO + 0.05 → reaches the target one log2 step earlier, between 32 and 64
    assert r.k_star == pytest.approx(2 ** (math.log2(100) - 1)) and r.k_star_evaluated == 64
    first = by[("gsm8k", "trl", 1.0)]
    assert first.status == aggregate.STATUS_REACHED_FIRST
    assert first.k_star == 1 and first.efficiency == pytest.approx(100)
    sat = by[("math", "trl", 0.5)]
    assert sat.k_grpo == pytest.approx(4) and sat.k_star == pytest.approx(2) and sat.efficiency == pytest.approx(2)
    assert "saturates" in sat.note
    assert by[("math", "verl", 0.5)].status == aggregate.STATUS_NO_GRPO


def test_crossing_k():
    assert crossing_k({1: 0.1, 2: 0.3, 4: 0.5}, 0.4) == (pytest.approx(2 ** 1.5), 4)
    assert crossing_k({1: 0.1, 2: 0.3}, 0.31) is None
    assert crossing_k({1: 0.5, 2: 0.6}, 0.2) == (1.0, 1)
    assert crossing_k({1: 0.2, 2: 0.2 + 1e-15, 4: 0.7}, 0.2 + 1e-15) == (1.0, 1)  # float noise counts as reached


def test_cli_inputs_config_and_renderings(sweep, tmp_path, capsys):
    config = tmp_path / "cfg.yaml"
    config.write_text("sweep: {tasks: [math], backends: [verl], sparse_dims: [32], betas: [0.01, 0.1], "
                      "seeds: [41, 42, 43]}\n")
    paths = [str(p) for p in aggregate.find_eval_files(sweep)]
    out = tmp_path / "out"
    assert cli.main(["aggregate", "--inputs", *paths, "--out-dir", str(out), "--config", str(config)]) == 0
    err = capsys.readouterr().err
    for missing in ("math/verl_repexp_k32_b0.01_s43", "math/verl_repexp_k32_b0.1_s43", "math/verl_grpo_s43"):
        assert f"missing run (no eval.json): {missing}" in err
    md = (out / "pass_at_k.md").read_text()
    assert "math/verl_grpo_s43" in md and "not reached" in md and "k-efficiency" in md
    assert "| math | GRPO | verl | – | – | 41, 42 | 2 | 0.500 ± 0.000 |" in md  # seed means ± SEM over seeds
    html = (out / "pass_at_k.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "verl_repexp_k32_b0.1_s42" in html
    # --eval-dir with a config ignores runs outside it
    write_eval(sweep, "math", "trl_grpo_s41", log_linear(0.5))
    assert cli.main(["aggregate", "--eval-dir", str(sweep), "--out-dir", str(tmp_path / "o2"),
                     "--config", str(config)]) == 0
    assert "ignored runs not in the config: math/trl_grpo_s41" in capsys.readouterr().err
    assert "trl_grpo_s41" not in set(pd.read_csv(tmp_path / "o2" / "pass_at_k.csv").run)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("pass_at_k"), "missing key 'pass_at_k'"),
    (lambda d: d["pass_at_k"].update({"x": 0.5}), "non-integer k 'x'"),
    (lambda d: d["pass_at_k"].update({"1": 1.5}), "must lie in [0, 1]"),
    (lambda d: d["pass_at_k"].update({"512": 0.9}), "k = 512 > n_samples = 256"),
    (lambda d: d.update(task="gsm8k"), "differs from the directory 'math'"),
    (lambda d: d.update(num_problems=0), "num_problems must be a positive integer"),
])
def test_bad_eval_json_is_named(tmp_path, capsys, mutate, message):
    path = write_eval(tmp_path / "eval", "math", "base", log_linear(0.4))
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as err:
        aggregate.load_eval(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert cli.main(["aggregate", "--inputs", str(path), "--out-dir", str(tmp_path / "out")]) == 1
    assert message in capsys.readouterr().err and not (tmp_path / "out" / "pass_at_k.csv").exists()


def test_bad_layouts_are_refused(tmp_path):
    root = tmp_path / "eval"
    bad_name = write_eval(root, "math", "verl_repexp_k32_b0.010_s1", log_linear(0.5))  # not canonical
    with pytest.raises(ValueError, match="valid run name"):
        aggregate.load_eval(bad_name)
    shutil.rmtree(bad_name.parent)
    a = write_eval(root, "math", "base", log_linear(0.5))
    copy = tmp_path / "elsewhere" / "math" / "base" / "eval.json"
    copy.parent.mkdir(parents=True)
    shutil.copy(a, copy)
    with pytest.raises(ValueError, match="duplicate evaluation of math/base"):
        aggregate.load_evals([a, copy])
    b = write_eval(root, "math", "trl_grpo_s1", log_linear(0.5), data_hash="sha256:other")
    with pytest.raises(ValueError, match="data_hash .* differs .* not comparable"):
        aggregate.load_evals([a, b])
    with pytest.raises(FileNotFoundError, match="nowhere"):
        aggregate.find_eval_files(tmp_path / "nowhere")


# --------------------------------------------------------------------------- MLflow


def mlflow_template(tmp_path_factory):
    """An initialised SQLite MLflow store, created once per session and copied per test (creation takes ~10 s)."""
    template = tmp_path_factory.getbasetemp() / "mlflow-template" / "mlflow.db"
    if not template.exists():
        from mlflow import MlflowClient

        template.parent.mkdir(parents=True, exist_ok=True)
        MlflowClient(tracking_uri=f"sqlite:///{template}").search_experiments()
    return template


def test_sweep_points_carry_test_pass_at_k_in_mlflow(sweep, tmp_path, tmp_path_factory, monkeypatch):
    from mlflow import MlflowClient

    from repexp import tracking

    results = tmp_path / "results"
    (results / "mlflow").mkdir(parents=True)
    shutil.copy(mlflow_template(tmp_path_factory), results / "mlflow" / "mlflow.db")
    uri = f"sqlite:///{results / 'mlflow' / 'mlflow.db'}"
    config = tmp_path / "cfg.yaml"
    config.write_text(f"name: agg-test\nresults_dir: {results}\ntracking: {{tracking_uri: '{uri}'}}\n"
                      "sweep: {tasks: [math], backends: [verl], sparse_dims: [32], betas: [0.01, 0.1], "
                      "seeds: [41, 42]}\n")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # the eval node of one sweep point already made its parent run, as in the pipeline
    with tracking.node_run("eval", "math", "verl_grpo_s41", config=str(config)) as node:
        assert node.online
    existing_parent = node.record.parent_run_id
    paths = [str(p) for p in aggregate.find_eval_files(sweep)]
    # as the workflow rule calls it: inside the node run, naming the experiment but not the store
    code = cli.main(["mlflow", "node", "--config", str(config), "--rule", "aggregate", "--",
                     "repexp", "aggregate", "--inputs", *paths, "--out-dir", str(tmp_path / "out"),
                     "--config", str(config), "--experiment", "agg-test"])
    assert code == 0
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("agg-test")
    parents = client.search_runs([experiment.experiment_id],
                                 filter_string=f"tags.`{tracking.PARENT_KEY_TAG}` LIKE 'point:%'")
    by_point = {r.data.tags[tracking.PARENT_KEY_TAG]: r for r in parents}
    assert len(parents) == len(by_point) == 7  # one parent per sweep point, none duplicated
    assert by_point["point:math/verl_grpo_s41"].info.run_id == existing_parent
    metrics = by_point["point:math/verl_repexp_k32_b0.01_s42"].data.metrics
    assert metrics["test/pass_at_1"] == pytest.approx(0.60)
    assert metrics["test/pass_at_16"] == pytest.approx(0.80)
    assert metrics["test/pass_at_256"] == pytest.approx(1.0)
    assert by_point["point:math/base"].data.metrics["test/pass_at_256"] == pytest.approx(0.8)
    assert by_point["point:math/verl_repexp_k32_b0.1_s41"].data.params["sparse_dim"] == "32"


def test_tracking_off_disables_mlflow_logging(monkeypatch):
    monkeypatch.setenv("REPEXP_TRACKING", "off")
    assert aggregate.mlflow_target("sqlite:///x.db", "exp") is None
    monkeypatch.setenv("REPEXP_TRACKING", "on")
    assert aggregate.mlflow_target("sqlite:///x.db", "exp") == aggregate.MlflowTarget("sqlite:///x.db", "exp")
    assert aggregate.mlflow_target(None, None) is None  # no flags, no enclosing node run: nothing to log
