"""Shared by tests/test_faults.py, test_slurm.py, test_tracking.py and test_workflow.py: the uninterrupted
reference run of the test config, made once per pytest session (`import _reliability_fixtures`; tests/conftest.py puts
tests/ on sys.path, so these modules share this one module and its cache); and the README's run cut in size, which
the MLflow UI test of test_tracking.py browses (`readme_run`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SNAKEMAKE = str(VENV_BIN / "snakemake")
REPEXP = str(VENV_BIN / "repexp")
TEST_CONFIG = REPO / "configs" / "test.yaml"
TEST_TASK = "gsm8k"  # configs/test.yaml

# The session's one uninterrupted local run of the test DAG (its workdir and snakemake's output), read by the
# fault, SLURM, tracking and workflow tests; made once because it is the suite's most expensive step.
_reference: dict[str, Any] = {}


def quiet_env(**extra: str) -> dict:
    """The tests' job environment: the venv first, one thread per process (2 shared cores),
    offline Hugging Face, and no MLflow settings inherited from the caller's shell."""
    env = dict(os.environ)
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID",
                "REPEXP_CONFIG", "REPEXP_TRACKING", "REPEXP_MLFLOW_RUN_FILE", "REPEXP_SNAKEMAKE_EXEC",
                "SLURM_JOB_ID", "SLURM_JOBID"):
        env.pop(key, None)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run(cmd: list[str], *, cwd: Path | None = None, env: dict | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env or quiet_env(), capture_output=True, text=True, timeout=timeout)


def isolated_config(workdir: Path, **overrides) -> Path:
    """configs/test.yaml with results_dir inside `workdir` (written there as config.yaml).

    The Snakefile resolves a relative results_dir against the repository root, not the
    Snakemake workdir, so every test run gets an absolute one of its own."""
    import yaml

    config = yaml.safe_load(TEST_CONFIG.read_text())
    config["results_dir"] = str(workdir / "results")
    for key, value in overrides.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def results(workdir: Path) -> Path:
    return workdir / "results"


def snakemake_cmd(workdir: Path, *args: str, profile: str = "local", config: Path | None = None) -> list[str]:
    """`snakemake --profile <profile> --configfile <config> --directory <workdir> ...`, run with cwd=REPO
    (where the profile symlinks live); the config defaults to `isolated_config(workdir)`."""
    config = config or workdir / "config.yaml"
    return [SNAKEMAKE, "--profile", profile, "--configfile", str(config), "--directory", str(workdir), *args]


def output_tail(proc: subprocess.CompletedProcess, chars: int = 6000) -> str:
    return (proc.stdout + "\n" + proc.stderr)[-chars:]


def reference_run(tmp_path_factory) -> Path:
    """The workdir of one uninterrupted `snakemake all --profile local --configfile configs/test.yaml` on 2 cores
    (the CI run). Shared: a test may add beside it (a report, a server's log) but never change its results."""
    if "local" not in _reference:
        workdir = tmp_path_factory.mktemp("reference_local_run")
        isolated_config(workdir)
        proc = run(snakemake_cmd(workdir, "--cores", "2", "all"), cwd=REPO, timeout=1800)
        if proc.returncode != 0:
            raise AssertionError(f"the reference local run failed (exit {proc.returncode}):\n{output_tail(proc)}")
        _reference["local"], _reference["local_proc"] = workdir, proc
    return _reference["local"]


def reference_run_output(tmp_path_factory) -> subprocess.CompletedProcess:
    """Snakemake's output of the reference run (job counts, the order it ran in)."""
    reference_run(tmp_path_factory)
    return _reference["local_proc"]


# The README's run (`bash workflow/scripts/setup.sh run`, i.e. `snakemake all --profile local --configfile
# configs/local.yaml`) up to its eval runs, cut in size only: the same sweep (task arith; RepExp at sparse_dim 32 and
# β 0.01, GRPO, the base model; seed 42), model (SmolLM2-135M-Instruct), trainer (TRL) and eval engine (hf), with 2 RL
# steps of 2 prompts × 4 rollouts instead of 4 steps of 2 × 8 (dev evaluated at steps 0 and 2 as shipped; 2 questions
# × 2 samples instead of 8 × 4), 6 test questions instead of 24, and every other setting as shipped (8 samples per
# test question: the same k = 1, 2, 4, 8). Two steps, not one: after one step the trained models still drew the base
# model's test answers (three identical curves); after two they differ from it, and GRPO's and RepExp's coincide as in
# the README's run. 6 questions, not 8: pass@8 then shows a third's rounding (0.667) in the table. The whole README
# run takes about 10 minutes on 2 cores.
README_CONFIG = REPO / "configs" / "local.yaml"
README_TASK = "arith"  # configs/local.yaml
README_SIZES = {"train": {"total_steps": 2, "n_rollouts": 4, "val_n": 2}, "data": {"limit_dev": 2, "limit_test": 6}}


def readme_run(tmp_path_factory) -> Path:
    """The workdir of the README's run cut to `README_SIZES` (its config as `config.yaml` there), made up to its eval
    runs (the views of `repexp mlflow ui` show those; test-time ordering, the tables and the figures are not made).
    Shared like the reference run."""
    if "readme" not in _reference:
        import yaml

        from repexp import config as C
        from repexp import layout as L

        workdir = tmp_path_factory.mktemp("readme_run")
        config = yaml.safe_load(README_CONFIG.read_text())
        config["results_dir"] = str(results(workdir))
        for section, sizes in README_SIZES.items():
            config[section] = {**config[section], **sizes}
        path = workdir / "config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        # the targets relative to the workdir, as Snakemake names the rules' outputs there
        targets = [str(L.eval_json(results(workdir), README_TASK, spec.name).relative_to(workdir))
                   for spec in C.sweep_runs(C.load(path))]
        proc = run(snakemake_cmd(workdir, "--cores", "2", *targets), cwd=REPO, timeout=1800)
        if proc.returncode != 0:
            raise AssertionError(f"the README run (reduced) failed (exit {proc.returncode}):\n{output_tail(proc)}")
        _reference["readme"] = workdir
    return _reference["readme"]
