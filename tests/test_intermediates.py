"""Missing intermediates and byte-identical rebuilds (issue 27, item 3).

The pure parts of repexp.intermediates on real files (digests, sidecars, restored times, the
pending-jobs rules on hand-built records), then the fault itself in a real Snakemake run of the
test config: intermediates deleted, a pending job that needs them, a model rebuilt byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from repexp import intermediates as I

# --------------------------------------------------------------------------- content identity


def _model(path: Path, weights: bytes = b"w" * 1000) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"a": 1}')
    (path / "model.safetensors").write_bytes(weights)
    return path


def _snakemake_touch(path: Path, mtime: float) -> None:
    """What Snakemake does after a job: a directory's time lives in its timestamp file."""
    carrier = path / I.SNAKEMAKE_TIMESTAMP if path.is_dir() else path
    carrier.touch()
    os.utime(carrier, (mtime, mtime))


def test_digest_is_the_content_not_the_times(tmp_path):
    a, b = _model(tmp_path / "a"), _model(tmp_path / "b")
    _snakemake_touch(b, 1_000_000)
    os.utime(b / "model.safetensors", (5, 5))
    assert I.content_digest(a) == I.content_digest(b)
    (b / "model.safetensors").write_bytes(b"w" * 999 + b"x")
    assert I.content_digest(a) != I.content_digest(b)
    (b / "model.safetensors").rename(b / "renamed.safetensors")
    assert I.content_digest(a) != I.content_digest(b)


def test_a_byte_identical_rebuild_gets_its_old_time_back(tmp_path):
    model = _model(tmp_path / "models" / "tiny")
    I.record_content(model)
    _snakemake_touch(model, 1_000_000.0)
    assert I.settle([model]) == []  # the first start learns the time
    assert I.read_sidecar(model)["mtime"] == 1_000_000.0

    shutil.rmtree(model)  # deleted, rebuilt byte for byte, touched by Snakemake
    _model(model)
    assert I.record_content(model)["rebuilt"] is True
    _snakemake_touch(model, 2_000_000.0)
    lines = I.settle([model])
    assert len(lines) == 1 and "same content" in lines[0] and str(model) in lines[0]
    assert I.visible_mtime(model) == 1_000_000.0
    assert I.settle([model]) == []  # once


def test_a_rebuild_with_new_content_keeps_its_new_time(tmp_path):
    model = _model(tmp_path / "m")
    I.record_content(model)
    _snakemake_touch(model, 1_000_000.0)
    I.settle([model])
    shutil.rmtree(model)
    _model(model, weights=b"v" * 1000)
    assert I.record_content(model)["rebuilt"] is False
    _snakemake_touch(model, 2_000_000.0)
    assert I.settle([model]) == []
    assert I.visible_mtime(model) == 2_000_000.0
    assert I.read_sidecar(model)["mtime"] == 2_000_000.0


def test_content_changed_after_the_rebuild_is_not_hidden(tmp_path):
    """A directory edited after its producer hashed it, and a data file, are checked again."""
    model, split = _model(tmp_path / "m"), tmp_path / "train.parquet"
    split.write_bytes(b"rows")
    for path in (model, split):
        I.record_content(path)
        _snakemake_touch(path, 1_000_000.0)
    I.settle([model, split])
    for path in (model, split):
        I.record_content(path)  # rebuilt, same bytes
        _snakemake_touch(path, 2_000_000.0)
    (model / "config.json").write_text('{"a": 2}')
    split.write_bytes(b"other rows")
    _snakemake_touch(split, 2_000_000.0)
    assert I.settle([model, split]) == []
    assert I.visible_mtime(model) == 2_000_000.0 and I.visible_mtime(split) == 2_000_000.0


def test_a_copy_without_times_or_a_touch_gets_the_recorded_time_back_and_a_real_edit_keeps_its_own(tmp_path):
    """`cp -r` (every file a new one, touched one by one) after the first workflow (no start has recorded
    a time yet), then a `touch` after a later start (one has): the content is the same, so the old time
    comes back. Snakemake's own touch of its outputs after the job is no copy."""
    import time

    original = tmp_path / "original"
    model, split = _model(original / "m"), original / "test.parquet"
    split.write_bytes(b"rows")
    for path in (model, split):
        I.record_content(path)
        _snakemake_touch(path, time.time() + 1)  # Snakemake, after the job
    assert I.settle([model, split]) == [] and I.visible_mtime(split) == I.read_sidecar(split)["mtime"]
    for path in (model, split):  # the first workflow's state again: no start has recorded a time
        I.sidecar(path).write_text(json.dumps({**I.read_sidecar(path), "mtime": None}))
    produced = {path.name: I.read_sidecar(path)["produced"] for path in (model, split)}

    copy = tmp_path / "copy"
    shutil.copytree(original, copy, copy_function=shutil.copyfile)  # new files, new times
    model, split = copy / "m", copy / "test.parquet"
    _snakemake_touch(model, time.time() + 100)
    lines = I.settle([model, split])
    assert len(lines) == 2 and all("its time changed but not its content" in line for line in lines), lines
    for path in (model, split):  # the moment it was produced: before every job made from it
        assert I.visible_mtime(path) == produced[path.name] == I.read_sidecar(path)["mtime"]
    assert I.settle([model, split]) == []  # the directory's new signature is recorded: no hashing next time

    _snakemake_touch(split, time.time() + 200)  # a `touch` once a time is recorded
    assert len(I.settle([split])) == 1 and I.visible_mtime(split) == produced[split.name]

    (model / "config.json").write_text('{"a": 2}')  # a real change keeps its new time: what is made from it reruns
    split.write_bytes(b"other rows")
    _snakemake_touch(model, 4_000_000_000.0)
    _snakemake_touch(split, 4_000_000_000.0)
    assert I.settle([model, split]) == []
    assert I.visible_mtime(model) == 4_000_000_000.0 and I.visible_mtime(split) == 4_000_000_000.0


def test_missing_outputs_and_broken_sidecars_are_skipped(tmp_path):
    gone = tmp_path / "gone"
    I.sidecar(gone).write_text("{not json")
    present = tmp_path / "present"
    present.write_bytes(b"x")
    I.sidecar(present).write_text("[]")
    assert I.settle([gone, present, tmp_path / "never"]) == []


# --------------------------------------------------------------------------- pending jobs


def _job(key, rule, outputs, *, complete=True, missing=False, propagated=False, other=False, upstream=(),
         pointer=None):
    return I.Pending(key=key, rule=rule, label=f"{rule} {key}", outputs=tuple(map(str, outputs)), complete=complete,
                     missing=missing, propagated=propagated, other=other, upstream=tuple(upstream), pointer=pointer)


def test_finished_jobs_rerun_only_for_a_deleted_intermediate_are_found(tmp_path):
    model = tmp_path / "models" / "tiny"  # deleted
    done = [tmp_path / f"DONE{i}" for i in range(3)]
    for path in done:
        path.write_text("")
    jobs = [
        _job(0, "model", [model], complete=False, missing=True),
        _job(1, "train", [done[0]], propagated=True, upstream=[0]),
        _job(2, "select", [done[1]], propagated=True, upstream=[1]),
        _job(3, "testtime", [done[2]], other=True, propagated=True, upstream=[0]),  # forced: legitimately rerun
        _job(4, "train", [tmp_path / "new" / "DONE"], complete=False, missing=True, propagated=True, upstream=[0]),
    ]
    reruns = I.needless_reruns(jobs)
    assert [job.key for job in reruns.roots] == [0]
    assert sorted(job.key for job in reruns.finished) == [1, 2]
    problems = I.check_pending(jobs, ["/venv/bin/snakemake", "all", "--cores", "2", "-R", "testtime", "eval",
                                      "--configfile", "c.yaml"], {"all"})
    assert len(problems) == 1
    assert f"missing: {model} (model 0)" in problems[0]
    assert f"snakemake {model} --cores 2 --configfile c.yaml\n" in problems[0]  # no target, no force options
    assert "2 finished job(s)" in problems[0] and "(select x1, train x1)" in problems[0]


def test_several_deleted_intermediates_are_rebuilt_one_after_the_other(tmp_path):
    """A deleted data split and a deleted select.json downstream of it: both commands, in build order."""
    done, evaluated = tmp_path / "DONE", tmp_path / "eval.json"
    for path in (done, evaluated):
        path.write_text("")
    split, pointer = tmp_path / "test.parquet", tmp_path / "select.json"
    split.write_bytes(b"rows")
    I.record_content(split)  # as `repexp data prepare` left it; its sidecar outlives it
    split.unlink()
    jobs = [_job(3, "eval", [evaluated], propagated=True, upstream=[2, 0]),
            _job(2, "select", [pointer], complete=False, missing=True, propagated=True, upstream=[1]),
            _job(1, "train", [done], propagated=True, upstream=[0]),
            _job(0, "preprocess", [split], complete=False, missing=True)]
    reruns = I.needless_reruns(jobs)
    assert [job.rule for job in reruns.roots] == ["preprocess", "select"]
    assert sorted(job.rule for job in reruns.finished) == ["eval", "train"]
    (problem,) = I.check_pending(jobs)
    assert "(one command after the other)" in problem
    assert problem.index(f"snakemake {split}") < problem.index(f"snakemake {pointer}")
    # only the split's time is set back at the next start (its sidecar); select.json has Snakemake's checksum only
    assert f"A rebuild of {split} with the same content keeps every job made from it (its time is set back" in problem
    assert f"A rebuild of {pointer} keeps the jobs made from it only where Snakemake finds it unchanged" in problem
    assert ".snakemake/metadata" in problem


def test_a_training_outdated_by_new_times_of_the_inputs_it_was_trained_on_stops_naming_the_touch(tmp_path):
    """The second guard against a copy without times: where `settle` could not put a time back (a sidecar
    from before it recorded when it was produced), finished trainings whose newer inputs still hold the
    content they were trained on stop the run with the one command that accepts them; a real change
    in content reruns them."""
    model, split = _model(tmp_path / "models" / "tiny"), tmp_path / "train.parquet"
    split.write_bytes(b"rows")
    runs = {}
    for name in ("same", "changed"):
        run_dir = tmp_path / "train" / name
        run_dir.mkdir(parents=True)
        (run_dir / "DONE").write_text("{}")
        recorded = {str(model): I.content_digest(model), str(split): I.content_digest(split)}
        if name == "changed":
            recorded[str(model)] = "0" * 64  # trained on other weights
        (run_dir / "train_node.json").write_text(json.dumps({"status": "done", "inputs": recorded}))
        runs[name] = run_dir / "DONE"
    jobs = [replace(_job(0, "train", [runs["same"]], other=True), newer=(str(model), str(split))),
            replace(_job(1, "train", [runs["changed"]], other=True), newer=(str(model),)),
            replace(_job(3, "testtime", [split], other=True), newer=(str(model),))]  # reads the same model
    (problem,) = I.check_pending(jobs, ["/venv/bin/snakemake", "all", "--cores", "2", "--configfile", "c.yaml"],
                                 {"all"})
    assert problem.startswith("train 0: finished, and would be retrained only because") and "train 1" not in problem
    assert f"{model} (sha256 {I.content_digest(model)[:12]})" in problem
    assert f"snakemake --touch {runs['same']} {split} --cores 2 --configfile c.yaml\n" in problem
    assert "(and, outdated by the same files: testtime x1)" in problem
    assert "--forcerun train" in problem


def test_reruns_with_a_real_cause_upstream_pass(tmp_path):
    """A rerun that a changed config (or --forcerun) starts upstream is the user's intent."""
    done = tmp_path / "DONE"
    done.write_text("")
    jobs = [_job(0, "preprocess", [tmp_path / "test.parquet"], complete=False, missing=True, other=True),
            _job(1, "train", [done], propagated=True, upstream=[0])]
    assert I.needless_reruns(jobs).finished == [] and I.check_pending(jobs) == []
    mixed = [_job(0, "model", [tmp_path / "m"], complete=False, missing=True),
             _job(1, "preprocess", [tmp_path / "t"], complete=False, other=True),
             _job(2, "train", [done], propagated=True, upstream=[0, 1])]
    assert I.needless_reruns(mixed).finished == []


def test_a_pointer_to_a_missing_checkpoint_is_named_with_the_way_on(tmp_path):
    run_dir = tmp_path / "train" / "gsm8k" / "trl_grpo_s42"
    run_dir.mkdir(parents=True)
    ckpt = run_dir / "checkpoints" / "global_step_2"
    pointer = run_dir / "select.json"
    pointer.write_text(json.dumps({"run_dir": str(run_dir), "backend": "trl", "checkpoint_dir": str(ckpt),
                                   "model_path": str(ckpt), "checkpoint_step": 2}))
    eval_job = _job(0, "eval", [tmp_path / "eval.json"], complete=False, other=True, pointer=str(pointer))
    problems = I.check_pending([eval_job])
    assert len(problems) == 1
    assert str(ckpt) in problems[0] and str(pointer) in problems[0] and "step 2" in problems[0]
    assert f"--forcerun {run_dir / 'DONE'}" in problems[0]
    # a select job that rewrites the pointer in this run: nothing to say
    select = _job(1, "select", [pointer], complete=False, missing=True)
    assert I.pointer_gaps([eval_job, select]) == []
    ckpt.mkdir(parents=True)
    assert I.check_pending([eval_job]) == []


def test_a_missing_merged_model_is_merged_again_when_its_checkpoint_is_there(tmp_path):
    ckpt = tmp_path / "checkpoints" / "global_step_4"
    ckpt.mkdir(parents=True)
    pointer = tmp_path / "merged.json"
    pointer.write_text(json.dumps({"backend": "verl", "checkpoint_dir": str(ckpt),
                                   "model_path": str(ckpt / "actor" / "hf"), "checkpoint_step": 4}))
    problems = I.check_pending([_job(0, "eval", [tmp_path / "e.json"], complete=False, other=True,
                                     pointer=str(pointer))])
    assert len(problems) == 1 and "merged model" in problems[0] and f"--forcerun {pointer}" in problems[0]


# --------------------------------------------------------------------------- the fault, in real Snakemake runs

import _reliability_fixtures as fx  # noqa: E402 (tests/ is on sys.path: tests/conftest.py)

from repexp import config as C  # noqa: E402

TEST_RUNS = C.sweep_runs(C.load(fx.TEST_CONFIG))  # configs/test.yaml: one trained run per method, and the base model


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A copy of the session's reference run of the test config (times and Snakemake's records kept),
    with its own results directory: this module deletes and rebuilds its intermediates."""
    reference = fx.reference_run(tmp_path_factory)
    workdir = tmp_path_factory.mktemp("intermediates")  # as deep as the reference: the same relative data path
    shutil.copytree(reference, workdir, symlinks=True, dirs_exist_ok=True)
    fx.isolated_config(workdir)
    proc = _snakemake(workdir, "all", "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr, fx.output_tail(proc)
    return workdir


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return fx.run(fx.snakemake_cmd(workdir, "--cores", "2", *args), cwd=fx.REPO, timeout=600)


def _jobs_run(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """Snakemake's job table of a run ({} when nothing was to be done)."""
    out = proc.stdout + proc.stderr
    if "Job stats:" not in out:
        return {}
    table = out.split("Job stats:", 1)[1].splitlines()[3:]
    counts = {}
    for line in table:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def _commands(message: str) -> list[list[str]]:
    """The `snakemake <file> <options>` lines the stop message gives, runnable here."""
    import shlex

    lines = [line.strip() for line in message.splitlines() if line.strip().startswith("snakemake results/")]
    return [[fx.SNAKEMAKE, *shlex.split(line)[1:]] for line in lines]


def _finished_times(workdir: Path) -> dict[str, float]:
    results = fx.results(workdir)
    return {str(path): path.stat().st_mtime for pattern in ("train/*/*/DONE", "eval/*/*/eval.json")
            for path in results.glob(pattern)}


def test_a_deleted_model_is_rebuilt_alone_and_its_byte_identical_rebuild_retrains_nothing(finished_run):
    workdir, results = finished_run, fx.results(finished_run)
    model = results / "models" / "tiny"
    before = _finished_times(workdir)
    shutil.rmtree(model)
    # nothing pending reads it: nothing to do (deleting what finished jobs were made from is allowed)
    proc = _snakemake(workdir, "all")
    assert proc.returncode == 0 and _jobs_run(proc) == {}, fx.output_tail(proc)

    # a pending job reads it (test-time ordering rerun on request): without the check, Snakemake would
    # rebuild the model and rerun both trainings, their selections and evaluations
    proc = _snakemake(workdir, "all", "--forcerun", "testtime")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, fx.output_tail(proc)
    assert "missing: results/models/tiny (model tiny)" in out and "No job was started." in out, out[-3000:]
    trained = len([spec for spec in TEST_RUNS if spec.trains])
    assert f"train x{trained}" in out and "--forcerun model" in out, out[-3000:]
    assert not model.exists() and _finished_times(workdir) == before

    (rebuild,) = _commands(out)
    proc = fx.run(rebuild, cwd=fx.REPO, timeout=600)
    assert proc.returncode == 0 and _jobs_run(proc) == {"model": 1}, fx.output_tail(proc)
    # by modification time alone the rebuilt model is newer than every training made from it
    assert I.visible_mtime(model) > max(before.values())

    proc = _snakemake(workdir, "all", "--forcerun", "testtime")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, fx.output_tail(proc)
    assert "results/models/tiny: rebuilt with the same content" in out, out[-3000:]
    ran = _jobs_run(proc)
    assert ran.get("testtime") == len(TEST_RUNS) and not {"model", "train", "select", "eval"} & set(ran), ran
    assert _finished_times(workdir) == before


def test_a_missing_checkpoint_behind_select_json_stops_before_any_job(finished_run):
    results = fx.results(finished_run)
    run_dir = results / "train" / fx.TEST_TASK / "trl_grpo_s42"
    checkpoint = Path(finished_run, json.loads((run_dir / "select.json").read_text())["checkpoint_dir"])
    aside = finished_run / "checkpoint-aside"
    before = _finished_times(finished_run)
    checkpoint.rename(aside)
    try:
        proc = _snakemake(finished_run, "all", "--forcerun", "eval")
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, fx.output_tail(proc)
        rel = checkpoint.relative_to(finished_run)
        assert f"names the checkpoint {rel}" in out and "which is missing" in out, out[-3000:]
        assert f"--forcerun {run_dir.relative_to(finished_run) / 'DONE'}" in out and "No job was started." in out
        assert _finished_times(finished_run) == before
    finally:
        aside.rename(checkpoint)


def test_deleted_data_and_select_json_are_rebuilt_in_order_and_retrain_nothing(finished_run):
    results = fx.results(finished_run)
    task = fx.TEST_TASK
    split = results / "data" / task / "test.parquet"
    pointer = results / "train" / task / "trl_grpo_s42" / "select.json"
    base_eval = f"results/eval/{task}/base/eval.json"
    split.unlink()
    pointer.unlink()
    proc = _snakemake(finished_run, "all", "--forcerun", base_eval)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "one command after the other" in out, fx.output_tail(proc)
    commands = _commands(out)
    assert [command[1] for command in commands] == [f"results/data/{task}/test.parquet",
                                                     f"results/train/{task}/trl_grpo_s42/select.json"]
    for command in commands:
        proc = fx.run(command, cwd=fx.REPO, timeout=600)
        assert proc.returncode == 0, fx.output_tail(proc)
    assert split.exists() and pointer.exists()
    proc = _snakemake(finished_run, "all", "--forcerun", base_eval, "-n")
    ran = _jobs_run(proc)
    assert proc.returncode == 0 and ran.get("eval") == 1 and not {"preprocess", "train", "select"} & set(ran), \
        fx.output_tail(proc)


def test_a_results_directory_copied_without_times_retrains_nothing(tmp_path_factory):
    """The fault-injection run's copy: a results directory moved with `cp -r` (every file touched one by
    one) right after its first workflow; here in an order that leaves the model and the data splits
    newer than every training. Before, both trainings were moved aside and retrained from scratch."""
    import time

    reference = fx.reference_run(tmp_path_factory)
    workdir = tmp_path_factory.mktemp("copied_without_times")
    shutil.copytree(reference, workdir, symlinks=True, dirs_exist_ok=True, copy_function=shutil.copyfile)
    fx.isolated_config(workdir)
    results, start = fx.results(workdir), time.time()
    for number, path in enumerate(sorted((p for p in results.rglob("*") if p.is_file()), reverse=True)):
        os.utime(path, (start + number / 100, start + number / 100))
    model = results / "models" / "tiny"
    assert I.visible_mtime(model) > max(path.stat().st_mtime for path in results.glob("train/*/*/DONE"))

    proc = _snakemake(workdir, "all", "-n")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Nothing to be done" in out, fx.output_tail(proc)
    for path in ("models/tiny", "data/gsm8k/train.parquet", "data/gsm8k/dev.parquet"):
        assert f"results/{path}: its time changed but not its content" in out, out[-3000:]
