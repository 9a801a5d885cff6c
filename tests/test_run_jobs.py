"""`repexp run RULE --task T [--run R]` (issue 24, item 1): the rules pass identities only and the
typed job (repexp.jobs) carries every setting, composed from the config snapshot."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml
from test_workflow import PAPER, TEST, snakemake

from repexp import cli
from repexp import config as C
from repexp import jobs as J
from repexp import layout as L

REPEXP = str(Path(sys.executable).parent / "repexp")
CONVERTED = ("preprocess", "train", "select", "merge", "eval", "testtime", "model", "download_model", "download_data",
             "aggregate", "figures")
# the one shell shape of a converted rule (common.smk, node_command): identities, the attempt, the job id, the log
# (train's behind ray_slurm.sh: nodes, GPUs per node, threads)
SHAPE = re.compile(r"(?:bash \"\$REPEXP_WORKFLOW_DIR/scripts/ray_slurm.sh\" \d+ \d+ \d+ )?"
                   r"(?:env CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=\d+ )?"
                   r"repexp run (?P<rule>\w+)(?: --task [\w-]+(?: --run \w[\w.]*)?| --alias \w+| --hub-model \S+)? "
                   r"--attempt \d+ --snakemake-jobid \{\d+\} --log (?P<log>\S+\.log) > (?P=log) 2>&1")


def shell_commands(proc: subprocess.CompletedProcess) -> dict[str, list[str]]:
    """rule -> the shell commands `snakemake -n -p` printed for its jobs (`Shell command: ...`)."""
    commands: dict[str, list[str]] = {}
    rule = None
    for line in proc.stdout.splitlines():
        if found := re.match(r"(?:local)?rule (\w+):", line):
            rule = found[1]
        elif line.startswith("Shell command: "):
            commands.setdefault(rule, []).append(line.removeprefix("Shell command: ").strip())
    return {rule: lines for rule, lines in commands.items() if rule in CONVERTED}


@pytest.mark.parametrize("configfile", [TEST, PAPER], ids=["test", "paper"])
def test_every_converted_rule_runs_one_command_shape_without_settings(configfile, tmp_path):
    proc = snakemake("all", "-n", "-p", "--profile", "local", "--configfile", str(configfile),
                     "--config", f"results_dir={tmp_path / 'results'}", workdir=tmp_path)
    commands = shell_commands(proc)
    expected = {"preprocess", "train", "select", "eval", "testtime", "aggregate", "figures"} | (
        {"merge", "download_model", "download_data"} if configfile == PAPER else {"model"})
    assert set(commands) == expected, commands.keys()
    for rule, lines in commands.items():
        for line in lines:  # (the paper's hub model is downloaded by a localrule, not passed here)
            match = SHAPE.fullmatch(line)
            assert match and match["rule"] == rule, line
            # no setting, path or model reaches the command line: the job composes them
            assert not re.search(r"\s--(?!task|run|alias|hub-model|attempt|snakemake-jobid|log)[\w-]+", line), line
    raw = yaml.safe_load(configfile.read_text())
    assert str(raw["eval"]["n_samples"]) not in " ".join(commands["eval"]).replace("s42", "")


def _config(tmp_path: Path) -> C.PipelineConfig:
    return C.load(_raw(tmp_path))


def _raw(tmp_path: Path) -> dict:
    raw = yaml.safe_load(TEST.read_text())
    raw["results_dir"] = str(tmp_path / "results")
    raw["eval"].update(temperature=0.7, top_p=0.95, kv_cache_gib=2.5, enforce_eager=True)  # not the defaults
    raw["bonus"] = {"lamb": 0.5, "center": False}
    return raw


def test_the_eval_job_carries_the_settings_the_old_flags_did(tmp_path):
    cfg = _config(tmp_path)
    for run in ("base", "trl_repexp_k8_b0.01_s42"):
        spec = C.find_run(cfg, "gsm8k", run)
        rc = C.compose(cfg, spec)
        job = J.compose(cfg, "eval", "gsm8k", run)
        assert isinstance(job, J.EvalJob) and job.task == "gsm8k" and job.run == run
        # the run's composed eval section, whole
        assert job.config == rc.eval
        ev = job.config
        assert (ev.temperature, ev.top_p, ev.kv_cache_gib, ev.enforce_eager) == (0.7, 0.95, 2.5, True)
        assert (job.seed, job.grader, ev.max_new_tokens) == (42, cfg.grader, 16)
        assert (job.overwrite, job.no_progress) == (True, True)
        # paths: the layout's, the ones the eval rule declares
        assert job.data == str(L.data_file(cfg.results_dir, "gsm8k", "test"))
        assert job.outputs() == [str(L.eval_json(cfg.results_dir, "gsm8k", run))]
        if spec.trains:
            pointer = L.train_run_dir(cfg.results_dir, "gsm8k", run) / L.SELECT
            assert (job.model, job.model_pointer) == (None, str(pointer))
        else:
            assert (job.model, job.model_pointer) == (C.resolve_model(cfg), None)
    testtime = J.compose(cfg, "testtime", "gsm8k", "base")
    assert (testtime.lamb, testtime.center, testtime.config) == (0.5, False, cfg.testtime)
    # the node's params are the job's fields
    from repexp.tracking.node import flatten

    flat = flatten({"job": dataclasses.asdict(J.compose(cfg, "eval", "gsm8k", "base"))})  # as `repexp run` logs them
    assert flat["job.config.n_samples"] == "4" and flat["job.config.temperature"] == "0.7"
    assert "job.model_pointer" not in flat


def test_the_hand_cli_builds_the_same_job(tmp_path):
    """`repexp eval` and `repexp testtime` with --config, --task and --run build the job `repexp run` composes
    (one path); without --run, the config's sections and the `--set` dotlist make the settings."""
    from repexp import evaluate, testtime
    from repexp.stage import StageResult

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(_raw(tmp_path)))
    built = []

    def stage(job, **_):
        built.append(job)
        return StageResult()

    for rule, module in (("eval", evaluate), ("testtime", testtime)):
        args = cli.command_parser(rule).parse_args(["--config", str(path), "--task", "gsm8k", "--run", "base"])
        with mock.patch.object(module, "run_job", side_effect=stage):
            assert module.run(args) == 0
        assert built[-1] == J.compose(C.load(path), rule, "gsm8k", "base")
    args = cli.command_parser("eval").parse_args(["--config", str(path), "--out", str(tmp_path / "e"), "--task",
                                                  "gsm8k", "--set", "eval.n_samples=32", "eval.ks=[1,4]",
                                                  "grader=paper"])
    with mock.patch.object(evaluate, "run_job", side_effect=stage):
        assert evaluate.run(args) == 0
    hand = built[-1]
    assert (hand.config.n_samples, hand.config.ks, hand.grader, hand.seed, hand.task) == (32, [1, 4], "paper", 0,
                                                                                           "gsm8k")
    assert hand.config.temperature == 0.7 and hand.config.max_new_tokens == 16  # the file's, resolved


def test_the_other_hand_clis_take_their_settings_from_the_config(tmp_path):
    """`repexp model` and `repexp download` build the rule's job for the config (`--out` etc. replace its
    fields); `repexp aggregate` and `repexp figures` take the grader and `tracking.*` from it."""
    from repexp import aggregate, download, figures, models

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(_raw(tmp_path)))
    cfg = C.load(path)
    cases = [(models, "run_job", ["model", "tiny"], J.compose(cfg, "model", alias="tiny")),
             (models, "run_job", ["model", "tiny", "--seed", "3", "--out", "m"],
              dataclasses.replace(J.compose(cfg, "model", alias="tiny"), seed=3, out="m")),
             (download, "run_model_job", ["download", "model", "org/name"],
              J.compose(cfg, "download_model", hub_model="org--name")),
             (download, "run_data_job", ["download", "data"], J.compose(cfg, "download_data"))]
    for module, stage, argv, expected in cases:
        args = cli.command_parser(argv[0]).parse_args([*argv[1:], "--config", str(path)])
        with mock.patch.object(module, stage, return_value=0) as ran:
            assert module.run(args) == 0
        assert ran.call_args.args[0] == expected, argv
    for module, argv in ((aggregate, ["aggregate", "--inputs", "e.json", "--out-dir", "a"]),
                         (figures, ["figures", "--table", "t.csv", "--out-dir", "f"])):
        args = cli.command_parser(argv[0]).parse_args([*argv[1:], "--set", "grader=paper", "tracking.experiment=x"])
        with mock.patch.object(module, "run_job", return_value=0) as ran:
            assert module.run(args) == 0
        job = ran.call_args.args[0]
        assert (job.experiment, job.config, getattr(job, "grader", "paper")) == ("x", None, "paper"), argv
        assert ran.call_args.args[1] is None  # no config file: no expected runs


def test_a_bad_run_or_rule_fails_naming_it(tmp_path):
    cfg = _config(tmp_path)
    with pytest.raises(C.ConfigError, match="trl_repexp_k8_b0.010_s42"):
        J.compose(cfg, "eval", "gsm8k", "trl_repexp_k8_b0.010_s42")
    with pytest.raises(C.ConfigError, match="'train_fast'"):
        J.compose(cfg, "train_fast", "gsm8k", "base")
    with pytest.raises(C.ConfigError, match="base trains nothing"):
        J.compose(cfg, "select", "gsm8k", "base")
    with pytest.raises(C.ConfigError, match="needs --run"):
        J.compose(cfg, "eval", "gsm8k")
    config = tmp_path / "config.yaml"
    config.write_text(C.dump_yaml(cfg))
    env = {**os.environ, "REPEXP_CONFIG": str(config)}
    bad_run = subprocess.run([REPEXP, "run", "eval", "--task", "gsm8k", "--run", "nonsense_s1"], env=env,
                             capture_output=True, text=True)
    assert bad_run.returncode == 2 and "nonsense_s1" in bad_run.stderr and "repexp run eval" in bad_run.stderr
    bad_rule = subprocess.run([REPEXP, "run", "frobnicate", "--task", "gsm8k"], env=env, capture_output=True, text=True)
    assert bad_rule.returncode == 2 and "'frobnicate'" in bad_rule.stderr
    assert not (tmp_path / "results").exists()  # nothing ran, no node was opened


def test_repexp_run_select_runs_the_stage_and_logs_the_job(tmp_path):
    """The whole command as the select rule runs it: the stage in its child, the node's record with the
    job's fields as params and the pointer logged (the store is unreachable: the record stays in the outbox)."""
    from test_faults import finished_training_run

    cfg = dataclasses.replace(_config(tmp_path), tracking=C.TrackingConfig(tracking_uri="http://127.0.0.1:9"))
    config = tmp_path / "config.yaml"
    config.write_text(C.dump_yaml(cfg))
    run = "trl_grpo_s42"
    run_dir = L.train_run_dir(cfg.results_dir, "gsm8k", run)
    finished_training_run(run_dir)
    env = {**os.environ, "REPEXP_CONFIG": str(config)}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([REPEXP, "run", "select", "--task", "gsm8k", "--run", run, "--attempt", "1",
                           "--snakemake-jobid", "{7}"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run_dir / L.SELECT).read_text())["checkpoint_step"] == 2
    (record,) = [json.loads(p.read_text()) for p in (Path(cfg.results_dir) / "mlflow" / "outbox").glob("*/record.json")]
    assert record["status"] == "FINISHED" and record["tags"]["snakemake.rule"] == "select"
    assert record["tags"]["repexp.command"] == f"repexp run select --task gsm8k --run {run}"
    assert record["params"]["job.backend"] == "trl" and record["params"]["job.run_dir"] == str(run_dir)
    assert record["params"]["select.checkpoint_step"] == "2"  # the outputs were logged as before
