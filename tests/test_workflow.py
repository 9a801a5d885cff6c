"""The Snakemake DAG: dry runs of the paper sweep (local and slurm profiles), lint, config errors,
wildcard round trips, rerun semantics, and the whole pipeline on configs/test.yaml with MLflow.

Every invocation runs from the repository root (so `--profile slurm` resolves the way the README
command does) with `--directory <tmp>` and an absolute `results_dir`, so tests never touch the
checkout's `.snakemake/` or `results/`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import _reliability_fixtures as fx  # noqa: E402 (tests/ is on sys.path: tests/conftest.py)
import pytest
import yaml

from repexp import config as C
from repexp import jobs

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
PAPER = REPO / "configs" / "paper.yaml"
TEST = REPO / "configs" / "test.yaml"
# configs/test.yaml's runs: every method of repexp.methods trains once; the base model is evaluated too
TEST_RUNS = len(C.sweep_runs(C.load(TEST)))
TRAINED = len([spec for spec in C.sweep_runs(C.load(TEST)) if spec.trains])
PAPER_JOBS = {"download_model": 1, "download_data": 1, "preprocess": 3, "train": 18, "select": 18, "merge": 18,
              "eval": 21, "testtime": 21, "aggregate": 1, "figures": 1, "all": 1}
SLURM_VARIABLES = ("REPEXP_SLURM_ACCOUNT", "REPEXP_SLURM_PARTITION", "REPEXP_SLURM_GPU_PARTITION",
                   "SLURM_ACCOUNT", "SLURM_PARTITION", "SLURM_GPU_PARTITION", "SBATCH_ACCOUNT", "SBATCH_PARTITION")


def snakemake(*args: str, workdir: Path, check: bool = True, timeout: int = 900,
              env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    for name in SLURM_VARIABLES:  # the submit shell's cluster settings: only what a test sets
        env.pop(name, None)
    env.update(env_extra or {})
    proc = subprocess.run([SNAKEMAKE, "--directory", str(workdir), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-6000:]}")
    return proc


def job_counts(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table of a (dry) run; {} when there is nothing to do."""
    text = proc.stdout + proc.stderr
    if "Job stats:" not in text:
        return {}
    table = text.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.MULTILINE)}


def resource_lines(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.strip().startswith("resources:"))


def rule_resources_of(text: str, rule: str) -> list[dict[str, str]]:
    """The `resources:` of every job of `rule` in a dry run's output."""
    found = []
    for block in re.findall(rf"^rule {rule}:\n(.*?)(?:\n\n|\Z)", text, re.S | re.M):
        line = next((line for line in block.splitlines() if line.strip().startswith("resources:")), "")
        found.append(dict(item.split("=", 1) for item in line.split(":", 1)[1].split(", ") if "=" in item))
    return found


def dry_run(workdir: Path, results: Path, *args: str, configfile: Path = TEST) -> dict[str, int]:
    proc = snakemake("-n", "--profile", "local", "--configfile", str(configfile), *args,
                     "--config", f"results_dir={results}", workdir=workdir)
    return job_counts(proc)


# --------------------------------------------------------------------------- dry runs, lint, errors


_paper_dry_runs: dict[str, tuple[subprocess.CompletedProcess, Path]] = {}


def paper_dry_run(profile: str, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The literal README/paper command (paper.yaml is the Snakefile's default config), dry, with no
    cluster variables set; run once per profile and session."""
    if profile not in _paper_dry_runs:
        workdir = tmp_path_factory.mktemp(f"paper_{profile}")
        proc = snakemake("-n", "--profile", profile, "all", "--config", f"results_dir={workdir / 'results'}",
                         workdir=workdir)
        _paper_dry_runs[profile] = (proc, workdir)
    return _paper_dry_runs[profile]


def test_a_runtime_below_the_cost_plan_stops_the_paper_run_before_any_job(tmp_path):
    """Issue 23, item 5: test-time at the old 4 h cannot hold a MATH job by `repexp plan`'s estimate."""
    proc = snakemake("-n", "--profile", "slurm", "all", "--config", f"results_dir={tmp_path / 'results'}",
                     "set=resources.testtime.runtime=240", workdir=tmp_path, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Job stats" not in text
    assert "config error: resources.testtime.runtime: 240 min is below the estimate" in text, text[-3000:]


@pytest.mark.parametrize("profile", ["local", "slurm"])
def test_paper_dry_run_lists_exactly_the_expected_jobs(profile, tmp_path_factory):
    proc, tmp_path = paper_dry_run(profile, tmp_path_factory)
    assert job_counts(proc) == PAPER_JOBS
    text = proc.stdout + proc.stderr
    assert "dapo-with-aime24/verl_repexp_k128_b0.01_s43" in text and "math/verl_repexp_k32_b0.01_s41" in text
    if profile == "slurm":  # GPU requests from config resources; no account/partition unless set (below)
        assert re.search(r"rule train:.*?resources: [^\n]*gpu=8", text, re.S)
        assert "slurm_account" not in text and "slurm_partition" not in text and "$" not in resource_lines(text)
    assert not (tmp_path / "results").exists()  # a dry run writes nothing


GPU = REPO / "configs" / "gpu.yaml"
GPU_JOBS = {"model": 1, "preprocess": 1, "train": 3, "select": 3, "merge": 3, "eval": 4, "testtime": 4,
            "aggregate": 1, "figures": 1, "all": 1}


@pytest.mark.parametrize("profile", ["local", "slurm"])
def test_the_one_gpu_config_dry_runs_under_both_profiles(profile, tmp_path):
    """configs/gpu.yaml: two RepExp points + GRPO on verl, vLLM evals, the base model; one GPU per job."""
    proc = snakemake("all", "-n", "--profile", profile, "--configfile", str(GPU),
                     "--config", f"results_dir={tmp_path / 'results'}", workdir=tmp_path)
    assert job_counts(proc) == GPU_JOBS
    text = proc.stdout + proc.stderr
    for rule in ("train", "eval", "testtime"):
        assert {r["gpu" if profile == "local" else "gpus_per_node"] for r in rule_resources_of(text, rule)} == {"1"}
    assert "verl_repexp_k32_b0.1_s42" in text and "verl_grpo_s42" in text
    # the evals sample with vLLM: what `repexp run eval` composes from this config
    cfg = C.load(GPU)
    assert {jobs.compose(cfg, "eval", spec.task, spec.name).config.engine for spec in C.sweep_runs(cfg)} == {"vllm"}


def test_gpu_types_and_node_features_reach_the_slurm_jobs(tmp_path):
    """docs/slurm.md "GPU types": per-rule gpu_model / constraint become the plugin's resources
    (--gpus=<model>:N, -C), only on the rules that set them."""
    settings = "resources.train.gpu_model=h100 resources.eval.constraint=a100_80gb|h100"
    proc = snakemake("-n", "--profile", "slurm", "all", "--configfile", str(GPU),
                     "--config", f"results_dir={tmp_path / 'results'}", f"set={settings}", workdir=tmp_path)
    text = proc.stdout + proc.stderr
    train, evals, testtime = (rule_resources_of(text, rule) for rule in ("train", "eval", "testtime"))
    assert train and evals and testtime
    assert all(r["gpu_model"] == "h100" and r["gpu"] == "1" and "constraint" not in r for r in train)
    assert all(r["constraint"] == "a100_80gb|h100" and "gpu_model" not in r for r in evals)
    assert all("constraint" not in r and "gpu_model" not in r for r in testtime)


def test_slurm_settings_come_from_the_repexp_variables_only(tmp_path):
    env = {"REPEXP_SLURM_ACCOUNT": "proj42", "REPEXP_SLURM_PARTITION": "cpu", "REPEXP_SLURM_GPU_PARTITION": "gpu",
           "SLURM_ACCOUNT": "srun-own-account", "SLURM_PARTITION": "srun-own-partition"}  # srun's: ignored
    proc = snakemake("-n", "--profile", "slurm", "all", "--config", f"results_dir={tmp_path / 'results'}",
                     workdir=tmp_path, env_extra=env)
    text = proc.stdout + proc.stderr
    assert "srun-own" not in text and "$" not in resource_lines(text)
    for rule, partition in (("train", "gpu"), ("eval", "gpu"), ("preprocess", "cpu"), ("merge", "cpu")):
        for resources in rule_resources_of(text, rule):
            assert (resources["slurm_account"], resources["slurm_partition"]) == ("proj42", partition), rule


@pytest.mark.parametrize("env, variable", [
    ({"REPEXP_SLURM_PARTITION": "cpu"}, "REPEXP_SLURM_GPU_PARTITION"),  # GPU jobs would land on the CPU partition
    ({"REPEXP_SLURM_ACCOUNT": "$SLURM_ACCOUNT"}, "REPEXP_SLURM_ACCOUNT"),  # an unexpanded variable
], ids=["gpu-partition-missing", "unexpanded-account"])
def test_bad_slurm_settings_fail_before_any_job_naming_the_variable(tmp_path, env, variable):
    proc = snakemake("-n", "--profile", "slurm", "all", "--config", f"results_dir={tmp_path / 'results'}",
                     workdir=tmp_path, env_extra=env, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"config error: {variable}:" in text and "Job stats" not in text


def test_paper_training_budgets_are_finite_and_retention_bounded(tmp_path_factory):
    """Every train job of the paper's dry run stops by a step count, the same for every arm of a
    task; its allocation is at most 24 h (a chunk the trainer ends before the walltime, with a
    margin inside it); it keeps a bounded number of checkpoints."""
    proc, _ = paper_dry_run("slurm", tmp_path_factory)
    text = proc.stdout + proc.stderr
    jobs = re.findall(r"^rule train:\n(?:.*\n)*?\s+wildcards: task=(\S+), run=(\S+)\n", text, re.M)
    assert len(jobs) == PAPER_JOBS["train"]
    runtimes = {int(r["runtime"]) for r in rule_resources_of(text, "train")}
    paper = C.load(PAPER)
    for task, run in jobs:
        train = C.compose(paper, C.find_run(paper, task, run)).train
        assert train.total_steps is not None and train.total_steps <= 200, (task, run)
        assert all(train.walltime_margin_minutes < runtime <= 24 * 60 for runtime in runtimes)
        assert train.max_checkpoints_to_keep == 1 and train.test_freq % train.save_freq == 0
    assert {C.task_section(paper, t, "train").total_steps for t in paper.sweep.tasks} == {200, 80}
    steps_by_task = {}
    for task, run in jobs:  # equal arms: GRPO and every beta of a task train the same number of steps
        steps_by_task.setdefault(task, set()).add(C.compose(paper, C.find_run(paper, task, run)).train.total_steps)
    assert all(len(steps) == 1 for steps in steps_by_task.values()), steps_by_task


def test_lint_is_clean(tmp_path):
    proc = snakemake("--lint", workdir=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations, your workflow is in a good condition" in proc.stdout + proc.stderr


@pytest.mark.parametrize("patch, key", [
    ({"sweep": {"betas": [-0.1]}}, "beta"),  # the earlier key, read as sweep.methods.repexp.beta: the schema says so
    ({"sweep": {"tasks": ["gsm8k", "math"], "backends": ["trl"]}, "task_overrides": {"math": {"train": {
        "train_batch_size": 6, "ppo_mini_batch_size": 4}}}}, "task_overrides.math.train.ppo_mini_batch_size"),
])
def test_broken_configs_fail_before_any_job_naming_the_key(tmp_path, patch, key):
    raw = yaml.safe_load(TEST.read_text())
    for section, values in patch.items():
        raw.setdefault(section, {}).update(values)
    raw["results_dir"] = str(tmp_path / "results")
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(raw))
    proc = snakemake("all", "-n", "--configfile", str(broken), workdir=tmp_path, check=False)
    assert proc.returncode != 0
    assert key in proc.stdout + proc.stderr
    assert "Job stats" not in proc.stdout + proc.stderr


def _config_file(tmp_path: Path, text: str) -> Path:
    """configs/test.yaml's text, edited, with its results_dir under tmp_path."""
    path = tmp_path / "cfg.yaml"
    path.write_text(text.replace("results_dir: results/test", f"results_dir: {tmp_path / 'results'}"))
    return path


def test_duplicated_yaml_key_fails_naming_the_file_and_line(tmp_path):
    config = _config_file(tmp_path, TEST.read_text() + "\ntrain:\n  lr: 2.0e-5\n")  # a second `train:`
    proc = snakemake("all", "-n", "--configfile", str(config), workdir=tmp_path, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Job stats" not in text
    assert re.search(rf"{re.escape(str(config))}: line \d+: duplicate key 'train'", text), text[-2000:]


def test_missing_local_model_directory_is_not_taken_for_a_hub_id(tmp_path):
    raw = yaml.safe_load(TEST.read_text())
    raw.update(results_dir=str(tmp_path / "results"), model=str(tmp_path / "models" / "Qwen2.5-7B-Instruct"))
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(raw))
    proc = snakemake("all", "-n", "--configfile", str(config), workdir=tmp_path, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Job stats" not in text
    assert f"config error: model: {tmp_path / 'models' / 'Qwen2.5-7B-Instruct'} does not exist" in text


def test_exponent_without_a_dot_is_a_number_and_nested_overrides_reach_jobs(tmp_path):
    # PyYAML (Snakemake's reader) returns `lr: 1e-5` as the string '1e-5'; the config reads it as 1e-05
    config = _config_file(tmp_path, TEST.read_text().replace("lr: 1.0e-5", "lr: 1e-5"))
    assert yaml.safe_load(config.read_text())["train"]["lr"] == "1e-5"
    counts = job_counts(snakemake("all", "-n", "--configfile", str(config), "--config",
                                  "set=sweep.betas=[0.01, 0.02] train.lr=2e-6 eval.max_new_tokens=null",
                                  workdir=tmp_path))
    assert counts["train"] == TRAINED + 1  # two RepExp betas (the earlier key sweep.betas), every other method
    cfg = C.load(config, overrides=["sweep.betas=[0.01, 0.02]", "train.lr=2e-6", "eval.max_new_tokens=null"])
    assert cfg.train.lr == 2e-6 and cfg.sweep.methods.repexp.beta == [0.01, 0.02] and cfg.eval.max_new_tokens is None
    assert C.load(config).train.lr == 1e-5


def test_non_canonical_run_names_are_rejected(tmp_path):
    results = tmp_path / "results"
    # (targets before --configfile/--config, which take several values)
    # targets as users type them: relative to the working directory (results_dir lies inside it)
    proc = snakemake("results/eval/gsm8k/trl_repexp_k8_b0.010_s42/eval.json", "-n", "--configfile", str(TEST),
                     "--config", f"results_dir={results}", workdir=tmp_path, check=False)
    assert proc.returncode != 0 and "MissingRuleException" in proc.stdout + proc.stderr  # b0.010 is no run
    ok = snakemake("results/eval/gsm8k/trl_repexp_k8_b0.01_s42/eval.json", "-n", "--configfile", str(TEST),
                   "--config", f"results_dir={results}", workdir=tmp_path)
    assert job_counts(ok) == {"model": 1, "preprocess": 1, "train": 1, "select": 1, "eval": 1}


# --------------------------------------------------------------------------- the whole DAG


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """configs/test.yaml end to end with the local profile on 2 cores (the CI run): the session's reference
    run, which the fault, SLURM and tracking tests read too (tests/_reliability_fixtures.py)."""
    workdir = fx.reference_run(tmp_path_factory)
    return workdir, fx.results(workdir), fx.reference_run_output(tmp_path_factory)


def _mlflow_runs(results: Path) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("repexp-test")
    return client, client.search_runs([exp.experiment_id], max_results=1000)


@pytest.mark.slow
def test_pipeline_produces_evals_table_and_figures(pipeline):
    workdir, results, proc = pipeline
    assert job_counts(proc) == {"model": 1, "preprocess": 1, "train": TRAINED, "select": TRAINED, "eval": TEST_RUNS,
                                "testtime": TEST_RUNS,
                                "aggregate": 1, "figures": 1, "all": 1}
    runs = [s.name for s in C.sweep_runs(C.load(TEST))]
    for run in runs:
        result = json.loads((results / "eval" / "gsm8k" / run / "eval.json").read_text())
        assert result["n_samples"] == 4 and result["num_problems"] == 4 and set(result["pass_at_k"]) == {"1", "2", "4"}
    table = (results / "aggregate" / "pass_at_k.csv").read_text().splitlines()
    assert len(table) == 1 + TEST_RUNS * 3  # header + every run x k in {1, 2, 4}
    # the run's last lines say where the table, the figures and the MLflow records are
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert "repexp: done. Results:" in tail and f"table:   {results / 'aggregate' / 'pass_at_k.md'}" in tail
    assert f"figures: {results / 'figures'}/" in tail
    # the one command that opens the eval runs compared (tests/test_tracking.py opens its link), run in the workdir
    snapshot = next((results / "config").glob("*.yaml")).relative_to(workdir)
    assert f"MLflow:  cd {workdir} && repexp mlflow ui --config {snapshot}   #" in tail
    assert f"(store sqlite:///{(results / 'mlflow' / 'mlflow.db').resolve()})" in tail
    # no server had run when the workflow ended (the UI tests start one on this shared run later), so the
    # line says the server `repexp mlflow ui` starts writes the login, not that it is there
    credentials = (results / "mlflow" / "credentials.json").resolve()
    assert "its login is in" not in tail
    assert f"asks for a login, which it writes to {credentials})" in tail
    for run in runs:  # test-time RepExp: both curves meet at k = n; the table's column is the RepExp curve
        testtime = json.loads((results / "testtime" / "gsm8k" / run / "testtime.json").read_text())
        assert testtime["k"] == [1, 2, 3, 4] and testtime["pass_at_k_repexp"][-1] == testtime["pass_at_k_random"][-1]
    assert table[0].split(",")[-1] == "testtime_pass_at_k" and all(line.split(",")[-1] for line in table[1:])
    index = json.loads((results / "figures" / "index.json").read_text())
    # a one-point sweep (k = 8, β = 0.01) draws no heatmap: its numbers are the tables' rows (issue 25)
    assert {f["id"] for f in index["figures"]} == {"pass_at_k", "testtime_pass_at_k", "training_gsm8k_trl",
                                                   "k_efficiency", "dynamics_gsm8k_trl"}
    assert not list((results / "figures").glob("heatmap_*"))
    for figure in index["figures"]:
        assert all((results / "figures" / name).stat().st_size > 0 for name in figure["files"])
    # every job left its log and benchmark
    # one per job: model, preprocess, aggregate, figures, train and select per trained run, eval and testtime per run
    jobs = 4 + 2 * TRAINED + 2 * TEST_RUNS
    assert len([log for log in (results / "logs").rglob("*.log") if ".execution-" not in log.name]) == jobs
    # and its first execution's own copy beside it (repexp.joblog)
    copies = list((results / "logs").rglob("*.execution-1.log"))
    assert len(copies) == jobs == len(list((results / "logs").rglob("*.execution-*.log")))
    assert all(copy.stat().st_size > 0 for copy in copies)
    assert len(list((results / "benchmarks").rglob("*.tsv"))) == 4 + 2 * TRAINED + 2 * TEST_RUNS


@pytest.mark.slow
def test_report_embeds_figures_and_tables(pipeline):
    workdir, results, _ = pipeline
    report = workdir / "report.html"
    snakemake("--report", str(report), "--configfile", str(TEST), "--config", f"results_dir={results}",
              workdir=workdir)
    html = report.read_text(errors="ignore")
    assert report.stat().st_size > 10_000
    for name in ("pass_at_k.png", "testtime_pass_at_k.png", "training_gsm8k_trl.png",
                 "pass_at_k.html", "k_efficiency.csv"):
        assert name in html, name


@pytest.mark.slow
def test_every_node_has_its_mlflow_run(pipeline):
    _, results, _ = pipeline
    client, runs = _mlflow_runs(results)
    nodes = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    parents = {r.info.run_id: r for r in runs if "mlflow.parentRunId" not in r.data.tags}
    specs = C.sweep_runs(C.load(TEST))
    assert sorted(r.data.tags["snakemake.rule"] for r in nodes) == sorted(
        ["model", "preprocess", "aggregate", "figures", *["train", "select"] * TRAINED,
         *["eval", "testtime"] * TEST_RUNS])
    assert all(r.info.status == "FINISHED" for r in runs)
    assert sorted(p.data.tags["repexp.parent_key"] for p in parents.values()) == sorted(
        ["experiment", "task:gsm8k", *(f"point:gsm8k/{spec.name}" for spec in specs)])
    own_params = {spec.name: {name: C.canonical(value) for name, value in spec.params} for spec in specs}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    for node in nodes:
        tags = node.data.tags
        parent = parents[tags["mlflow.parentRunId"]]
        assert tags["repexp.scope_key"] == parent.data.tags["repexp.parent_key"]
        expected_wildcards = {"model": {"alias": "tiny"}, "preprocess": {"task": "gsm8k"}, "aggregate": {},
                              "figures": {}}.get(tags["snakemake.rule"],
                                                 {"task": "gsm8k", "run": tags.get("repexp.run")})
        assert json.loads(tags["snakemake.wildcards"]) == expected_wildcards
        assert len(tags["repexp.config_hash"]) == 12 and tags["snakemake.attempt"] == "1"
        assert tags["snakemake.jobid"].isdigit()  # the id in Snakemake's log
        if commit:
            assert tags["git.commit"] == commit
        artifacts = {a.path for a in client.list_artifacts(node.info.run_id)}
        rule = tags["snakemake.rule"]
        if rule == "train":
            assert {"job.yaml", "best_dev.json", "metrics.jsonl"} <= artifacts
            assert node.data.params["train.total_steps"] == "2"
            # a run logs its own method's parameters only (GRPO's sparse_dim is absent, not the string 'None')
            logged = {name: node.data.params.get(name) for name in ("sparse_dim", "beta", "passk_k", "outcome_mode",
                                                                     "loss_mode", "cov_ratio")}
            own = own_params[tags["repexp.run"]]
            assert logged == {name: own.get(name) for name in logged}, (tags["repexp.run"], logged)
            assert "None" not in node.data.params.values()
            steps = {m.step for m in client.get_metric_history(node.info.run_id, "dev/pass_at_1")}
            assert steps == {0, 1, 2}  # validation before training and after each step
            assert {m.step for m in client.get_metric_history(node.info.run_id, "reward/verifier/mean")} == {1, 2}
        elif rule == "eval":
            assert artifacts == {"eval.json", "test"} and node.data.params["job.config.n_samples"] == "4"  # +curve
            run = tags["repexp.run"]
            result = json.loads((results / "eval" / "gsm8k" / run / "eval.json").read_text())
            per_k = {k: v for k, v in node.data.metrics.items() if re.fullmatch(r"test/pass_at_\d+", k)}
            # one metric per k, to 3 decimals (docs/tracking.md, "Values to 3 decimals")
            assert per_k == {f"test/pass_at_{k}": round(v, 3) for k, v in result["pass_at_k"].items()}
        elif rule == "testtime":
            assert artifacts == {"testtime.json"} and node.data.params["job.config.sparse_dim"] == "32"
            result = json.loads((results / "testtime" / "gsm8k" / tags["repexp.run"] / "testtime.json").read_text())
            from repexp.metrics import testtime_curves, testtime_metrics

            curves = testtime_curves(result)  # pass@k against k (step = k), beside the per-k metrics
            assert {k: v for k, v in node.data.metrics.items() if k.startswith("testtime/") and k not in curves} == {
                k: round(v, 3) for k, v in testtime_metrics(result).items()}
            for name, curve in curves.items():
                history = client.get_metric_history(node.info.run_id, name)
                assert sorted((m.step, m.value) for m in history) == [(k, round(v, 3)) for k, v in
                                                                         sorted(curve.items())]
        elif rule == "select":
            assert artifacts == {"select.json"} and "select.checkpoint_step" in node.data.params
        elif rule == "preprocess":
            assert "manifest.json" in artifacts and node.data.params["job.config.limit_test"] == "4"
        elif rule == "model":
            assert "tiny" in artifacts
        elif rule == "aggregate":
            assert {"pass_at_k.csv", "k_efficiency.csv"} <= artifacts
        elif rule == "figures":
            assert {"index.json", "pass_at_k.png", "pass_at_k.pdf"} <= artifacts
    # short nodes leave records for a detached upload; when snakemake returns, none is pending
    from repexp.tracking import pending_records

    assert pending_records(results) == []


@pytest.mark.slow
def test_reruns_are_targeted(pipeline, tmp_path):
    workdir, results, _ = pipeline
    again = snakemake("all", "--profile", "local", "--cores", "2", "--configfile", str(TEST),
                      "--config", f"results_dir={results}", workdir=workdir)
    assert "Nothing to be done" in again.stdout + again.stderr and job_counts(again) == {}

    # one eval output gone: that eval reruns (and the table and figures made from it), nothing upstream
    removed = results / "eval" / "gsm8k" / "base" / "eval.json"
    saved = removed.read_bytes()
    removed.unlink()
    try:
        assert dry_run(workdir, results) == {"eval": 1, "testtime": 1, "aggregate": 1, "figures": 1, "all": 1}
    finally:
        removed.write_bytes(saved)
        os.utime(removed, (removed.stat().st_atime, (results / "aggregate" / "pass_at_k.csv").stat().st_mtime - 1))
    assert dry_run(workdir, results) == {}

    # deliberate reruns of one layer
    assert dry_run(workdir, results, "--forcerun", "train", "--until", "eval") == {"train": TRAINED, "select": TRAINED,
                                                                                       "eval": TRAINED}

    # a config change reruns exactly the jobs whose resolved config changed (params = the job's config)
    raw = yaml.safe_load(TEST.read_text())
    raw["eval"]["n_samples"] = 2
    changed_eval = tmp_path / "eval_changed.yaml"
    changed_eval.write_text(yaml.safe_dump(raw))
    assert dry_run(workdir, results, configfile=changed_eval) == {
        "eval": TEST_RUNS, "testtime": TEST_RUNS, "aggregate": 1, "figures": 1, "all": 1}
    raw = yaml.safe_load(TEST.read_text())
    raw["train"]["lr"] = 3.0e-5
    changed_train = tmp_path / "train_changed.yaml"
    changed_train.write_text(yaml.safe_dump(raw))
    assert dry_run(workdir, results, configfile=changed_train) == {
        "train": TRAINED, "select": TRAINED, "eval": TRAINED, "testtime": TRAINED, "aggregate": 1, "figures": 1,
        "all": 1}


# --------------------------------------------------------------------------- rerun triggers of the paper sweep


@pytest.fixture(scope="module")
def finished_paper(tmp_path_factory):
    """The paper DAG marked finished without running it: every output created, then `snakemake --touch`
    (which records each job's params, as a real run does, and orders the mtimes along the DAG)."""
    workdir = tmp_path_factory.mktemp("paper_touched")
    config = ("--config", f"results_dir={workdir / 'results'}")
    summary = snakemake("--summary", "--profile", "local", "all", *config, workdir=workdir).stdout
    for line in summary.splitlines()[1:]:
        fields = line.split("\t")
        if len(fields) < 3 or "\t" not in line:
            continue
        path = workdir / fields[0]
        if fields[2] in ("download_model", "model"):  # directory() outputs
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    snakemake("--touch", "--forceall", "--profile", "local", "all", *config, workdir=workdir)  # every job recorded
    assert dry_paper(workdir)[0] == {}, "a touched DAG has nothing to do"
    return workdir


def dry_paper(workdir: Path, *overrides: str) -> tuple[dict[str, int], str]:
    """Job counts and output of a dry run of the paper sweep under the profiles' rerun triggers."""
    config = [f"results_dir={workdir / 'results'}", *(["set=" + " ".join(overrides)] if overrides else [])]
    proc = snakemake("-n", "--profile", "local", "all", "--config", *config, workdir=workdir)
    return job_counts(proc), proc.stdout + proc.stderr


def test_hub_downloads_feed_every_job_with_local_paths(finished_paper, tmp_path_factory):
    """The paper's hub model and hub datasets are fetched by the two download localrules; every
    preprocess, train and base-eval job depends on those local copies, and the config snapshot
    that jobs read names local paths only (no hub id, no `hf`)."""
    proc, workdir = paper_dry_run("slurm", tmp_path_factory)
    text = proc.stdout + proc.stderr
    hub_dir = "results/models/hub/Qwen--Qwen2.5-7B-Instruct"
    for rule in ("train", "preprocess"):
        blocks = re.findall(rf"^rule {rule}:\n(.*?)(?:\n\n|\Z)", text, re.S | re.M)
        needed = hub_dir if rule == "train" else "results/downloads/data/"
        assert blocks and all(needed in block.split("output:")[0] for block in blocks), rule
    base_evals = [b for b in re.findall(r"^rule eval:\n(.*?)(?:\n\n|\Z)", text, re.S | re.M) if "run=base" in b]
    assert len(base_evals) == 3 and all(hub_dir in block for block in base_evals)

    (snapshot,) = (finished_paper / "results" / "config").glob("repexp-paper-*.yaml")
    cfg = C.load(snapshot)  # paths as jobs see them: relative to the workdir, where results_dir lies
    assert cfg.model == hub_dir and cfg.results_dir == "results"
    assert (cfg.data.source, cfg.data.dapo_source) == ("results/downloads/data", "results/downloads/data/dapo")
    for spec in C.sweep_runs(cfg):
        run = C.compose(cfg, spec)
        assert run.model == hub_dir and run.data_dir.startswith("results/data/")


def test_both_profiles_rerun_on_the_same_triggers():
    profiles = REPO / "workflow" / "profiles"
    triggers = {name: yaml.safe_load((profiles / name / "profile.yaml").read_text())["rerun-triggers"]
                for name in ("local", "slurm")}
    assert triggers["local"] == triggers["slurm"] == ["mtime", "input", "params"]


@pytest.mark.parametrize("overrides, expected", [
    # the other backend's settings, where Ray runs (not what it computes), retention: nothing at all
    (("trl.eval_batch_size=4", "verl.ray_num_cpus=32", "train.max_checkpoints_to_keep=3"), {}),
    # an eval setting: the evals and what reads them, no training
    (("eval.shard_size=16",), {"eval": 21, "testtime": 21, "aggregate": 1, "figures": 1, "all": 1}),
], ids=["runtime-settings", "eval-setting"])
def test_settings_that_do_not_change_training_rerun_no_training(finished_paper, overrides, expected):
    counts, text = dry_paper(finished_paper, *overrides)
    assert counts == expected, text[-3000:]


def test_bonus_settings_rerun_the_repexp_runs_only(finished_paper):
    counts, text = dry_paper(finished_paper, "bonus.lamb=0.1")
    # Test-time RepExp selects with the training bonus's λ, so every run's testtime node (18 trained + 3 base)
    # reruns on its existing samples; only the 9 RepExp trainings (and what follows them) retrain.
    assert counts == {"train": 9, "select": 9, "merge": 9, "eval": 9, "testtime": 21, "aggregate": 1, "figures": 1,
                      "all": 1}
    trained = re.findall(r"^rule train:\n(?:.*\n)*?\s+wildcards: task=\S+, run=(\S+)\n", text, re.M)
    assert trained and all("_repexp_" in run for run in trained)  # none of the β = 0 (GRPO) runs


def test_a_new_beta_runs_exactly_its_own_points(finished_paper):
    counts, text = dry_paper(finished_paper, "sweep.betas=[0.01,0.02]")
    assert counts == {"train": 9, "select": 9, "merge": 9, "eval": 9, "testtime": 9, "aggregate": 1, "figures": 1,
                      "all": 1}
    trained = re.findall(r"^rule train:\n(?:.*\n)*?\s+wildcards: task=(\S+), run=(\S+)\n", text, re.M)
    assert sorted(trained) == sorted((task, f"verl_repexp_k{32 if task != 'dapo-with-aime24' else 128}_b0.02_s{seed}")
                                     for task in ("math", "gsm8k", "dapo-with-aime24") for seed in (41, 42, 43))


# --------------------------------------------------------------------------- the train node's run directory


def test_train_node_resumes_an_interrupted_run_and_sets_aside_stale_ones(tmp_path):
    from repexp import train
    from repexp.io import write_json_atomic

    run_dir = tmp_path / "train" / "gsm8k" / "trl_grpo_s42"
    assert train.prepare_run_dir(run_dir, "hash-a") is None  # nothing there yet
    (run_dir / "checkpoints" / "global_step_1").mkdir(parents=True)
    write_json_atomic(run_dir / train.STATE_FILE, {"training_hash": "hash-a", "status": "failed"})
    assert train.prepare_run_dir(run_dir, "hash-a") is None  # same config, unfinished: the trainer resumes
    assert (run_dir / "checkpoints" / "global_step_1").is_dir()

    moved = train.prepare_run_dir(run_dir, "hash-b")  # config changed: never resume its checkpoints
    assert moved is not None and not run_dir.exists()
    assert moved.parent == run_dir.parent / ".superseded" and moved.name.startswith("trl_grpo_s42-hash-a-")
    assert (moved / "checkpoints" / "global_step_1").is_dir()

    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / train.STATE_FILE, {"training_hash": "hash-b", "status": "done"})
    assert train.prepare_run_dir(run_dir, "hash-b") is not None  # finished before: a deliberate rerun starts over


def test_train_job_refuses_a_run_the_config_does_not_have(tmp_path):
    """Runs are looked up among the config's runs, never parsed: an unknown or non-canonical name fails naming `run`."""
    raw = yaml.safe_load(TEST.read_text())
    raw["results_dir"] = str(tmp_path / "results")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    repexp = str(Path(sys.executable).parent / "repexp")
    for run, why in (("trl_repexp_k8_b0.010_s42", "is not a run of this config"), ("trl_grpo_s7", "is not a run of"),
                     ("base", "trains nothing")):
        proc = subprocess.run([repexp, "run", "train", "--config", str(cfg), "--task", "gsm8k", "--run", run],
                              capture_output=True, text=True)
        assert proc.returncode == 2 and f"run: gsm8k/{run} {why}" in proc.stderr, proc.stderr
        assert run == "base" or "trl_grpo_s42" in proc.stderr  # the message lists the task's runs
    assert not (tmp_path / "results").exists()
