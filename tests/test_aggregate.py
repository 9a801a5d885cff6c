"""`repexp aggregate`: tidy pass@k table, k-efficiency, rendering, errors, MLflow sweep-point metrics."""

from __future__ import annotations

import json
import math
import shutil

import pandas as pd
import pytest

from repexp import aggregate, cli
from repexp.aggregate import crossing_k, tables

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
    # the fixed columns with the parameters of the methods present (RepExp's) before the seed
    assert list(table.columns) == tables.tidy_columns(["repexp", "grpo"])
    assert list(table.columns)[:9] == ["task", "run", "method", "point", "label", "backend", "sparse_dim", "beta",
                                       "seed"]
    assert len(table) == 7 * len(KS)
    row = table[(table.run == "verl_repexp_k32_b0.01_s42") & (table.k == 16)].iloc[0]
    point = (row.task, row.method, row.point, row.label, row.backend, row.sparse_dim, row.beta, row.seed)
    assert point == ("math", "repexp", "repexp_k32_b0.01", "RepExp (dim=32, β=0.01)", "verl", 32, 0.01, 42)
    grpo = table[table.run == "verl_grpo_s41"].iloc[0]
    assert (grpo.point, grpo.label) == ("grpo", "GRPO") and pd.isna(grpo.sparse_dim) and pd.isna(grpo.beta)
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
    assert (reached.n_method_seeds, reached.n_grpo_seeds, reached.status) == (2, 2, tables.STATUS_REACHED)
    assert (reached.method, reached.point, reached.label) == ("repexp", "repexp_k32_b0.01", "RepExp (dim=32, β=0.01)")
    missed = keff[keff.beta == 0.1].iloc[0]
    assert missed.status == tables.STATUS_NOT_REACHED
    assert math.isnan(missed.k_star) and math.isnan(missed.efficiency) and pd.isna(missed.k_star_evaluated)
    on_disk = pd.read_csv(tmp_path / "out" / "k_efficiency.csv")
    assert list(on_disk.columns) == tables.k_efficiency_columns(["repexp"])
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
    assert first.status == tables.STATUS_REACHED_FIRST
    assert first.k_star == 1 and first.efficiency == pytest.approx(100)
    sat = by[("math", "trl", 0.5)]
    assert sat.k_grpo == pytest.approx(4) and sat.k_star == pytest.approx(2) and sat.efficiency == pytest.approx(2)
    assert "saturates" in sat.note
    assert by[("math", "verl", 0.5)].status == tables.STATUS_NO_GRPO


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
    assert "| math | GRPO | verl | 41, 42 | 2 | 0.500 ± 0.000 |" in md  # seed means ± SEM over seeds
    assert "| math | RepExp (dim=32, β=0.1) | verl | 41, 42 | 2 |" in md  # a method point's label names its params
    assert "## k-efficiency (each method vs GRPO)" in md
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
                      "seeds: [41, 42]}\ntesttime: {enabled: false}\n")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # the eval node of one sweep point already made its parent run, as in the pipeline
    with tracking.node_run("eval", "math", "verl_grpo_s41", config=str(config)) as node:
        assert node.online
    existing_parent = node.record.parent_run_id
    shutil.copytree(sweep, results / "eval")  # where the aggregate job reads the sweep's eval.json files
    # as the workflow rule calls it: inside the node run, naming the experiment but not the store
    code = cli.main(["run", "aggregate", "--config", str(config)])
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
    from repexp import tracking

    monkeypatch.setenv("REPEXP_TRACKING", "off")
    assert tracking.mlflow_target("sqlite:///x.db", "exp") is None
    monkeypatch.setenv("REPEXP_TRACKING", "on")
    assert tracking.mlflow_target("sqlite:///x.db", "exp") == tracking.MlflowTarget("sqlite:///x.db", "exp")
    assert tracking.mlflow_target(None, None) is None  # no flags, no enclosing node run: nothing to log


# --------------------------------------------------------------------------- bootstrap of the k-efficiency


def write_counts(root, task, run, counts, n):
    """An eval.json whose pass@k and per_problem come from per-problem correct counts (n samples each)."""
    import numpy as np

    from repexp import passk

    ks = passk.power_of_two_ks(n)
    mean, sem = passk.summarize(passk.pass_at_k(np.full(len(counts), n), counts, ks))
    return write_eval(root, task, run, dict(zip(ks, mean.tolist())), n=n,
                      per_problem=[{"problem_id": f"p{i}", "n": n, "c": int(c)} for i, c in enumerate(counts)],
                      num_problems=len(counts))


def random_counts(rng, num_seeds, num_problems, n, shift, difficulty):
    """[seeds, problems] correct counts: each problem's success rate is `difficulty` · shift (capped)."""
    import numpy as np

    rate = np.clip(difficulty[:num_problems] * shift, 0, 1)
    return rng.binomial(n, np.broadcast_to(rate, (num_seeds, num_problems)))


def test_crossing_k_batch_equals_crossing_k():
    import numpy as np

    rng = np.random.default_rng(3)
    ks = [1, 2, 4, 8, 16, 64]
    curves = np.sort(rng.random((300, len(ks))), axis=1)
    curves[::7, 2] = curves[::7, 1]  # flat pieces
    targets = rng.random(300)
    k_star, k_eval = tables.crossing_k_batch(ks, curves, targets)
    for row, target, got, got_eval in zip(curves, targets, k_star, k_eval):
        want = crossing_k(dict(zip(ks, row)), target)
        if want is None:
            assert math.isnan(got) and got_eval == 0
        else:
            assert got == pytest.approx(want[0], rel=1e-12) and got_eval == want[1]


def test_bootstrap_known_value_when_every_problem_is_alike():
    """GRPO solves 1 of 8 samples of every problem (pass@k = k/8), RepExp 2 of 8 (pass@k = 1 − (8−k)(7−k)/56):
    at reference k = 4 the target is 1/2, RepExp crosses it 1/9 of the way from k = 2 to 4 in log2 k, so the
    efficiency is 4 / 2^(1 + 1/9) = 2^(8/9); resampling alike problems changes nothing: the interval is a point."""
    import numpy as np

    n = np.full((1, 20), 8)
    result = aggregate.bootstrap_k_efficiency(n, np.full((1, 20), 2), n, np.full((1, 20), 1), [1, 2, 4, 8],
                                              reference_ks=[2, 4, 8], diff_ks=[1, 8], replicates=200)
    at4 = result["efficiency"][4]
    assert at4["estimate"] == pytest.approx(2 ** (8 / 9)) and at4["k_star"] == pytest.approx(2 ** (10 / 9))
    assert at4["lo"] == pytest.approx(2 ** (8 / 9)) and at4["hi"] == pytest.approx(2 ** (8 / 9))
    assert result["efficiency"][8]["estimate"] == pytest.approx(1.0)  # both reach pass@8 = 1 at k = 8
    assert result["efficiency"][2]["estimate"] == pytest.approx(2.0)  # RepExp's pass@1 = GRPO's pass@2
    assert result["difference"][1] == {"estimate": pytest.approx(0.125), "lo": pytest.approx(0.125),
                                       "hi": pytest.approx(0.125)}
    assert result["resampled"] == "problems" and result["replicates"] == 200


def test_bootstrap_of_identical_methods_is_centred_on_one_and_zero():
    import numpy as np

    rng = np.random.default_rng(0)
    difficulty = rng.beta(0.7, 1.5, 200)
    counts = random_counts(rng, 1, 200, 32, 1.0, difficulty)
    n = np.full_like(counts, 32)
    ks = [1, 2, 4, 8, 16, 32]
    paired = aggregate.bootstrap_k_efficiency(n, counts, n, counts, ks, diff_ks=[1, 32])
    # one seed each and the same problems in every replicate: RepExp = GRPO exactly, whatever is drawn
    assert paired["efficiency"][32] == {"estimate": pytest.approx(1.0), "k_star": pytest.approx(32.0),
                                        "lo": pytest.approx(1.0), "hi": pytest.approx(1.0), "not_reached": 0.0,
                                        "undefined": 0.0}
    assert paired["difference"][1]["lo"] == paired["difference"][1]["hi"] == 0.0
    # three seeds, the same three for both methods: seeds are resampled per method, so the interval is wide
    # but centred: efficiency 1 and difference 0 inside, on both sides
    seeds = random_counts(rng, 3, 200, 32, 1.0, difficulty)
    n3 = np.full_like(seeds, 32)
    result = aggregate.bootstrap_k_efficiency(n3, seeds, n3, seeds, ks, diff_ks=[1, 32])
    eff = result["efficiency"][32]
    assert eff["estimate"] == pytest.approx(1.0) and eff["lo"] < 1.0 < eff["hi"]
    for k in (1, 32):
        diff = result["difference"][k]
        assert diff["estimate"] == pytest.approx(0.0, abs=1e-15) and diff["lo"] < 0.0 < diff["hi"]
    assert result["resampled"] == "problems, RepExp seeds, GRPO seeds"


def test_bootstrap_is_seeded_contains_the_estimate_and_narrows_with_more_problems():
    import numpy as np

    rng = np.random.default_rng(1)
    difficulty = rng.beta(0.6, 1.2, 1600)
    ks = [1, 2, 4, 8, 16, 32, 64]

    def run(num_problems, seed=0):
        grpo = random_counts(rng, 3, num_problems, 64, 0.7, difficulty)
        repexp = random_counts(rng, 3, num_problems, 64, 1.0, difficulty)
        n = np.full_like(grpo, 64)
        return aggregate.bootstrap_k_efficiency(n, repexp, n, grpo, ks, reference_ks=[8, 32], diff_ks=[1, 64],
                                                seed=seed), (n, repexp, grpo)

    small, data = run(100)
    n, repexp, grpo = data
    again = aggregate.bootstrap_k_efficiency(n, repexp, n, grpo, ks, reference_ks=[8, 32], diff_ks=[1, 64])
    assert repr(again) == repr(small)  # the same seed, the same numbers (repr: NaN equals NaN)
    other = aggregate.bootstrap_k_efficiency(n, repexp, n, grpo, ks, reference_ks=[8, 32], diff_ks=[1, 64], seed=1)
    assert other["efficiency"][8]["lo"] != small["efficiency"][8]["lo"]
    assert other["efficiency"][8]["estimate"] == small["efficiency"][8]["estimate"]  # the seed moves only the interval
    for ref in (8, 32):
        eff = small["efficiency"][ref]
        assert eff["lo"] <= eff["estimate"] <= eff["hi"] and eff["estimate"] > 1
    for k in (1, 64):
        diff = small["difference"][k]
        assert diff["lo"] <= diff["estimate"] <= diff["hi"]
    assert small["difference"][1]["lo"] > 0  # RepExp solves more at k = 1
    large, _ = run(1600)
    for ref in (8, 32):
        width = small["efficiency"][ref]["hi"] - small["efficiency"][ref]["lo"]
        assert large["efficiency"][ref]["hi"] - large["efficiency"][ref]["lo"] < 0.6 * width
    assert (large["difference"][1]["hi"] - large["difference"][1]["lo"]
            < 0.6 * (small["difference"][1]["hi"] - small["difference"][1]["lo"]))


def test_bootstrap_counts_misses_and_refuses_unpaired_problems():
    import numpy as np

    n = np.full((1, 10), 4)
    result = aggregate.bootstrap_k_efficiency(n, np.zeros((1, 10), int), n, np.full((1, 10), 2), [1, 2, 4],
                                              replicates=50)
    assert math.isnan(result["efficiency"][4]["estimate"]) and result["efficiency"][4]["not_reached"] == 1.0
    assert result["efficiency"][4]["lo"] == result["efficiency"][4]["hi"] == 0.0  # misses count as efficiency 0
    with pytest.raises(ValueError, match="paired bootstrap"):
        aggregate.bootstrap_k_efficiency(n, n, np.full((1, 9), 4), np.full((1, 9), 4), [1, 2, 4])


def test_k_efficiency_tables_carry_the_bootstrap(tmp_path):
    import numpy as np

    rng = np.random.default_rng(2)
    difficulty = rng.beta(0.6, 1.2, 60)
    root = tmp_path / "eval"
    for seed in (41, 42, 43):
        write_counts(root, "math", f"verl_grpo_s{seed}", random_counts(rng, 1, 60, 16, 0.8, difficulty)[0], 16)
        write_counts(root, "math", f"verl_repexp_k32_b0.01_s{seed}",
                     random_counts(rng, 1, 60, 16, 1.0, difficulty)[0], 16)
    write_eval(root, "math", "verl_repexp_k32_b0.1_s41", log_linear(0.5, ks=[1, 2, 4, 8, 16]), n=16)  # no counts
    result = aggregate.aggregate(aggregate.find_eval_files(root), tmp_path / "out")
    keff = pd.read_csv(tmp_path / "out" / "k_efficiency.csv")
    by_k = aggregate.read_k_efficiency(tmp_path / "out" / "k_efficiency_by_k.csv")
    assert list(by_k.columns) == tables.k_efficiency_columns(["repexp"])
    row = keff[keff.beta == 0.01].iloc[0]
    assert row.reference_k == 16 and row.bootstrap_replicates == aggregate.BOOTSTRAP_REPLICATES
    assert row.bootstrap_resampled == "problems, RepExp seeds, GRPO seeds"
    assert row.efficiency_lo <= row.efficiency <= row.efficiency_hi
    assert row.diff_pass_at_1_lo <= row.diff_pass_at_1 <= row.diff_pass_at_1_hi
    assert row.diff_pass_at_ref_lo <= row.diff_pass_at_ref <= row.diff_pass_at_ref_hi
    # the interval equals the pure function's on the same counts
    counts = {r.spec.name: r.per_problem for r in result["runs"]}
    grpo = np.array([[c for _, _, c in counts[f"verl_grpo_s{s}"]] for s in (41, 42, 43)])
    repexp = np.array([[c for _, _, c in counts[f"verl_repexp_k32_b0.01_s{s}"]] for s in (41, 42, 43)])
    n = np.full_like(grpo, 16)
    direct = aggregate.bootstrap_k_efficiency(n, repexp, n, grpo, [1, 2, 4, 8, 16], reference_ks=[1, 2, 4, 8, 16],
                                              diff_ks=[1, 2, 4, 8, 16])
    assert (row.efficiency_lo, row.efficiency_hi) == (pytest.approx(direct["efficiency"][16]["lo"]),
                                                      pytest.approx(direct["efficiency"][16]["hi"]))
    assert row.efficiency == pytest.approx(direct["efficiency"][16]["estimate"])  # table and counts agree
    # one row per grid k in the by-k table; its last is k_efficiency.csv's row
    point = by_k[by_k.beta == 0.01]
    assert list(point.reference_k) == [1, 2, 4, 8, 16]
    assert point.iloc[-1].efficiency_hi == pytest.approx(row.efficiency_hi)
    assert point.iloc[2].efficiency_lo == pytest.approx(direct["efficiency"][4]["lo"])
    # a point without per-problem counts: the value, no interval, and the note says why
    bare = keff[keff.beta == 0.1].iloc[0]
    assert math.isnan(bare.efficiency_lo) and "no bootstrap interval: no per-problem counts" in bare.note
    md = (tmp_path / "out" / "pass_at_k.md").read_text()
    assert "efficiency [95% CI]" in md and "Δpass@1 [95% CI]" in md
    assert f"{row.efficiency:.2f} [{row.efficiency_lo:.2f}, {row.efficiency_hi:.2f}]" in md
