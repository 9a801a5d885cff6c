"""MLflow node tracking: nesting, tags, concurrent parents, the outbox and `repexp mlflow sync`.

Every test talks to a real MLflow SQLite store in tmp_path (no mocks); the unreachable-server
case points at a closed port on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from repexp import checkpoints, cli
from repexp import layout as L
from repexp import metrics as metric_names
from repexp import tracking as T
from repexp.evaluate.core import eval_result

REPEXP = str(Path(sys.executable).parent / "repexp")
SPEC = "trl_repexp_k8_b0.01_s42"


def _config(tmp_path: Path, **tracking) -> Path:
    raw = {
        "name": "track-test",
        "results_dir": str(tmp_path / "results"),
        "model": "tiny",
        "sweep": {"tasks": ["gsm8k"], "backends": ["trl"], "sparse_dims": [8], "betas": [0.01], "seeds": [42]},
        "tracking": tracking,
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs(uri: str, experiment: str = "track-test") -> list:
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory) -> Path:
    """One migrated, empty SQLite store; tests copy it (creating one runs ~2 s of schema migrations)."""
    results = tmp_path_factory.mktemp("template")
    _client(T.default_tracking_uri(results)).search_experiments()
    return results / "mlflow" / "mlflow.db"


def _new_store(results: Path, empty_db: Path) -> str:
    db = results / "mlflow" / "mlflow.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(empty_db, db)
    return T.default_tracking_uri(results)


@pytest.fixture
def store(tmp_path, monkeypatch, empty_db):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(T.ENV_TRACKING, raising=False)
    cfg = _config(tmp_path)
    return cfg, _new_store(tmp_path / "results", empty_db)


def test_node_runs_nest_under_their_parents_with_tags_params_metrics_artifacts(store, tmp_path, monkeypatch):
    cfg, uri = store
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    artifact = tmp_path / "job.yaml"
    artifact.write_text("lr: 0.001\n")
    with T.node_run("train", "gsm8k", SPEC, config=cfg, params={"train.lr": 0.001}, attempt=2) as node:
        assert node.online and node.run_id
        node.log_metrics({"reward/verifier/mean": 0.25}, step=1)
        node.log_metrics({"reward/verifier/mean": 0.5}, step=2)
        node.log_artifact(artifact)
        (tmp_path / "summary.json").write_text(json.dumps({"a": 1}))
        node.log_artifact(tmp_path / "summary.json", "extra")
    train_id = node.run_id
    with T.node_run("eval", "gsm8k", SPEC, config=cfg) as node:
        eval_id = node.run_id
    with T.node_run("preprocess", "gsm8k", config=cfg) as node:
        prep_id = node.run_id
    with T.node_run("figures", config=cfg) as node:
        fig_id = node.run_id

    client = _client(uri)
    runs = {r.info.run_id: r for r in _runs(uri)}
    assert len(runs) == 7  # 4 nodes + point, task and experiment parents
    train = runs[train_id]
    parent = runs[train.data.tags["mlflow.parentRunId"]]
    assert runs[eval_id].data.tags["mlflow.parentRunId"] == parent.info.run_id  # same sweep point, same parent
    assert parent.data.tags[T.PARENT_KEY_TAG] == f"point:gsm8k/{SPEC}"
    assert parent.data.tags[T.SWEEP_POINT_TAG] == f"gsm8k/{SPEC}"
    assert parent.data.params == {"task": "gsm8k", "method": "repexp", "backend": "trl", "sparse_dim": "8",
                                  "beta": "0.01", "seed": "42"}
    assert parent.info.status == "FINISHED" and "mlflow.parentRunId" not in parent.data.tags
    assert parent.data.tags[T.RESULTS_ID_TAG] == T.results_id(tmp_path / "results")
    tags = train.data.tags
    assert tags["snakemake.rule"] == "train"
    assert json.loads(tags["snakemake.wildcards"]) == {"task": "gsm8k", "run": SPEC}
    assert tags["snakemake.attempt"] == "2" and tags["slurm.job_id"] == "4242"
    assert len(tags["repexp.config_hash"]) == 12 and tags[T.SWEEP_POINT_TAG] == f"gsm8k/{SPEC}"
    if (T.REPO_ROOT / ".git").exists():
        assert len(tags["git.commit"]) == 40 and tags["mlflow.source.git.commit"] == tags["git.commit"]
    assert train.info.run_name == f"train gsm8k/{SPEC}" and train.info.status == "FINISHED"
    assert tags[T.EXECUTION_TAG] == "1" and tags["mlflow.user"]  # MLflow's own context tags are resolved too
    # every node of a sweep point carries the point's params, so the runs table filters and sorts by them
    point = {"task": "gsm8k", "method": "repexp", "backend": "trl", "sparse_dim": "8", "beta": "0.01", "seed": "42"}
    assert train.data.params == {"train.lr": "0.001", **point}
    assert runs[eval_id].data.params == point
    assert runs[prep_id].data.params == {"task": "gsm8k"}
    history = client.get_metric_history(train_id, "reward/verifier/mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.25), (2, 0.5)]
    assert sorted(a.path for a in client.list_artifacts(train_id)) == ["extra", "job.yaml"]
    assert [a.path for a in client.list_artifacts(train_id, "extra")] == ["extra/summary.json"]
    prep_parent = runs[runs[prep_id].data.tags["mlflow.parentRunId"]]
    assert prep_parent.data.tags[T.PARENT_KEY_TAG] == "task:gsm8k"
    assert runs[runs[fig_id].data.tags["mlflow.parentRunId"]].data.tags[T.PARENT_KEY_TAG] == "experiment"
    assert not T.pending_records(tmp_path / "results")


def test_a_failing_node_is_marked_failed_and_the_error_propagates(store):
    cfg, uri = store
    with pytest.raises(RuntimeError, match="boom"):
        with T.node_run("eval", "gsm8k", "base", config=cfg) as node:
            raise RuntimeError("boom")
    run = _client(uri).get_run(node.run_id)
    assert run.info.status == "FAILED" and "boom" in run.data.tags["repexp.error"]
    parent = _client(uri).get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.info.status == "FAILED"  # a parent shows its latest node's outcome


def test_concurrent_nodes_of_one_sweep_point_share_one_parent(store, tmp_path):
    cfg, uri = store
    script = (
        "import sys; from repexp import tracking as T\n"
        "with T.node_run(sys.argv[1], 'gsm8k', 'trl_grpo_s42', config=sys.argv[2]) as n:\n"
        "    n.log_metrics({'x': 1.0})\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, rule, str(cfg)], stderr=subprocess.PIPE, text=True)
             for rule in ("train", "select", "eval")]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "outbox" not in err  # nobody fell back to the outbox
    runs = _runs(uri)
    parents = [r for r in runs if r.data.tags.get(T.PARENT_KEY_TAG) == "point:gsm8k/trl_grpo_s42"]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(r.data.tags["snakemake.rule"] for r in children) == ["eval", "select", "train"]


def test_unreachable_server_writes_the_outbox_and_sync_uploads_exactly_once(tmp_path, monkeypatch, empty_db):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    dead = f"http://127.0.0.1:{_closed_port()}"
    cfg = _config(tmp_path, tracking_uri=dead)
    results = tmp_path / "results"
    artifact = tmp_path / "eval.json"
    artifact.write_text('{"pass_at_k": {"1": 0.5}}\n')
    with T.node_run("eval", "gsm8k", "base", config=cfg, params={"cmd.n-samples": 4}) as node:
        assert not node.online and node.run_id is None and dead in node.offline_reason
        node.log_metrics({"pass_at_k": 0.5}, step=1)
        node.log_metrics({"pass_at_k": 0.75}, step=2)
        node.log_artifact(artifact)
    with pytest.raises(ValueError):
        with T.node_run("train", "gsm8k", SPEC, config=cfg):
            raise ValueError("trainer crashed")
    artifact.write_text("changed after the node ended\n")  # the outbox kept its own copy

    pending = T.pending_records(results)
    assert len(pending) == 2
    records = [json.loads((d / T.RECORD_FILE).read_text()) for d in pending]
    assert {r["status"] for r in records} == {"FINISHED", "FAILED"} and all(r["tracking_uri"] == dead for r in records)

    # the server is still down: sync keeps everything
    synced, errors = T.sync(results)
    assert synced == 0 and len(errors) == 2 and len(T.pending_records(results)) == 2

    uri = _new_store(tmp_path / "store", empty_db)  # the store is back (here: a local SQLite store)
    assert T.sync(results, tracking_uri=uri) == (2, [])
    assert T.sync(results, tracking_uri=uri) == (0, [])  # marked synced: nothing twice
    # a sync that died after uploading but before marking: replaying the record changes nothing
    (pending[0] / T.SYNCED_FILE).unlink()
    (pending[1] / T.SYNCED_FILE).unlink()
    assert T.sync(results, tracking_uri=uri) == (2, [])

    client = _client(uri)
    runs = _runs(uri)
    nodes = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert sorted((r.data.tags["snakemake.rule"], r.info.status) for r in nodes) == [("eval", "FINISHED"),
                                                                                        ("train", "FAILED")]
    assert len([r for r in runs if T.PARENT_KEY_TAG in r.data.tags]) == 2  # one parent per sweep point
    (eval_run,) = [r for r in nodes if r.data.tags["snakemake.rule"] == "eval"]
    history = client.get_metric_history(eval_run.info.run_id, "pass_at_k")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.75)]  # no duplicated points
    assert eval_run.data.params == {"cmd.n-samples": "4", "method": "base", "task": "gsm8k"}  # the base model has no β
    # artifacts land next to the target store's database, never in the cwd's ./mlruns, and are recorded
    # relative to it (mlflow-artifacts:, what a server of the results directory serves wherever it is)
    location = client.get_experiment_by_name("track-test").artifact_location
    assert location == "mlflow-artifacts:/" and eval_run.info.artifact_uri.startswith(location)
    stored = tmp_path / "store" / "mlflow" / "artifacts" / eval_run.info.run_id / "artifacts" / "eval.json"
    assert stored.read_text() == '{"pass_at_k": {"1": 0.5}}\n'
    local = client.download_artifacts(eval_run.info.run_id, "eval.json", str(tmp_path / "dl"))
    assert Path(local).read_text() == '{"pass_at_k": {"1": 0.5}}\n'


def test_tracking_off_logs_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(T.ENV_TRACKING, "off")
    cfg = _config(tmp_path)
    with T.node_run("eval", "gsm8k", "base", config=cfg) as node:
        node.log_metrics({"x": 1.0})
    assert node.run_id is None
    assert not (tmp_path / "results" / "mlflow").exists()


def test_node_wrapper_runs_the_command_and_logs_its_outputs(store, tmp_path, capfd, monkeypatch):
    cfg, uri = store
    monkeypatch.setenv(T.ENV_SNAKEMAKE_EXEC, "main")
    run_dir = tmp_path / "results" / "train" / "gsm8k" / SPEC
    tracker = checkpoints.BestDevTracker(run_dir)
    for step in (1, 2):
        ckpt = checkpoints.checkpoint_dir(run_dir, step)
        ckpt.mkdir(parents=True)
        checkpoints.mark_complete(ckpt)
        tracker.record_validation(step, {"dev/pass_at_1": 0.1 * step})
    pointer = run_dir / "select.json"
    command = ["run", "select", "--config", str(cfg), "--snakemake-jobid", "{12}", "--task", "gsm8k", "--run", SPEC]
    # the stage runs in this process inside its node; the stage's exit status is the node's
    assert cli.main(command) == 0
    assert json.loads(pointer.read_text())["checkpoint_step"] == 2
    (run_dir / "best_dev.json").unlink()
    assert cli.main(command) == 1
    assert "best_dev.json: missing" in capfd.readouterr().err
    # a node whose command ended before its run was open left its record for an upload: wait for it
    assert T.sync(tmp_path / "results")[1] == []

    client = _client(uri)
    nodes = sorted((r for r in _runs(uri) if r.data.tags.get("snakemake.rule") == "select"),
                   key=lambda r: r.info.start_time)
    assert [r.info.status for r in nodes] == ["FINISHED", "FAILED"]
    assert "exited with status 1" in nodes[1].data.tags["repexp.error"]
    ok = nodes[0]
    assert ok.data.tags["snakemake.jobid"] == "12"
    assert ok.data.params["job.run_dir"] == str(run_dir) and ok.data.params["job.backend"] == "trl"
    assert ok.data.params["select.checkpoint_step"] == "2"
    assert [(m.step, m.value) for m in client.get_metric_history(ok.info.run_id, "best_dev_value")] == [(2, 0.2)]
    assert [a.path for a in client.list_artifacts(ok.info.run_id)] == ["select.json"]
    assert ok.data.tags["repexp.command"].startswith("repexp run select --task gsm8k")


def test_a_jobsteps_own_snakemake_jobid_is_not_tagged(store, monkeypatch):
    cfg, _ = store
    monkeypatch.setenv(T.ENV_SNAKEMAKE_EXEC, "remote")  # inside a SLURM job: Snakemake renumbers its jobs
    assert "snakemake.jobid" not in T.prepare_node("eval", "gsm8k", SPEC, config=cfg, snakemake_jobid="{0}").record.tags
    monkeypatch.setenv(T.ENV_SNAKEMAKE_EXEC, "main")
    node = T.prepare_node("eval", "gsm8k", SPEC, config=cfg, snakemake_jobid="{5}")
    assert node.record.tags["snakemake.jobid"] == "5"


def test_a_deferred_node_writes_nothing_itself_and_its_record_uploads_once(store, tmp_path):
    cfg, uri = store
    node = T.prepare_node("select", "gsm8k", SPEC, config=cfg, params={"cmd": "select"})
    assert node.defer()  # the command finished before the run was open
    node.start()  # the opener thread's work, arriving late: it must not open a run
    assert node.run_id is None and _runs(uri) == []
    node.log_metric_rows([["best_dev_value", 0.5, 2, 1]])
    node.end("FINISHED")
    assert (node.outbox_record / "record.json").exists()
    assert T.sync_one(node.outbox_record) == (1, [])
    assert T.sync_one(node.outbox_record) == (0, [])  # marked SYNCED: a second upload does nothing
    (child,) = [r for r in _runs(uri) if r.data.tags.get("snakemake.rule") == "select"]
    assert child.info.status == "FINISHED" and child.data.params["cmd"] == "select"
    assert child.data.params["beta"] == "0.01" and child.data.metrics == {"best_dev_value": 0.5}

    opened = T.prepare_node("select", "gsm8k", SPEC, config=cfg)
    opened.start()
    assert not opened.defer() and opened.online  # once open, the node finishes in the store directly
    opened.end("FINISHED")
    assert not opened.outbox_record.exists()


def test_a_fresh_node_process_logs_its_run_with_the_snakemake_jobid(store, tmp_path):
    """As a Snakemake job runs it: a short command usually ends before MLflow is imported."""
    cfg, uri = store
    env = {**os.environ, T.ENV_SNAKEMAKE_EXEC: "main"}
    from test_faults import finished_training_run

    finished_training_run(tmp_path / "results" / "train" / "gsm8k" / SPEC)
    node = subprocess.run([REPEXP, "run", "select", "--config", str(cfg), "--snakemake-jobid", "{3}", "--task",
                           "gsm8k", "--run", SPEC], capture_output=True, text=True, env=env, timeout=120)
    assert node.returncode == 0 and "selected step 2" in node.stderr, node.stderr
    records = list((tmp_path / "results" / "mlflow" / "outbox").glob("*/record.json"))
    if records:  # deferred (the usual case): uploaded by the detached sync or this one, exactly once
        assert T.sync(tmp_path / "results")[1] == []
    (child,) = [r for r in _runs(uri) if r.data.tags.get("snakemake.rule") == "select"]
    assert child.info.status == "FINISHED" and child.data.tags["snakemake.jobid"] == "3"
    assert child.data.params["job.task"] == "gsm8k" and child.data.params["job.backend"] == "trl"


def test_eval_outputs_log_one_metric_per_k_the_curve_and_the_dataset(store, tmp_path):
    cfg, uri = store
    data = tmp_path / "results" / "data" / "gsm8k"
    data.mkdir(parents=True)
    (data / "manifest.json").write_text(json.dumps({"splits": {"test": {"file": "test.parquet", "rows": 2,
                                                                       "sha256": "ab" * 32}}}))
    result = eval_result(problem_ids=["a", "b"], scores=[[1, 0, 0, 0], [1, 1, 1, 0]], answers=None,
                         metadata={"split": "test", "data_path": str(data / "test.parquet")})
    other = {k: v / 2 for k, v in result["pass_at_k"].items()}  # both graders' curves, as the runner writes them
    result |= {"grader": "repexp",
               "graders": {"repexp": {"pass_at_k": result["pass_at_k"]}, "paper": {"pass_at_k": other}}}
    path = tmp_path / "eval" / "eval.json"
    path.parent.mkdir()
    path.write_text(json.dumps(result))
    from repexp.evaluate import node_outputs

    with T.node_run("eval", "gsm8k", "base", config=cfg) as node:  # what `repexp run eval` logs
        T.log_result(node, node_outputs(json.loads(path.read_text())))
        T.log_artifacts(node, [str(path)])
    client = _client(uri)
    run = client.get_run(node.run_id)
    # one metric per evaluated k under the split, so the runs table can show pass@1 beside pass@4 (to 3 decimals:
    # eval.json's 0.4999999999999999 is 0.5 there)
    assert {k: v for k, v in run.data.metrics.items() if re.fullmatch(r"test/pass_at_\d+", k)} == {
        f"test/pass_at_{k}": round(v, 3) for k, v in result["pass_at_k"].items()}
    assert run.data.metrics["test/mean_at_n"] == result["mean_at_n"] and run.data.metrics["test/num_problems"] == 2
    assert "test/pass_at_4_sem" in run.data.metrics
    # pass@k against k: one metric per grader whose step is k, which MLflow's line chart draws as the curve
    others = [g for g in result["graders"] if g != result["grader"]]
    for name, grader in ((metric_names.pass_at_k_curve("test"), result["grader"]),
                         *((metric_names.pass_at_k_curve("test", g), g) for g in others)):
        history = sorted((m.step, m.value) for m in client.get_metric_history(node.run_id, name))
        assert history == [(int(k), pytest.approx(v)) for k, v in result["graders"][grader]["pass_at_k"].items()]
    assert sorted(a.path for a in client.list_artifacts(node.run_id)) == ["eval.json", "test"]
    local = client.download_artifacts(node.run_id, "test/pass_at_k_curve.json", str(tmp_path / "dl"))
    table = json.loads(Path(local).read_text())  # MLflow's table format (pandas "split")
    curve = dict(zip(table["columns"], zip(*table["data"])))
    assert list(curve["k"]) == [1, 2, 3, 4]  # every k, not only the evaluated powers of two
    assert curve["pass_at_k"][0] == pytest.approx(result["pass_at_k"]["1"])
    assert curve["pass_at_k"][3] == pytest.approx(result["pass_at_k"]["4"])
    (dataset,) = run.inputs.dataset_inputs
    assert dataset.dataset.name == "gsm8k/test" and dataset.dataset.digest == "ab" * 8
    assert {t.key: t.value for t in dataset.tags} == {"mlflow.data.context": "evaluation"}


def test_mlflow_shows_values_to_three_decimals_while_the_files_and_trainer_curves_keep_every_digit(
        store, tmp_path, monkeypatch):
    """Issue 39, item 3: MLflow's runs table prints a metric as JavaScript prints the float (0.6666666666666666)
    and has no setting for its digits, so what repexp logs for reading there (a stage's metrics and curves,
    the sweep points' parent metrics, also when replayed from the outbox) is rounded to 3 decimals; eval.json keeps
    every digit, and a trainer's curve replayed from metrics.jsonl keeps the digits its trainer logged live with."""
    from repexp import config as C
    from repexp.evaluate import node_outputs
    from repexp.tracking.store import DISPLAY_DECIMALS, display_value

    cfg, uri = store
    assert DISPLAY_DECIMALS == 3 and display_value(2 / 3) == 0.667 and display_value(float("nan")) != 0.0
    result = eval_result(problem_ids=["a", "b", "c"], scores=[[1, 0, 0], [0, 0, 0], [1, 1, 0]], answers=None,
                         metadata={"split": "test"})
    assert result["pass_at_k"]["1"] == pytest.approx(1 / 3) and result["pass_at_k"]["1"] != 0.333  # the file's
    with T.node_run("eval", "gsm8k", "base", config=cfg) as node:  # what `repexp run eval` logs
        T.log_result(node, node_outputs(result))
        # a trainer's curve (the train node's fill from metrics.jsonl) and a parent's metric (aggregate's)
        node.fill_metric_rows([["reward/verifier/mean", 1 / 7, 1, 0]])
        point = C.find_run(C.load(cfg), "gsm8k", SPEC)
        node.log_parent_metrics(T.scope_for("gsm8k", point), [["test/pass_at_1", 2 / 3, 0, 0]])
    client = _client(uri)
    run = client.get_run(node.run_id)
    logged = node_outputs(result).metrics
    assert run.data.metrics["test/pass_at_1"] == 0.333 and run.data.metrics["test/pass_at_2"] == 0.556  # 5/9
    assert {k: v for k, v in run.data.metrics.items() if k in logged} == {k: round(v, 3) for k, v in logged.items()}
    for key, value in run.data.metrics.items():  # what the runs table prints: at most 3 decimals
        if key in logged:
            assert len(repr(value).split(".")[1]) <= 3, (key, value)
    history = client.get_metric_history(node.run_id, metric_names.pass_at_k_curve("test"))
    curve = sorted((m.step, m.value) for m in history)
    assert curve == [(int(k), round(v, 3)) for k, v in result["pass_at_k"].items()] and curve[0] == (1, 0.333)
    assert run.data.metrics["reward/verifier/mean"] == 1 / 7  # the trainer's digits
    (parent,) = [r for r in _runs(uri) if r.data.tags.get(T.PARENT_KEY_TAG) == f"point:gsm8k/{SPEC}"]
    assert parent.data.metrics["test/pass_at_1"] == 0.667
    # the same through the outbox: a record kept while the store was unreachable uploads rounded values too
    offline_cfg = _config(tmp_path, tracking_uri=f"http://127.0.0.1:{_closed_port()}")
    with T.node_run("eval", "gsm8k", "base", config=offline_cfg) as offline:
        T.log_result(offline, node_outputs(result))
        offline.fill_metric_rows([["reward/verifier/mean", 1 / 7, 1, 0]])
    assert offline.run_id is None
    uploaded, failed = T.sync(tmp_path / "results", tracking_uri=uri)
    assert uploaded == 1 and not failed
    (synced,) = [r for r in _runs(uri) if r.data.tags.get("repexp.synced_from_outbox") == "true"]
    assert synced.data.metrics["test/pass_at_1"] == 0.333 and synced.data.metrics["reward/verifier/mean"] == 1 / 7


def test_select_and_testtime_results_carry_pass_at_k_against_k(tmp_path):
    """Issue 39: the select node logs the selected checkpoint's dev pass@k at step = k, the testtime node both
    orders' pass@k at step = k (MLflow's line chart of each is the curve against k)."""
    from repexp import checkpoints
    from repexp.metrics import testtime_curves

    run_dir = tmp_path / "run"
    history = [{"step": 0, "dev/pass_at_1": 0.1, "dev/pass_at_2": 0.2, "dev/pass_at_4": 0.3},
               {"step": 2, "dev/pass_at_1": 0.4, "dev/pass_at_2": 0.5, "dev/pass_at_4": 0.6}]
    checkpoint = run_dir / "checkpoints" / "global_step_2"
    checkpoint.mkdir(parents=True)
    (run_dir / "best_dev.json").write_text(json.dumps({"best_step": 2, "best_value": 0.4, "history": history}))
    curves = checkpoints._selected_dev_curve(run_dir, 2)
    assert curves == {metric_names.pass_at_k_curve("dev"): {1: 0.4, 2: 0.5, 4: 0.6}}
    assert checkpoints._selected_dev_curve(run_dir, 7) == {}  # no dev evaluation of that step: nothing
    result = {"k": [1, 2, 3], "pass_at_k_repexp": [0.2, 0.5, 0.6], "pass_at_k_random": [0.1, 0.3, 0.6]}
    assert testtime_curves(result) == {"testtime/pass_at_k_repexp": {1: 0.2, 2: 0.5, 3: 0.6},
                                       "testtime/pass_at_k_random": {1: 0.1, 2: 0.3, 3: 0.6}}


def test_train_and_eval_nodes_log_mlflow_system_metrics(store, monkeypatch):
    cfg, uri = store
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    with T.node_run("eval", "gsm8k", "base", config=cfg) as node:
        deadline = time.monotonic() + 60
        while not _client(uri).get_run(node.run_id).data.metrics and time.monotonic() < deadline:
            time.sleep(0.2)
    metrics = _client(uri).get_run(node.run_id).data.metrics
    assert "system/cpu_utilization_percentage" in metrics and "system/system_memory_usage_megabytes" in metrics
    with T.node_run("select", "gsm8k", "base", config=cfg) as other:  # short nodes: none
        time.sleep(0.5)
    assert not _client(uri).get_run(other.run_id).data.metrics
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")  # MLflow's own switch turns them off
    assert not T.prepare_node("train", "gsm8k", SPEC, config=cfg).system_metrics


def test_tracking_uri_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert T.resolve_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert T.resolve_tracking_uri(tmp_path) == "http://mlflow.example:5000"
    assert T.resolve_tracking_uri(tmp_path, "http://configured:1") == "http://configured:1"
    cfg = _config(tmp_path)
    out = subprocess.run([REPEXP, "mlflow", "uri", "--config", str(cfg)], capture_output=True, text=True,
                         env={**os.environ, "MLFLOW_TRACKING_URI": ""})
    assert out.stdout.strip() == T.default_tracking_uri(tmp_path / "results")


def test_a_trainer_finds_its_node_run_once_it_is_open(store, tmp_path, monkeypatch):
    """`repexp run train` starts the trainer first and opens the node run meanwhile (no MLflow wait)."""
    from repexp.trl.runlog import MlflowSink

    cfg, uri = store
    run_file = tmp_path / "mlflow_run.json"
    monkeypatch.setenv(T.ENV_RUN_FILE, str(run_file))
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    run_file.write_text("{}")  # a previous attempt's file is never read
    node = T.prepare_node("train", "gsm8k", SPEC, config=cfg)
    sink = MlflowSink()  # the trainer starts before the run exists
    assert sink.enabled and sink.run_id is None
    opener = T.open_in_background(node, run_file)
    sink.log({"step": 1, "reward/verifier/mean": 0.5}, 1)  # waits for the run, then logs into it
    opener.join()
    node.end("FINISHED")
    assert sink.run_id == node.run_id and sink.enabled
    assert _client(uri).get_run(node.run_id).data.metrics == {"reward/verifier/mean": 0.5}

    # the store refused the run: the trainer learns it and keeps its curves in metrics.jsonl only
    offline = T.prepare_node("train", "gsm8k", SPEC, config=_config(tmp_path, tracking_uri=f"http://127.0.0.1:{_closed_port()}"))
    T.open_in_background(offline, run_file).join()
    with pytest.warns(RuntimeWarning, match="node's MLflow run is not available"):
        late = MlflowSink()
        late.log({"step": 1, "x": 1.0}, 1)
    assert not late.enabled
    assert T.await_node_run()["run_id"] is None


KILLED_NODE = """
import os, signal, sys
from repexp import tracking as T

node = T.prepare_node("train", "gsm8k", sys.argv[2], config=sys.argv[1], attempt=1).start()
assert node.online, node.offline_reason
print(node.run_id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or a lost node does: no handler runs
"""


def test_a_rerun_ends_the_run_a_killed_execution_left_running(store):
    """Reproduces the orphaned RUNNING run of a SIGKILLed job; the next execution of the node ends it."""
    cfg, uri = store
    killed = subprocess.run([sys.executable, "-c", KILLED_NODE, str(cfg), SPEC], capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == -9, killed.stderr
    orphan_id = killed.stdout.split()[0]
    client = _client(uri)
    assert client.get_run(orphan_id).info.status == "RUNNING"  # what the fault leaves behind
    with T.node_run("train", "gsm8k", SPEC, config=cfg, attempt=1) as rerun:  # same attempt number, as after --unlock
        pass
    orphan, new = client.get_run(orphan_id), client.get_run(rerun.run_id)
    assert orphan.info.status == "KILLED" and new.info.status == "FINISHED"
    assert orphan.data.tags[T.SUPERSEDED_TAG] == rerun.run_id
    assert "no end was recorded" in orphan.data.tags["repexp.error"]
    # attempts stay distinguishable although both say snakemake.attempt=1
    assert (orphan.data.tags[T.EXECUTION_TAG], new.data.tags[T.EXECUTION_TAG]) == ("1", "2")
    assert new.info.run_name == f"train gsm8k/{SPEC} #2"
    # other sweep points' and other rules' runs are never touched
    with T.node_run("eval", "gsm8k", SPEC, config=cfg) as other:
        assert other.record.tags[T.EXECUTION_TAG] == "1"


def test_two_results_dirs_with_one_config_name_never_share_parents(tmp_path, monkeypatch, empty_db):
    """Reproduces issue 20's fault 5: one store (as a server is), one experiment name, two results dirs."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = _new_store(tmp_path / "shared", empty_db)
    configs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        configs.append(_config(tmp_path / name, tracking_uri=uri))
    parents, nodes = [], []
    for cfg, value in zip(configs, (0.25, 0.75)):
        assert cli.main(["mlflow", "parents", "--config", str(cfg)]) == 0  # as the workflow does at its start
        with T.node_run("eval", "gsm8k", SPEC, config=cfg) as node:
            pass
        nodes.append(node)
        parents.append(node.record.parent_run_id)
        cfg.write_text(yaml.safe_dump({**yaml.safe_load(cfg.read_text()), "testtime": {"enabled": False}}))
        for run in (SPEC, "trl_grpo_s42", "base"):  # every run of the sweep, where the aggregate job reads it
            evals = cfg.parent / "results" / "eval" / "gsm8k" / run
            evals.mkdir(parents=True)
            (evals / "eval.json").write_text(json.dumps(eval_result(
                problem_ids=["p"], scores=[[1, 0, 0, 0]] if value < 0.5 else [[1, 1, 1, 0]], answers=None)))
        assert cli.main(["run", "aggregate", "--config", str(cfg)]) == 0
    assert parents[0] != parents[1]
    client = _client(uri)
    for parent_id, value in zip(parents, (0.25, 0.75)):
        assert client.get_run(parent_id).data.metrics["test/pass_at_1"] == pytest.approx(value)  # neither overwrote
    point_parents = [r for r in _runs(uri) if r.data.tags.get(T.PARENT_KEY_TAG) == f"point:gsm8k/{SPEC}"]
    assert len(point_parents) == 2 and {r.data.tags[T.RESULTS_ID_TAG] for r in point_parents} == {
        T.results_id(tmp_path / "a" / "results"), T.results_id(tmp_path / "b" / "results")}


def test_git_tags_come_from_an_mlflow_context_provider(store):
    from repexp.tracking.context import GitContext, resolve_run_tags

    pyproject = (T.REPO_ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points."mlflow.run_context_provider"]' in pyproject
    assert 'repexp = "repexp.tracking.context:GitContext"' in pyproject
    if not (T.REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: no commit to tag")
    commit = subprocess.run(["git", "-C", str(T.REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    provider = GitContext()
    assert provider.in_context() and provider.tags()["mlflow.source.git.commit"] == commit
    tags = resolve_run_tags({"mine": "1"})
    assert tags["git.commit"] == commit and tags["mine"] == "1" and tags["mlflow.user"]


# --------------------------------------------------------------------------- the MLflow UI

INSTALL_BROWSER = T.REPO_ROOT / "workflow" / "scripts" / "install_browser.sh"
# Where the UI screenshot is copied for people to look at (docs/tracking.md, "Browsing the runs")
ARTIFACTS_ENV = "REPEXP_TEST_ARTIFACTS"
ARTIFACTS_DEFAULT = T.REPO_ROOT / "test-artifacts"
UI_SCREENSHOT = "mlflow_ui_eval_runs_by_pass_at_n.png"


def _browser() -> tuple[str, str]:
    """chromium and chromedriver (Debian's packages), installed with install_browser.sh when missing;
    the test skips, saying why, only where that cannot be done."""
    found = shutil.which("chromium"), shutil.which("chromedriver")
    if all(found):
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium/chromium-driver are missing and this is not root with apt-get to install them")
    proc = subprocess.run(["bash", str(INSTALL_BROWSER)], capture_output=True, text=True, timeout=1800)
    found = shutil.which("chromium"), shutil.which("chromedriver")
    if not all(found):
        pytest.skip(f"{INSTALL_BROWSER.name} could not install chromium (exit {proc.returncode}): "
                    + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:]))
    return found


def _ui_table(driver, columns: dict[str, str]) -> tuple[list[str], list[dict]]:
    """What the runs table shows once loaded, without a click: the column ids of its header in
    screen order, and its rows top to bottom as {name: cell text} for `columns` ({name: col-id})."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    cells = [f".ag-center-cols-container [role='gridcell'][col-id='{col}']" for col in columns.values()]
    WebDriverWait(driver, 120).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ag-pinned-left-cols-container [role='row']")) >= 3
        and all(d.find_elements(By.CSS_SELECTOR, cell) for cell in cells))
    headers = [h for h in driver.find_elements(By.CSS_SELECTOR, "[role='columnheader'][col-id]") if h.is_displayed()]
    # the grid positions its columns absolutely: the screen order is aria-colindex, not the DOM's
    order = [h.get_attribute("col-id") for h in sorted(headers, key=lambda h: int(h.get_attribute("aria-colindex")))]
    rows = {}
    for row in driver.find_elements(By.CSS_SELECTOR, ".ag-pinned-left-cols-container [role='row']"):
        name = row.find_element(By.CSS_SELECTOR, "[col-id='attributes.`Run Name`']").text.splitlines()[-1]
        rows[int(row.get_attribute("row-index"))] = {"name": name}
    for row in driver.find_elements(By.CSS_SELECTOR, ".ag-center-cols-container [role='row']"):
        shown = {c.get_attribute("col-id"): c for c in row.find_elements(By.CSS_SELECTOR, "[role='gridcell']")}
        rows[int(row.get_attribute("row-index"))].update(
            {name: shown[col].text if col in shown and shown[col].is_displayed() else None
             for name, col in columns.items()})
    return order, [rows[i] for i in sorted(rows)]


def _chart_series(driver, metric: str) -> list[dict]:
    """The series the chart view draws in its chart of `metric` (the card titled so), as Plotly holds them:
    [{name, x, y, color}], waiting until it is drawn."""
    from selenium.webdriver.support.ui import WebDriverWait

    script = """
      const cards = [...document.querySelectorAll('.js-plotly-plot')].filter(plot => {
        let node = plot;
        for (let i = 0; i < 12 && node; i++, node = node.parentElement) {
          const leaves = [...node.querySelectorAll('*')].filter(e => e.children.length === 0);
          if (leaves.some(e => e.textContent === arguments[0])) return true;
        }
        return false;
      });
      if (cards.length === 0) return null;
      return (cards[0].data || []).map(t => ({name: t.name || '', x: Array.from(t.x || []), y: Array.from(t.y || []),
                                               color: (t.line && t.line.color) || (t.marker && t.marker.color) || ''}));
    """
    return WebDriverWait(driver, 120).until(lambda d: d.execute_script(script, metric) or None)


def _browser_driver(chromium: str, chromedriver: str, size: str, login: dict):
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", f"--window-size={size}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(chromedriver), options=options)
    # the server requires the results directory's login (issue 27, item 5): the browser sends it on every request,
    # as a user's browser does once the login prompt was answered
    import base64

    basic = "Basic " + base64.b64encode(f"{login['username']}:{login['password']}".encode()).decode()
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": basic}})
    driver.implicitly_wait(5)
    return driver


def _keep_screenshot(driver, tmp_path: Path, name: str) -> None:
    screenshot = tmp_path / name
    driver.save_screenshot(str(screenshot))
    kept = Path(os.environ.get(ARTIFACTS_ENV) or ARTIFACTS_DEFAULT)
    kept.mkdir(parents=True, exist_ok=True)
    shutil.copy(screenshot, kept / name)


@pytest.mark.slow
def test_repexp_mlflow_ui_opens_the_eval_runs_by_pass_at_n_with_their_params(tmp_path_factory, tmp_path):
    """Issues 25 (item 1) and 39 (items 1, 3, 5): after the README's run, the link `repexp mlflow ui` prints opens,
    in a fresh headless Chromium at 1440×900 (no local storage: nothing of an earlier visit), the chart view of its
    three eval runs (base, GRPO, RepExp) with pass@k against k first: one line per eval run, its points (k, pass@k)
    those of its eval.json (to 3 decimals), each run in its method's colour, and no MLflow Assistant panel; the
    table link it names shows the runs sorted by test/pass_at_8, with task, method, seed, sparse_dim and β, and
    their values to 3 decimals. All on first load, with no click.

    The store is that of the README's run (configs/local.yaml, what `bash workflow/scripts/setup.sh run` runs) cut
    in size only, up to its eval runs (`_reliability_fixtures.README_SIZES`: 2 RL steps of 2 prompts × 4 rollouts
    instead of 4 steps of 2 × 8, dev 2 questions × 2 samples instead of 8 × 4, 6 test questions instead of 24): the
    same three runs (task arith; RepExp at sparse_dim 32 and β 0.01, GRPO, the base model; seed 42),
    SmolLM2-135M-Instruct, TRL and the hf engine, 8 samples per test question as shipped (k = 1, 2, 4, 8). The full
    README run takes about 10 minutes on 2 cores, too long for CI."""
    import urllib.parse

    chromium, chromedriver = _browser()
    pytest.importorskip("selenium.webdriver", reason="selenium (the dev extra) is not installed")
    import _reliability_fixtures as fx

    from repexp import config as C
    from repexp import methods
    from repexp.tracking import server, ui

    workdir = fx.readme_run(tmp_path_factory)
    results, task, config = fx.results(workdir), fx.README_TASK, str(workdir / "config.yaml")
    cfg = C.load(config)
    runs = C.sweep_runs(cfg)
    # the README's three runs, as its config names them (only sizes differ)
    assert runs == C.sweep_runs(C.load(fx.README_CONFIG))
    assert sorted(spec.name for spec in runs) == ["base", "trl_grpo_s42", "trl_repexp_k32_b0.01_s42"]
    evals = {spec.name: json.loads(L.eval_json(results, task, spec.name).read_text()) for spec in runs}
    n = max(int(k) for k in evals["base"]["pass_at_k"])
    assert n == 8  # the README's pass@1, 2, 4, 8
    # trained long enough that the trained models' curves are not the base model's (then the chart tells them apart)
    assert evals["base"]["pass_at_k"] != evals["trl_grpo_s42"]["pass_at_k"]
    metric = metric_names.pass_at_k("test", n)
    curve = metric_names.pass_at_k_curve("test")
    env = {**os.environ, "MLFLOW_TRACKING_URI": ""}
    opened = subprocess.run([REPEXP, "mlflow", "ui", "--config", config, "--host", "127.0.0.1"],
                            capture_output=True, text=True, timeout=600, env=env)
    assert opened.returncode == 0, opened.stderr[-3000:]
    url = opened.stdout.strip()
    assert f"then {metric}" in opened.stderr and "started" in opened.stderr
    assert "cannot reach" not in opened.stderr  # a UI server: no jobs on other hosts to warn about
    assert f"stop with `repexp mlflow serve --config {config} --stop`" in opened.stderr  # runnable as printed
    again = subprocess.run([REPEXP, "mlflow", "ui", "--config", config], capture_output=True, text=True,
                           timeout=600, env=env)  # a running server is reused: the same link
    assert again.returncode == 0 and again.stdout.strip() == url and "already running" in again.stderr, again.stderr
    table_url = re.search(r"as a table, by [^:]+: (\S+?)\)", opened.stderr).group(1)
    # the links carry the view's key, the "Model training" side and the view mode, no filter or sort of their own;
    # a loopback server by the name that keeps MLflow's Assistant panel shut (server.BROWSER_LOOPBACK_NAME)
    view = f"repexp-eval-{T.results_id(results)}"
    for link, mode in ((url, "CHART"), (table_url, "TABLE")):
        parts = urllib.parse.urlsplit(link)
        assert parts.hostname == server.BROWSER_LOOPBACK_NAME
        query = urllib.parse.parse_qs(parts.fragment.split("?", 1)[1])
        assert query == {"viewStateShareKey": [view], "workflowType": ["machine_learning"], "compareRunsMode": [mode]}
    params = ui.columns(cfg)  # task, method, seed, then the swept parameters of the sweep's methods
    assert params == ("task", "method", "seed", "sparse_dim", "beta")
    columns = {name: ui.column("params", name) for name in params} | {metric: ui.column("metrics", metric)}
    login = json.loads((results / "mlflow" / "credentials.json").read_text())
    driver = None
    try:
        # the chart view at a laptop's 1440×900: pass@k against k, overlaid, in the methods' colours
        driver = _browser_driver(chromium, chromedriver, "1440,900", login)
        driver.get(url)
        series = _chart_series(driver, curve)
        _keep_screenshot(driver, tmp_path, "mlflow_ui_pass_at_k_against_k.png")
        assert "MLflow Assistant" not in driver.page_source  # nothing opened by itself beside the runs
        assert ui.CURVES_SECTION in driver.page_source
        drawn = {}
        for trace in series:  # a run's line first (MLflow may add traces of it, e.g. for hovering)
            drawn.setdefault(trace["name"].split(" (")[0], trace)
        assert sorted(drawn) == sorted(f"eval {task}/{spec.name}" for spec in runs), series
        for spec in runs:
            line = drawn[f"eval {task}/{spec.name}"]
            expected = evals[spec.name]["pass_at_k"]
            assert [int(x) for x in line["x"]] == [int(k) for k in expected] == [1, 2, 4, 8]
            assert line["y"] == pytest.approx([round(v, 3) for v in expected.values()], abs=1e-12)
            # one method, one colour (MLflow may add an alpha channel to a trace's colour: #rrggbbaa)
            assert line["color"].lower()[:7] == methods.color(spec.method).lower()
        assert len({s["color"][:7] for s in series}) == len({spec.method for spec in runs}) == 3
        # the sections in order: the curves, the headline bars, then MLflow's own (e.g. "test", "System metrics")
        text = driver.find_element("css selector", "body").text
        sections = [text.index(f"\n{name}\n(") for name in (ui.CURVES_SECTION, ui.HEADLINE_SECTION, "test")]
        assert sections == sorted(sections), text[-600:]
        driver.quit()
        # the runs table, at the same 1440×900: the README's five param columns fit beside the run name
        driver = _browser_driver(chromium, chromedriver, "1440,900", login)
        driver.get(table_url)
        order, table = _ui_table(driver, columns)
        _keep_screenshot(driver, tmp_path, UI_SCREENSHOT)
        assert f"Sort: {metric}" in driver.page_source
        shown = driver.current_url  # the page writes the state it applied into its URL
        assert "/overview" not in shown and "Traces 0" not in driver.page_source  # not the GenAI overview
        state = urllib.parse.parse_qs(urllib.parse.urlsplit(shown).fragment.split("?", 1)[1])
        assert (state["searchFilter"], state["orderByKey"], state["orderByAsc"]) == (
            [f"tags.`snakemake.rule` = 'eval' AND tags.`repexp.results_id` = '{T.results_id(results)}'"],
            [f"metrics.`{metric}`"], ["false"])
    finally:
        if driver is not None:
            driver.quit()
        subprocess.run([REPEXP, "mlflow", "serve", "--config", config, "--stop"], timeout=120)
    wanted = ["attributes.`Run Name`", columns[metric], *(columns[name] for name in params)]
    assert [col for col in order if col in wanted] == wanted, order  # the view's order, left to right
    by_name = {row["name"]: row for row in table}
    assert sorted(by_name) == sorted(f"eval {task}/{spec.name}" for spec in runs)
    for spec in runs:  # a method logs its own parameters only ("-" for the others'); base: no training seed
        row = by_name[f"eval {task}/{spec.name}"]
        own = {name: C.canonical(value) for name, value in spec.params}
        expected = {"task": task, "method": spec.method, "seed": str(spec.seed) if spec.trains else "-",
                    **{name: own.get(name, "-") for name in params[3:]}}
        assert {name: row[name] for name in params} == expected, row
        # the value to 3 decimals, as printed (eval.json keeps every digit)
        assert re.fullmatch(r"\d+(\.\d{1,3})?", row[metric]), row
        assert float(row[metric]) == round(evals[spec.name]["pass_at_k"][str(n)], 3), row
    values = [float(row[metric]) for row in table]
    assert values == sorted(values, reverse=True)  # the UI's order


@pytest.mark.slow
def test_a_copied_results_directory_shows_its_artifacts(tmp_path_factory, tmp_path):
    """Issue 39, item 2: runs record their artifacts relative to the results directory (`mlflow-artifacts:`), so a
    copy of its MLflow records elsewhere, browsed by `repexp mlflow ui` there, lists and serves every artifact of a
    run over HTTP, from the copy."""
    import base64
    import urllib.request

    import _reliability_fixtures as fx

    workdir = fx.reference_run(tmp_path_factory)
    original = fx.results(workdir)
    moved = tmp_path / "elsewhere" / "results"
    shutil.copytree(original / "mlflow", moved / "mlflow",
                    ignore=shutil.ignore_patterns("server.json", "*.lock", "outbox"))
    config = yaml.safe_load((workdir / "config.yaml").read_text()) | {"results_dir": str(moved)}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (eval_run,) = [r for r in _runs(T.default_tracking_uri(moved), config["name"])
                   if r.data.tags.get("snakemake.rule") == "eval" and r.data.params.get("method") == "base"]
    assert eval_run.info.artifact_uri == f"mlflow-artifacts:/{eval_run.info.run_id}/artifacts"
    stored = moved / "mlflow" / "artifacts" / eval_run.info.run_id / "artifacts" / "eval.json"
    stored.write_text('{"copy": true}')  # what the server returns must come from the copy
    env = {**os.environ, "MLFLOW_TRACKING_URI": ""}
    opened = subprocess.run([REPEXP, "mlflow", "ui", "--config", str(tmp_path / "config.yaml"), "--host",
                             "127.0.0.1"], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    try:
        assert opened.returncode == 0 and "started" in opened.stderr, opened.stderr[-3000:]
        uri = json.loads((moved / "mlflow" / "server.json").read_text())["uri"]
        login = json.loads((moved / "mlflow" / "credentials.json").read_text())
        basic = "Basic " + base64.b64encode(f"{login['username']}:{login['password']}".encode()).decode()

        def get(path: str) -> bytes:
            request = urllib.request.Request(uri + path, headers={"Authorization": basic})
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.read()

        listed = json.loads(get(f"/ajax-api/2.0/mlflow/artifacts/list?run_id={eval_run.info.run_id}"))
        assert {f["path"] for f in listed["files"]} == {"eval.json", "test"}
        inner = json.loads(get(f"/ajax-api/2.0/mlflow/artifacts/list?run_id={eval_run.info.run_id}&path=test"))
        assert [f["path"] for f in inner["files"]] == ["test/pass_at_k_curve.json"]
        served = get(f"/get-artifact?path=eval.json&run_uuid={eval_run.info.run_id}")
        assert json.loads(served) == {"copy": True}
    finally:
        subprocess.run([REPEXP, "mlflow", "serve", "--config", str(tmp_path / "config.yaml"), "--stop"], timeout=120,
                       cwd=tmp_path)


def test_a_server_on_every_interface_allows_this_hosts_names_and_private_networks():
    """`tracking.server_host: 0.0.0.0` (the cluster default): jobs on other nodes reach the server by
    this host's name or address; MLflow refuses Host headers it does not allow."""
    import socket

    from repexp.tracking.server import BROWSER_LOOPBACK_NAME, allowed_hosts

    # loopback: MLflow's own default names and the one links use
    assert BROWSER_LOOPBACK_NAME + ":*" in allowed_hosts("127.0.0.1", "127.0.0.1").split(",")
    allowed = allowed_hosts("0.0.0.0", "10.1.2.3").split(",")
    for name in ("localhost", "127.0.0.1", socket.gethostname(), "10.1.2.3", "10.1.2.3:*", "10.*", "192.168.*"):
        assert name in allowed


def test_the_servers_sqlite_store_directory_is_private_to_its_owner(tmp_path):
    """Issue 27, item 5 (the store's file permissions): the default store's per-user directory under
    /var/tmp and the store's own directory are 0700, also when they existed with the default umask."""
    import stat

    from repexp.tracking.server import private_store_dir

    user_dir = tmp_path / "repexp-mlflow-someone"
    store_dir = user_dir / "repexp-test-abc"
    store_dir.mkdir(parents=True, mode=0o755)
    user_dir.chmod(0o755)
    assert private_store_dir(store_dir) == store_dir
    for path in (user_dir, store_dir):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
