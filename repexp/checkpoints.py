"""Checkpoints of a training run, shared by both trainer backends: best-dev tracking and selection
(`repexp select`), training time over all attempts, retention, and the `DONE` marker.

`best_dev.json` (in the run directory) is rewritten atomically after every validation and save, and
only ever points at a complete checkpoint, so a crash between validation and save cannot select a
missing one. Step 0 (the initial model) is in the history for comparison, never selectable.

A checkpoint is complete when its `COMPLETE` marker (written last, listing every file with its size)
exists. `repexp select` also reads each candidate back (`checkpoint_problems`), so a checkpoint
damaged after it was written (a truncated copy, a full disk) is skipped, with a warning.

`TrainingTime` counts training time over all attempts through each checkpoint's `budget.json`;
`prune_checkpoints` keeps the newest checkpoints whole and the best-dev one without resume-only files;
`prune_finished` keeps, after `DONE`, only the best-dev one (without them); `prune_when_done` applies
`train.prune_when_done` with it; `finished_training` tells a retry whose `DONE` was lost that nothing is
left to train.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from repexp import layout
from repexp import metrics as metric_names
from repexp.config import BACKENDS
from repexp.io import read_json, write_json_atomic
from repexp.layout import checkpoint_dir  # noqa: F401  (public here too: the checkpoint of a step)

SLIM_MARKER = layout.SLIM_MARKER  # a kept best-dev checkpoint without optimizer state: not resumable


def is_complete(ckpt_dir: str | Path) -> bool:
    return (Path(ckpt_dir) / layout.COMPLETE).exists()


def mark_complete(ckpt_dir: str | Path, exclude: Sequence[Path] = ()) -> None:
    """Write `COMPLETE` last: {"files": {relative path: size}} of everything in the checkpoint
    (except the files and directories in `exclude`, about to be removed)."""
    ckpt_dir = Path(ckpt_dir)
    gone = [Path(p) for p in exclude]
    files = {str(p.relative_to(ckpt_dir)): p.stat().st_size
             for p in sorted(ckpt_dir.rglob("*")) if p.is_file() and p.name != layout.COMPLETE
             and not any(p == g or g in p.parents for g in gone)}
    write_json_atomic(ckpt_dir / layout.COMPLETE, {"files": files})


SAFETENSORS_HEADER_BYTES = 8  # little-endian length of the JSON header that follows
ZIP_SUFFIXES = (".pt", ".pth", ".bin")  # torch.save's zip format


def checkpoint_problems(ckpt_dir: str | Path) -> list[str]:
    """Why a complete checkpoint cannot be loaded, read cheaply (headers and directories, no
    tensor data): [] when it looks whole. Checks the sizes listed in `COMPLETE`, every
    safetensors file's header against its size, every index's shards, every torch zip's directory."""
    ckpt_dir = Path(ckpt_dir)
    marker = (ckpt_dir / layout.COMPLETE).read_text() if is_complete(ckpt_dir) else ""
    problems, listed = [], {}
    if marker.strip().startswith("{"):  # a marker from before sizes were recorded lists nothing to compare
        try:
            listed = json.loads(marker).get("files", {})
        except ValueError:
            problems.append(f"{layout.COMPLETE}: not valid JSON")
    for rel, size in listed.items():
        path = ckpt_dir / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
        elif path.stat().st_size != size:
            problems.append(f"{rel}: {path.stat().st_size} bytes, {size} when the checkpoint was saved")
    for path in sorted(ckpt_dir.rglob("*")):
        if not path.is_file():
            continue
        why = None
        if path.suffix == ".safetensors":
            why = _safetensors_problem(path)
        elif path.name.endswith(".safetensors.index.json"):
            try:
                shards = json.loads(path.read_text()).get("weight_map", {}).values()
                missing = sorted({s for s in shards if not (path.parent / s).is_file()})
                why = f"missing shard(s) {', '.join(missing)}" if missing else None
            except ValueError:
                why = "unreadable index"
        elif path.suffix in ZIP_SUFFIXES:
            why = _zip_problem(path)
        if why:
            problems.append(f"{path.relative_to(ckpt_dir)}: {why}")
    return problems


def _safetensors_problem(path: Path) -> Optional[str]:
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(SAFETENSORS_HEADER_BYTES)
        if len(head) < SAFETENSORS_HEADER_BYTES:
            return f"{size} bytes, shorter than a safetensors header"
        header_len = int.from_bytes(head, "little")
        if header_len > size - SAFETENSORS_HEADER_BYTES:
            return f"truncated: {size} bytes, its header alone claims {header_len}"
        try:
            header = json.loads(handle.read(header_len))
        except ValueError:
            return "unreadable safetensors header"
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    expected = SAFETENSORS_HEADER_BYTES + header_len + end
    return None if expected == size else f"truncated: {size} bytes, its header describes {expected}"


def _zip_problem(path: Path) -> Optional[str]:
    with open(path, "rb") as handle:
        if handle.read(2) != b"PK":
            return None  # a legacy pickle .bin: not checked
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError) as err:
        return f"truncated or damaged torch archive ({err})"
    return None


def complete_steps(run_dir: str | Path) -> list[int]:
    return [layout.checkpoint_step(d) for d in layout.checkpoint_dirs(run_dir) if is_complete(d)]


@dataclass
class BestDevTracker:
    """Tracks dev metrics per step and the best complete checkpoint by `metric` (higher is better)."""

    run_dir: Path
    metric: str = metric_names.DEV_SELECTION
    history: list[dict] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return Path(self.run_dir) / layout.BEST_DEV

    @classmethod
    def load(cls, run_dir: str | Path, metric: str = metric_names.DEV_SELECTION) -> BestDevTracker:
        tracker = cls(Path(run_dir), metric)
        if tracker.path.exists():
            # names as logged today: a history written before dev/pass@k became dev/pass_at_k still resumes
            tracker.history = [{metric_names.metric_name(k): v for k, v in entry.items()}
                               for entry in read_json(tracker.path).get("history", [])]
        return tracker

    def record_validation(self, step: int, metrics: dict) -> None:
        if self.metric not in metrics:
            raise KeyError(f"validation metrics lack {self.metric!r}: {sorted(metrics)}")
        entry = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
        self.history = [h for h in self.history if h["step"] != int(step)] + [entry]
        self.history.sort(key=lambda h: h["step"])
        self.write()

    def ranked(self) -> list[dict]:
        """Validated steps that have a complete checkpoint, best first (ties: the earliest)."""
        saved = set(complete_steps(self.run_dir))
        return sorted((h for h in self.history if h["step"] in saved), key=lambda h: (-h[self.metric], h["step"]))

    def best(self) -> Optional[dict]:
        return next(iter(self.ranked()), None)

    def write(self) -> Optional[dict]:
        """Rewrite `best_dev.json`; returns the best entry."""
        best = self.best()
        initial = next((h for h in self.history if h["step"] == 0), None)
        write_json_atomic(self.path, {
            "metric": self.metric,
            "best_step": None if best is None else best["step"],
            "best_value": None if best is None else best[self.metric],
            "best_checkpoint": None if best is None else str(checkpoint_dir(self.run_dir, best["step"])),
            "initial_value": None if initial is None else initial[self.metric],
            "history": self.history,
        })
        return best


def write_done(run_dir: str | Path, *, backend: str, final_step: int, tracker: BestDevTracker,
               wall_time_s: float, **extra) -> dict:
    """A training run's `DONE` marker (its Snakemake output), written last by either trainer, after the
    tracker's JSON; `train_hours` is over all attempts (the final checkpoint's time record)."""
    best = tracker.write()
    budget = read_budget(checkpoint_dir(run_dir, final_step))
    done = {
        "backend": backend,
        "final_step": final_step,
        "best_step": None if best is None else best["step"],
        "best_value": None if best is None else best[tracker.metric],
        "metric": tracker.metric,
        "train_hours": None if "train_seconds" not in budget else budget["train_seconds"] / 3600,
        **extra,
        "wall_time_s": wall_time_s,
    }
    write_json_atomic(Path(run_dir) / layout.DONE, done)
    return done


# --------------------------------------------------------------------------- training time


@dataclass
class TrainingTime:
    """Training time over all attempts of one run (DONE's `train_hours`; what `repexp plan` is
    calibrated against). Each checkpoint records the time used up to its step; an attempt that
    resumes from it continues from that amount (time after the last checkpoint of a killed
    attempt is redone, so it is not counted twice)."""

    used_before_s: float = 0.0  # by the checkpoint this attempt resumed from
    started: float = field(default_factory=time.monotonic)  # this attempt's start

    @classmethod
    def resume(cls, ckpt_dir: Optional[str | Path], started: Optional[float] = None) -> TrainingTime:
        used = read_budget(ckpt_dir).get("train_seconds", 0.0)
        return cls(float(used), time.monotonic() if started is None else started)

    def save(self, ckpt_dir: str | Path) -> None:
        used = self.used_before_s + time.monotonic() - self.started
        write_json_atomic(Path(ckpt_dir) / layout.BUDGET, {"train_seconds": used})


def read_budget(ckpt_dir: Optional[str | Path]) -> dict:
    path = Path(ckpt_dir) / layout.BUDGET if ckpt_dir is not None else None
    return read_json(path) if path is not None and path.exists() else {}


def resumable_steps(run_dir: str | Path) -> list[int]:
    """Complete checkpoints that still hold their resume state (not slimmed by `prune_checkpoints`)."""
    return [step for step in complete_steps(run_dir) if not (checkpoint_dir(run_dir, step) / SLIM_MARKER).exists()]


def finished_training(run_dir: str | Path, total_steps: int, *, validated_after_save: bool) -> bool:
    """Whether a training whose `DONE` is missing had in fact finished: its final step is saved complete
    (a kill after it, or while `prune_finished` ran after `DONE`), so `DONE` is written again and nothing
    is trained. A trainer that validates after it saves (verl) also needs the final step's validation in
    `best_dev.json`; one that validates before it saves (TRL) has it whenever the checkpoint is complete."""
    if total_steps not in complete_steps(run_dir):
        return False
    return not validated_after_save or any(entry["step"] == total_steps
                                           for entry in BestDevTracker.load(run_dir).history)


def step_actions(step: int, *, test_freq: int, save_freq: int, last: bool) -> tuple[bool, bool]:
    """(validate, save) at the end of `step`: on the schedule, and always at the last step."""
    return last or step % test_freq == 0, last or step % save_freq == 0


# --------------------------------------------------------------------------- retention

def prune_checkpoints(run_dir: str | Path, keep: Optional[int], best_step: Optional[int],
                      resume_only: Sequence[str]) -> list[int]:
    """Bound the checkpoints of a run: the newest `keep` complete ones stay whole (a retry resumes
    from the newest), the best-dev one stays for `repexp select` but loses the files that only
    resuming needs (`resume_only` globs: optimizer state, RNG, data order), every other one is
    removed. `keep=None` keeps everything. Returns the removed steps."""
    if keep is None:
        return []
    removed = []
    for step in complete_steps(run_dir)[:-keep]:  # all but the newest `keep`
        if step == best_step:
            slim_checkpoint(checkpoint_dir(run_dir, step), resume_only)
        else:
            remove_checkpoint(checkpoint_dir(run_dir, step))
            removed.append(step)
    return removed


def prune_finished(run_dir: str | Path, best_step: Optional[int], resume_only: Sequence[str]) -> list[int]:
    """After a training's `DONE`: only its best-dev checkpoint stays, slimmed of `resume_only` (what
    `repexp select` and the evaluations read: weights, config, tokenizer); every other checkpoint goes.
    A finished training is never resumed (`repexp.train` moves a finished run directory aside before
    training it again). The final step goes last, and when it is the best one it is slimmed, never
    removed: a retry after a kill in here finds it complete and writes `DONE` again without training
    (`repexp.trl.train`); only a kill while a non-best final checkpoint is being removed leaves
    nothing to resume (the retry then trains again from the start). Idempotent. Returns the removed steps."""
    steps = complete_steps(run_dir)
    if best_step is None or best_step not in steps:
        return []  # nothing selectable to keep: keep everything
    slim_checkpoint(checkpoint_dir(run_dir, best_step), resume_only)
    removed = [step for step in steps if step != best_step]
    for step in removed:  # ascending: the final (newest) step last
        remove_checkpoint(checkpoint_dir(run_dir, step))
    return removed


def prune_when_done(run_dir: str | Path, done: dict, resume_only: Sequence[str], *, enabled: bool,
                    keep: Optional[int]) -> list[int]:
    """`train.prune_when_done`, both backends: right after `DONE` (`done`, as `write_done` returned it),
    `prune_finished` when the setting is on and `train.max_checkpoints_to_keep` is set (else nothing is
    removed), and says so. Returns the removed steps."""
    if not enabled or keep is None:
        return []
    removed = prune_finished(run_dir, done["best_step"], resume_only)
    print(f"repexp.{done['backend']}.train: done; kept the best-dev checkpoint (step {done['best_step']}) without "
          f"its resume state, removed step(s) {removed} (train.prune_when_done)", file=sys.stderr, flush=True)
    return removed


def slim_checkpoint(directory: Path, resume_only: Sequence[str]) -> None:
    """Drop the files only resuming reads (`resume_only` globs) from a complete checkpoint, which stays
    complete and selectable (`SLIM_MARKER`: never resumed). Safe to repeat."""
    doomed = [path for pattern in resume_only for path in directory.glob(pattern)]
    (directory / SLIM_MARKER).write_text("optimizer and resume state removed; model weights kept\n")
    # COMPLETE lists what stays before anything goes: a crash in between leaves extra files,
    # never a listed file missing (which `repexp select` would take for damage)
    mark_complete(directory, exclude=doomed)
    for path in doomed:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def remove_checkpoint(directory: Path) -> None:
    """Remove a checkpoint, its `COMPLETE` marker first: one half removed (a kill) is incomplete, never taken
    for a whole one (a retry's clean-up removes the rest)."""
    (directory / layout.COMPLETE).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def select(run_dir: str | Path, backend: str) -> dict:
    """The model pointer of a finished run: its best-dev checkpoint (errors if there is none)."""
    run_dir = Path(run_dir)
    tracker = BestDevTracker.load(run_dir)
    if not tracker.path.exists():
        raise FileNotFoundError(f"{tracker.path}: missing; did training finish?")
    ranked = tracker.ranked()
    if not ranked:
        raise ValueError(f"{tracker.path}: no validated step has a complete checkpoint")
    skipped = []
    for best in ranked:
        problems = checkpoint_problems(checkpoint_dir(run_dir, best["step"]))
        if not problems:
            break
        skipped.append({"step": best["step"], "value": best[tracker.metric], "problems": problems})
    else:
        details = "; ".join(f"step {s['step']}: {s['problems'][0]}" for s in skipped)
        raise ValueError(f"{run_dir}: every complete checkpoint is damaged ({details})")
    ckpt = checkpoint_dir(run_dir, best["step"])
    needs_merge = backend == "verl"  # a verl checkpoint is FSDP shards: `repexp merge` writes its model
    return {
        "run_dir": str(run_dir),
        "backend": backend,
        "checkpoint_step": best["step"],
        "checkpoint_dir": str(ckpt),
        "model_path": str(layout.merged_model_dir(ckpt) if needs_merge else ckpt),
        "needs_merge": needs_merge,
        "metric": tracker.metric,
        "value": best[tracker.metric],
        **({"skipped": skipped} if skipped else {}),
    }


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", required=True, type=Path, help="training run directory")
    parser.add_argument("--backend", required=True, choices=BACKENDS)
    parser.add_argument("--out", required=True, type=Path, help="model pointer JSON to write")


def run(args: argparse.Namespace) -> int:
    from repexp.jobs import SelectJob, from_args

    return run_job(from_args(SelectJob, args)).code


def run_job(job):
    """Write the model pointer of a finished run (`repexp.jobs.SelectJob`: the workflow's and `repexp select`'s);
    its node logs the pointer as `select.*` params, the best dev value at the selected step and the selected
    checkpoint's dev pass@k at step = k."""
    from repexp.stage import StageResult

    try:
        pointer = select(job.run_dir, job.backend)
    except (FileNotFoundError, ValueError) as err:
        print(f"select: {err}", file=sys.stderr)
        return StageResult(code=1)
    for skipped in pointer.get("skipped", []):
        print(f"select: warning: skipping step {skipped['step']} ({pointer['metric']} = {skipped['value']:.4f}), its "
              f"checkpoint is damaged: {'; '.join(skipped['problems'])}", file=sys.stderr)
    write_json_atomic(job.out, pointer)
    print(f"selected step {pointer['checkpoint_step']} ({pointer['metric']} = {pointer['value']:.4f})", file=sys.stderr)
    return StageResult(params={f"select.{k}": v for k, v in pointer.items() if k not in ("value", "skipped")},
                       metrics={metric_names.BEST_DEV_VALUE: pointer["value"]}, step=pointer["checkpoint_step"],
                       curves=_selected_dev_curve(job.run_dir, pointer["checkpoint_step"]))


def _selected_dev_curve(run_dir, step: int) -> dict:
    """`dev/pass_at_k` against k of the selected step's dev evaluation (best_dev.json's history), if recorded."""
    try:
        history = read_json(Path(run_dir) / layout.BEST_DEV).get("history") or []
    except (OSError, ValueError, AttributeError):
        return {}
    return next((metric_names.dev_curve(entry) for entry in history if entry.get("step") == step), {})
