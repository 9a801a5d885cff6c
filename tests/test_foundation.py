"""Foundation: atomic IO, best-dev checkpoint selection, the CLI dispatcher, the offline tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from repexp import checkpoints, cli
from repexp.io import atomic_path, read_json, write_json_atomic


def test_atomic_write_replaces_only_on_success(tmp_path):
    target = tmp_path / "out" / "result.json"
    write_json_atomic(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("killed mid-write")
    assert read_json(target) == {"a": 1}
    assert [p.name for p in target.parent.iterdir()] == ["result.json"]  # no temp debris


def test_atomic_directory_swap(tmp_path):
    target = tmp_path / "model"
    for payload in ("first", "second"):
        with atomic_path(target) as tmp:
            tmp.mkdir()
            (tmp / "weights").write_text(payload)
    assert (target / "weights").read_text() == "second"


def test_read_json_names_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        read_json(bad)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        read_json(tmp_path / "missing.json")


def _save(run_dir, step, complete=True):
    ckpt = checkpoints.checkpoint_dir(run_dir, step)
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")  # a valid, empty safetensors file
    if complete:
        checkpoints.mark_complete(ckpt)


def test_best_dev_never_points_at_missing_or_partial_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    tracker = checkpoints.BestDevTracker(run_dir)
    tracker.record_validation(0, {"dev/pass_at_1": 0.9})  # the base model: no checkpoint
    assert tracker.best() is None
    _save(run_dir, 10)
    tracker.record_validation(10, {"dev/pass_at_1": 0.4})
    _save(run_dir, 20, complete=False)  # killed while saving
    tracker.record_validation(20, {"dev/pass_at_1": 0.8})
    _save(run_dir, 30)
    tracker.record_validation(30, {"dev/pass_at_1": 0.6})
    best = json.loads(tracker.path.read_text())
    assert best["best_step"] == 30 and best["initial_value"] == 0.9
    pointer = checkpoints.select(run_dir, "trl")
    assert pointer["checkpoint_step"] == 30
    assert pointer["model_path"].endswith("global_step_30")
    assert checkpoints.select(run_dir, "verl")["model_path"].endswith("global_step_30/actor/hf")


def test_best_dev_ties_pick_the_earliest_step_and_reload(tmp_path):
    run_dir = tmp_path / "run"
    tracker = checkpoints.BestDevTracker(run_dir)
    for step in (5, 10):
        _save(run_dir, step)
        tracker.record_validation(step, {"dev/pass_at_1": 0.5})
    assert checkpoints.BestDevTracker.load(run_dir).best()["step"] == 5


def test_a_training_that_lost_only_its_done_is_finished_by_one_rule_for_both_trainers(tmp_path):
    """`finished_training`: the final step saved complete means finished for TRL (it validates before it
    saves); verl saves before it validates, so it also needs the final step in best_dev.json."""
    run_dir = tmp_path / "run"
    tracker = checkpoints.BestDevTracker(run_dir)
    _save(run_dir, 2)
    tracker.record_validation(2, {"dev/pass_at_1": 0.5})
    _save(run_dir, 4, complete=False)  # killed while the final checkpoint was written
    for after in (False, True):
        assert not checkpoints.finished_training(run_dir, 4, validated_after_save=after)
    checkpoints.mark_complete(checkpoints.checkpoint_dir(run_dir, 4))
    assert checkpoints.finished_training(run_dir, 4, validated_after_save=False)
    assert not checkpoints.finished_training(run_dir, 4, validated_after_save=True)  # killed before validating
    tracker.record_validation(4, {"dev/pass_at_1": 0.25})
    assert checkpoints.finished_training(run_dir, 4, validated_after_save=True)
    assert not checkpoints.finished_training(run_dir, 6, validated_after_save=False)  # more steps configured


def test_select_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="best_dev.json"):
        checkpoints.select(tmp_path, "trl")
    tracker = checkpoints.BestDevTracker(tmp_path)
    tracker.record_validation(0, {"dev/pass_at_1": 0.1})
    with pytest.raises(ValueError, match="no validated step has a complete checkpoint"):
        checkpoints.select(tmp_path, "trl")
    with pytest.raises(KeyError, match="dev/pass_at_1"):
        tracker.record_validation(5, {"dev/mean@4": 0.1})


def test_cli_lists_every_command_on_one_line_and_rejects_unknown(capsys):
    assert cli.main(["--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, (_, help_text) in cli.COMMANDS.items():
        (line,) = [line for line in lines if line.split()[:1] == [name]]
        assert line.split(None, 1)[1] == help_text  # the whole help text on the command's own line
    assert cli.main([]) == 2  # no command: the same listing, as a usage error
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)
    with pytest.raises(SystemExit):
        cli.main(["frobnicate"])


def test_every_command_and_subcommand_has_a_one_line_description():
    import argparse

    def walk(parser, path):
        assert parser.description and "\n" not in parser.description.strip(), path
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")

    for name in cli.COMMANDS:
        walk(cli.command_parser(name), f"repexp {name}")


def test_a_reader_that_goes_away_ends_the_command_without_a_traceback_and_without_success():
    """`repexp config runs C | head -1`: the pipe closes while the command still writes. The command ends
    quietly with 141 (128 + SIGPIPE, what a shell reports for such a writer), never 0: a job whose output
    went nowhere is not a success."""
    from pathlib import Path

    configs = Path(__file__).resolve().parents[1] / "configs"
    reader, writer = os.pipe()
    os.close(reader)  # gone before the command writes its first line
    proc = subprocess.run([sys.executable, "-m", "repexp", "config", "runs", str(configs / "pilot.yaml"),
                           str(configs / "overlays" / "pilot4.yaml")], stdout=writer, stderr=subprocess.PIPE,
                          text=True, timeout=120)
    os.close(writer)
    assert proc.returncode == 141 and "Traceback" not in proc.stderr, proc.stderr


def test_every_cli_module_has_the_contract():
    import importlib

    for name, (module_name, _) in cli.COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            pytest.fail(f"repexp {name}: module {module_name} missing ({err})")
        assert callable(module.configure_parser) and callable(module.run), name


def test_select_command_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    _save(run_dir, 2)
    checkpoints.BestDevTracker(run_dir).record_validation(2, {"dev/pass_at_1": 0.25})
    out = tmp_path / "select.json"
    proc = subprocess.run(
        [sys.executable, "-m", "repexp", "select", "--run-dir", str(run_dir), "--backend", "trl", "--out", str(out)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert read_json(out)["checkpoint_step"] == 2


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from repexp.models import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def test_tiny_model_is_deterministic_and_chat_ready(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from repexp.models import build_tiny_qwen2

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    cfg = model.config
    assert cfg.hidden_size // cfg.num_attention_heads >= 32  # vLLM's CPU attention needs head_dim >= 32
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    again = build_tiny_qwen2(tmp_path / "again", seed=0)
    assert (again / "model.safetensors").read_bytes() == (tiny_model / "model.safetensors").read_bytes()
    assert (again / "tokenizer.json").read_text() == (tiny_model / "tokenizer.json").read_text()


def test_gpu_shape_is_servable_by_flash_attention_3(tmp_path):
    """`repexp model tiny --shape tiny-gpu`: head_dim 64 (vLLM's FA3 rejects 32), loads and generates."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from repexp.cli import main

    out = tmp_path / "tiny-gpu"
    assert main(["model", "tiny", "--shape", "tiny-gpu", "--out", str(out)]) == 0
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.hidden_size // model.config.num_attention_heads == 64
    ids = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    generated = model.generate(**ids, max_new_tokens=4, min_new_tokens=4, do_sample=True)
    assert generated.shape[1] == ids["input_ids"].shape[1] + 4
    assert torch.isfinite(model(**ids).logits).all()
