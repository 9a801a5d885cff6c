"""The pipeline config: generated schema, shipped configs, broken configs, run names, composition."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from repexp import config as C

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
SHIPPED = [p for p in CONFIGS if p.name != "schema.yaml"]
SCHEMA = yaml.safe_load((REPO / "configs" / "schema.yaml").read_text())


def _raw(name: str) -> dict:
    return yaml.safe_load((REPO / "configs" / name).read_text())


def _schema_errors(raw: dict) -> list[tuple[str, str]]:
    """(dotted instance path, message) of everything the JSON schema rejects."""
    validator = jsonschema.Draft202012Validator(SCHEMA)
    return [(".".join(str(p) for p in err.absolute_path), err.message) for err in validator.iter_errors(raw)]


def _schema_names(errors: list[tuple[str, str]], key: str) -> bool:
    """Whether an error points at `key` (a value error there, or an unknown key named in its parent)."""
    dotted = re.sub(r"\[(\d+)\]", r".\1", key)
    parent, _, leaf = dotted.rpartition(".")
    return any(path == dotted or (path == parent and repr(leaf) in message) for path, message in errors)


def test_committed_schema_is_the_generated_one():
    assert SCHEMA == C.json_schema(), ("configs/schema.yaml is stale: run "
                                       "`repexp config schema --out configs/schema.yaml`")
    assert SCHEMA["$schema"] == jsonschema.Draft202012Validator.META_SCHEMA["$schema"]  # no Snakemake draft warning


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    raw = yaml.safe_load(path.read_text())
    assert _schema_errors(raw) == []
    cfg = C.load(path)
    assert C.sweep_runs(cfg)


def test_shipped_configs_are_the_documented_ones():
    assert {p.name for p in SHIPPED} == {"paper.yaml", "local.yaml", "test.yaml", "gpu.yaml", "pilot.yaml"}
    paper = C.load(REPO / "configs" / "paper.yaml")
    assert paper.model == "Qwen/Qwen2.5-7B-Instruct" and paper.sweep.backends == ["verl"]
    assert paper.sweep.seeds == [41, 42, 43] and paper.sweep.methods.repexp.beta == [0.01]
    assert paper.eval.n_samples == 256 and paper.eval.engine == "vllm"
    runs = {s.path for s in C.sweep_runs(paper)}
    assert "dapo-with-aime24/verl_repexp_k128_b0.01_s41" in runs and "math/verl_repexp_k32_b0.01_s43" in runs
    assert {"math/base", "gsm8k/base", "dapo-with-aime24/base", "gsm8k/verl_grpo_s42"} <= runs
    assert len(runs) == 3 * (3 * 2) + 3
    test = C.load(REPO / "configs" / "test.yaml")
    assert test.model == "tiny" and test.sweep.tasks == ["gsm8k"] and len(test.sweep.seeds) == 1
    assert {s.method for s in C.sweep_runs(test)} == set(C.METHODS)  # CI trains every method and the base model
    local = C.load(REPO / "configs" / "local.yaml")  # the README run: a real model on the built-in task
    assert local.model == "smollm2" and local.sweep.tasks == ["arith"] and local.sweep.backends == ["trl"]
    gpu = C.load(REPO / "configs" / "gpu.yaml")  # one GPU: verl, vLLM, two RepExp points + GRPO + base
    assert gpu.model == "smollm2" and gpu.sweep.backends == ["verl"] and gpu.eval.engine == "vllm"
    assert sorted(s.method for s in C.sweep_runs(gpu)) == ["base", "grpo", "repexp", "repexp"]
    assert C.rule_resources(gpu, "train").gpu == gpu.verl.n_gpus_per_node == 1


def test_paper_task_settings_follow_the_upstream_recipe():
    paper = C.load(REPO / "configs" / "paper.yaml")
    for task in ("math", "gsm8k"):
        train = C.task_section(paper, task, "train")
        assert (train.train_batch_size, train.ppo_mini_batch_size, train.micro_batch_size_per_gpu) == (1024, 256, 16)
        lengths = (train.max_prompt_length, train.max_response_length, train.test_freq, train.save_freq)
        assert lengths == (1024, 1024, 20, 20)
        assert C.task_sweep(paper, task)["repexp"].sparse_dim == [32]
    dapo = C.task_section(paper, "dapo-with-aime24", "train")
    assert (dapo.train_batch_size, dapo.ppo_mini_batch_size, dapo.micro_batch_size_per_gpu) == (512, 128, 8)
    assert (dapo.max_prompt_length, dapo.max_response_length, dapo.test_freq, dapo.save_freq) == (2048, 8192, 10, 10)
    verl = C.task_section(paper, "dapo-with-aime24", "verl")
    memory = (verl.max_num_batched_tokens, verl.gpu_memory_utilization, verl.repexp_micro_batch_size_per_gpu)
    assert memory == (10240, 0.5, 16)
    assert C.task_sweep(paper, "dapo-with-aime24")["repexp"].sparse_dim == [128]
    assert paper.data.dapo_source == "hf"


# test.yaml as a valid one-GPU verl config, for the verl cases below
VERL = {"n_gpus_per_node": 1, "rollout_tensor_parallel_size": 1, "repexp_micro_batch_size_per_gpu": 2}

# Each broken config: (patch applied to configs/test.yaml, key the error must name, schema catches it too)
BROKEN = {
    "unknown top-level key": ({"learning_rate": 1e-6}, "learning_rate", True),
    "unknown nested key": ({"train": {"lrr": 1e-6}}, "train.lrr", True),
    "wrong type": ({"train": {"lr": "fast"}}, "train.lr", True),
    "float seed": ({"sweep": {"seeds": [1.5]}}, "sweep.seeds[0]", True),
    "negative beta": ({"sweep": {"methods": {"repexp": {"beta": [-0.1]}}}}, "sweep.methods.repexp.beta[0]", True),
    "zero beta (GRPO is its own method)": ({"sweep": {"methods": {"repexp": {"beta": [0]}}}},
                                           "sweep.methods.repexp.beta[0]", True),
    "legacy sweep.betas, negative": ({"sweep": {"betas": [-0.1]}}, "sweep.methods.repexp.beta[0]", False),
    "pass@k k above n_rollouts": ({"sweep": {"methods": {"passk": {"passk_k": [3]}}}}, "sweep.methods.passk.passk_k",
                                  False),
    "unknown method": ({"sweep": {"methods": {"ppo": {}}}}, "sweep.methods.ppo", True),
    "unknown method parameter": ({"sweep": {"methods": {"passk": {"k": [2]}}}}, "sweep.methods.passk.k", True),
    "bad outcome mode": ({"sweep": {"methods": {"outcome": {"outcome_mode": ["hist"]}}}},
                         "sweep.methods.outcome.outcome_mode[0]", True),
    "two values of a parameter outside the run name": ({"sweep": {"methods": {"cov": {"cov_kl_coef": [1.0, 2.0]}}}},
                                                      "sweep.methods.cov.cov_kl_coef", False),
    "sparse_dim below 1": ({"sweep": {"methods": {"repexp": {"sparse_dim": [0]}}}},
                           "sweep.methods.repexp.sparse_dim[0]", True),
    "unknown task": ({"sweep": {"tasks": ["gsm8k", "mathh"]}}, "sweep.tasks[1]", True),
    "unknown backend": ({"sweep": {"backends": ["deepspeed"]}}, "sweep.backends[0]", True),
    "top_p above 1": ({"eval": {"top_p": 1.5}}, "eval.top_p", True),
    "bad name": ({"name": "my run"}, "name", True),
    "bool for int": ({"train": {"total_steps": True}}, "train.total_steps", True),
    "inconsistent batch sizes": ({"train": {"train_batch_size": 6, "ppo_mini_batch_size": 4}},
                                 "train.ppo_mini_batch_size", False),
    "save_freq does not divide test_freq": ({"train": {"test_freq": 4, "save_freq": 3}}, "train.save_freq", False),
    "duplicate betas": ({"sweep": {"methods": {"repexp": {"beta": [0.01, 0.010]}}}}, "sweep.methods.repexp.beta",
                        False),
    "duplicate seeds": ({"sweep": {"seeds": [1, 1]}}, "sweep.seeds", False),
    "empty tasks": ({"sweep": {"tasks": []}}, "sweep.tasks", False),
    "override of an unknown task": ({"task_overrides": {"gsm9k": {}}}, "task_overrides.gsm9k", False),
    "override with an unknown key": ({"task_overrides": {"gsm8k": {"train": {"lrr": 1}}}},
                                     "task_overrides.gsm8k.train.lrr", False),
    "override breaking batch sizes": ({"task_overrides": {"gsm8k": {"train": {"ppo_mini_batch_size": 3}}}},
                                      "task_overrides.gsm8k.train.ppo_mini_batch_size", False),
    "resources of an unknown rule": ({"resources": {"trian": {"gpu": 1}}}, "resources.trian", False),
    "resources with an unknown field": ({"resources": {"train": {"gpus": 1}}}, "resources.train.gpus", False),
    "negative runtime": ({"resources": {"eval": {"runtime": -5}}}, "resources.eval.runtime", False),
    "dapo without a DAPO source": ({"sweep": {"tasks": ["dapo-with-aime24"]}}, "data.dapo_source", False),
    "verl nodes differ from the allocation": (
        {"sweep": {"backends": ["verl"]}, "verl": {"nnodes": 2}}, "resources.train.nodes", False),
    # rules that a job used to apply only once it started (issue 17: all of them at parse time)
    "persistent covariance with a random projection": (
        {"bonus": {"persist_covariance": True}}, "bonus.persist_covariance", False),
    "persistent covariance with leave-one-out": (
        {"bonus": {"persist_covariance": True, "randomize_projection": False, "reward_type": "leave_one_out"}},
        "bonus.persist_covariance", False),
    "a loss TRL cannot compute": ({"train": {"loss_agg_mode": "seq-mean-token-sum"}}, "train.loss_agg_mode", False),
    "TRL micro-batch not dividing a mini-batch": ({"train": {"micro_batch_size_per_gpu": 3}},
                                                  "train.micro_batch_size_per_gpu", False),
    "verl rollout TP not dividing the GPUs": (
        {"sweep": {"backends": ["verl"]}, "verl": {"n_gpus_per_node": 2, "rollout_tensor_parallel_size": 4}},
        "verl.rollout_tensor_parallel_size", False),
    "verl representation micro-batch not dividing a rank's rows": (
        {"sweep": {"backends": ["verl"]}, "verl": {**VERL, "repexp_micro_batch_size_per_gpu": 3}},
        "verl.repexp_micro_batch_size_per_gpu", False),
    "a legacy verl key verl ignores": ({"sweep": {"backends": ["verl"]}, "verl": {
        **VERL, "overrides": ["reward_model.enable=true"]}}, "verl.overrides", False),
    "Ray CPUs beyond the allocation": ({"sweep": {"backends": ["verl"]}, "verl": {**VERL, "ray_num_cpus": 8}},
                                       "verl.ray_num_cpus", False),
    "a walltime margin as long as the allocation": ({"train": {"walltime_margin_minutes": 30}},
                                                    "train.walltime_margin_minutes", False),  # runtime 30 min
    "the removed wall-clock budget": ({"train": {"max_hours": 2}}, "train.max_hours", False),
    # issue 27, item 4: absurd sizes
    "a trillion samples per problem": ({"eval": {"n_samples": 10**12}}, "eval.n_samples", True),
    "a trillion dev samples": ({"train": {"val_n": 10**12}}, "train.val_n", True),
    "a shard that cannot be held in memory": ({"eval": {"n_samples": 65536, "shard_size": 1000}},
                                              "eval.shard_size", False),
    # issue 15: accepted-but-wrong configs
    "eval TP beyond the eval GPUs": ({"eval": {"engine": "vllm", "tensor_parallel_size": 2}},
                                     "eval.tensor_parallel_size", False),
    "eval TP beyond the eval GPUs of one task": (
        {"resources": {"eval": {"gpu": 1}},
         "task_overrides": {"gsm8k": {"eval": {"engine": "vllm", "tensor_parallel_size": 2}}}},
        "task_overrides.gsm8k.eval.tensor_parallel_size", False),
    "tracking URI with an unknown scheme": ({"tracking": {"tracking_uri": "htp://mlflow:5000"}},
                                            "tracking.tracking_uri", False),
    "tracking URI that is a bare path": ({"tracking": {"tracking_uri": "results/mlruns"}},
                                         "tracking.tracking_uri", False),
    "a section that is not a mapping": ({"eval": [1, 2]}, "eval", True),
    "resources of a rule that are not a mapping": ({"resources": {"train": 3}}, "resources.train", True),
    "a GPU type for a job without GPUs": ({"resources": {"select": {"gpu_model": "h100"}}},
                                          "resources.select.gpu_model", False),
    "a GPU type sbatch would misread": ({"resources": {"train": {"gpu": 1, "gpu_model": "h100:2"}}},
                                        "resources.train.gpu_model", True),
    "a node constraint with shell characters": ({"resources": {"eval": {"constraint": "h100; rm -rf ~"}}},
                                                "resources.eval.constraint", True),
    "override of a task field with the wrong type": (
        {"task_overrides": {"gsm8k": {"train": {"lr": "fast"}}}}, "task_overrides.gsm8k.train.lr", False),
}


def _deep_merge(dst: dict, src: dict) -> dict:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict) and key != "task_overrides":
            _deep_merge(dst[key], value)
        else:
            dst[key] = value
    return dst


def _patched(patch: dict) -> dict:
    return _deep_merge(copy.deepcopy(_raw("test.yaml")), patch)


@pytest.mark.parametrize("case", sorted(BROKEN), ids=lambda c: c.replace(" ", "-"))
def test_broken_config_fails_naming_the_key(case):
    patch, key, schema_catches = BROKEN[case]
    raw = _patched(patch)
    with pytest.raises(C.ConfigError) as err:
        C.load(raw)
    assert str(err.value).startswith(key + ":"), f"{case}: {err.value}"
    if schema_catches:  # Snakemake's validate() rejects it first, pointing at the same key
        errors = _schema_errors(raw)
        assert _schema_names(errors, key), f"{case}: schema errors {errors}"


def test_numbers_as_yaml_and_snakemake_pass_them_are_numbers(tmp_path):
    # PyYAML reads `1e-5` (no dot) as a string; Snakemake's --config passes nested values as strings
    raw = _patched({"train": {"lr": "1e-5", "total_steps": "3", "walltime_margin_minutes": "0.5"},
                    "sweep": {"methods": {"repexp": {"beta": ["0.01", "0.02"]}}, "seeds": ["1"]},
                    "trl": {"gradient_checkpointing": "true"}})
    cfg = C.load(raw)
    assert (cfg.train.lr, cfg.train.total_steps, cfg.train.walltime_margin_minutes) == (1e-5, 3, 0.5)
    assert cfg.sweep.methods.repexp.beta == [0.01, 0.02] and cfg.sweep.seeds == [1]
    assert cfg.trl.gradient_checkpointing is True
    path = tmp_path / "cfg.yaml"
    path.write_text("train:\n  lr: 1e-5\n  val_n: 2\n")
    assert C.read_yaml(path)["train"]["lr"] == 1e-5 and C.load(path).train.lr == 1e-5


def test_duplicate_yaml_keys_fail_naming_file_and_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("name: x\ntrain:\n  lr: 1.0e-6\n  val_n: 2\n  lr: 2.0e-6\n")
    with pytest.raises(C.ConfigError, match=rf"{re.escape(str(path))}: line 5: duplicate key 'lr' \(first at line 3\)"):
        C.load(path)
    with pytest.raises(C.ConfigError, match="duplicate key"):
        C.parse_files({}, [path])  # what the Snakefile does with the files Snakemake read


def test_dotlist_overrides(tmp_path):
    assert C.split_overrides("sweep.betas=[0.01, 0.02]  train.lr=2e-6 'name=a b'") == [
        "sweep.betas=[0.01, 0.02]", "train.lr=2e-6", "'name=a b'"]
    cfg = C.load({**_patched({}), "set": "sweep.betas=[0.03,0.04] train.lr=2e-6 eval.max_new_tokens=null"})
    assert cfg.sweep.methods.repexp.beta == [0.03, 0.04] and cfg.train.lr == 2e-6 and cfg.eval.max_new_tokens is None
    cfg = C.load(_patched({}), overrides=["task_overrides.gsm8k.train.lr=3e-6", "resources.train.gpu=2"])
    assert C.task_section(cfg, "gsm8k", "train").lr == 3e-6 and C.rule_resources(cfg, "train").gpu == 2
    for bad, key in (("sweep.betaz=[1]", "sweep.betaz"), ("train.lr=fast", "train.lr"), ("lr", "set")):
        with pytest.raises(C.ConfigError) as err:
            C.load(_patched({}), overrides=[bad] if "=" in bad else []) if "=" in bad else C.split_overrides(bad)
        assert str(err.value).startswith(key + ":"), err.value


def test_local_paths_must_exist_and_hub_ids_are_recognised(tmp_path):
    cfg = C.load(_patched({}))
    C.check_paths(cfg, REPO)
    assert C.model_kind("Qwen/Qwen2.5-7B-Instruct", REPO) == "hub" and C.model_kind("gpt2", REPO) == "hub"
    assert C.model_kind("tiny", REPO) == "alias"
    for value in ("/abs/missing", "./rel", "results/models/x", "a/b/c", "~/models/x"):
        assert C.model_kind(value, REPO) == "local", value
    model = tmp_path / "model"
    for value, message in ((str(model), "does not exist"), ("results/models/qwen", "does not exist")):
        with pytest.raises(C.ConfigError, match=f"^model: .*{message}"):
            C.check_paths(dataclasses.replace(cfg, model=value), REPO)
    model.mkdir()
    with pytest.raises(C.ConfigError, match="^model: .*has no config.json"):
        C.check_paths(dataclasses.replace(cfg, model=str(model)), REPO)
    (model / "config.json").write_text("{}")
    C.check_paths(dataclasses.replace(cfg, model=str(model)), REPO)
    bad = dataclasses.replace(cfg, bonus=dataclasses.replace(cfg.bonus, representation_model="org/../x"))
    with pytest.raises(C.ConfigError, match="^bonus.representation_model: "):
        C.check_paths(bad, REPO)
    with pytest.raises(C.ConfigError, match="^data.source: "):
        C.check_paths(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source=str(tmp_path / "nodata"))),
                      REPO)


def test_config_file_errors_name_the_file(tmp_path):
    with pytest.raises(C.ConfigError, match="not found"):
        C.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sweep: [unclosed\n")
    with pytest.raises(C.ConfigError, match="bad.yaml: invalid YAML"):
        C.load(bad)


# --------------------------------------------------------------------------- run names


@pytest.mark.parametrize("value, text", [
    (0.01, "0.01"), (0.010, "0.01"), (1e-5, "0.00001"), (0.1 + 0.2, "0.30000000000000004"), (32, "32"),
    (1.0, "1"), (np.float64(0.01), "0.01"), (np.int64(7), "7"), (np.float32(0.5), "0.5"),
])
def test_canonical_is_the_shortest_round_trip(value, text):
    assert C.canonical(value) == text
    assert float(text) == float(value)


@settings(max_examples=200, deadline=None)
@given(
    task=st.sampled_from(C.TASKS),
    backend=st.sampled_from(C.BACKENDS),
    k=st.integers(1, 4096),
    beta=st.floats(min_value=1e-9, max_value=1e3, allow_nan=False, allow_infinity=False),
    seed=st.integers(0, 10**6),
)
def test_run_names_round_trip(task, backend, k, beta, seed):
    repexp = C.RunSpec.of(task, "repexp", backend, seed, sparse_dim=k, beta=beta)
    others = [C.RunSpec.of(task, m, backend, seed) for m in C.METHODS if m not in ("repexp", "base")]
    for spec in (repexp, *others, C.RunSpec(task, "base")):
        assert C.parse_run(task, spec.name) == spec  # results directories named by hand (repexp aggregate)
        assert re.fullmatch(C.run_pattern([spec]), spec.name)  # the Snakemake wildcard accepts it
    assert C.parse_run(task, repexp.name).beta == beta  # exact float round trip
    # numpy scalars (e.g. from a Paramspace) name the same run
    numpy_spec = C.RunSpec.of(task, "repexp", backend, np.int64(seed), sparse_dim=np.int64(k), beta=np.float64(beta))
    assert numpy_spec.name == repexp.name


@pytest.mark.parametrize("name", [
    "trl_repexp_k32_b0.010_s42", "trl_repexp_k32_b1e-05_s42", "trl_repexp_k032_b0.01_s42",
    "trl_repexp_k32_b0.01_s042", "trl_grpo_s42_extra", "deepspeed_grpo_s1", "base2",
])
def test_parse_run_rejects_non_canonical_or_unknown_names(name):
    with pytest.raises(C.ConfigError, match="run:"):
        C.parse_run("gsm8k", name)


def test_runs_are_looked_up_among_the_configs_runs_and_the_wildcard_matches_exactly_them():
    cfg = C.load(_patched({"sweep": {"methods": {"repexp": {"beta": [0.01, 0.5]}}}}))
    runs = C.sweep_runs(cfg)
    assert [C.find_run(cfg, spec.task, spec.name) for spec in runs] == runs
    for name in ("trl_repexp_k8_b0.010_s42", "trl_repexp_k8_b0.2_s42", "trl_grpo_s7", "base2"):
        with pytest.raises(C.ConfigError, match=rf"run: gsm8k/{re.escape(name)} is not a run of this config"):
            C.find_run(cfg, "gsm8k", name)
    pattern, trained = C.run_pattern(runs), C.run_pattern(s for s in runs if s.trains)
    assert all(re.fullmatch(pattern, s.name) for s in runs)
    assert not re.fullmatch(pattern, "trl_repexp_k8_b0.010_s42") and not re.fullmatch(pattern, "trl_repexp_k8_b0")
    assert re.fullmatch(trained, "trl_grpo_s42") and not re.fullmatch(trained, "base")
    assert C.run_pattern([]) == "(?!)"
    assert all(re.fullmatch(C.TASK_PATTERN, t) for t in C.TASKS) and not re.fullmatch(C.TASK_PATTERN, "gsm8k/base")


def test_duplicate_spellings_collapse_to_one_run():
    raw = _patched({"sweep": {"methods": {"repexp": {"beta": [0.01, 0.1]}}}})
    runs = [s.name for s in C.sweep_runs(C.load(raw))]
    assert len(runs) == len(set(runs))
    assert "trl_repexp_k8_b0.01_s42" in runs and "trl_repexp_k8_b0.1_s42" in runs


# --------------------------------------------------------------------------- composition


def test_compose_applies_task_overrides_and_wildcards():
    paper = C.load(REPO / "configs" / "paper.yaml")
    rc = C.compose(paper, C.parse_run("dapo-with-aime24", "verl_repexp_k128_b0.01_s43"))
    assert (rc.sparse_dim, rc.beta, rc.seed, rc.backend, rc.method) == (128, 0.01, 43, "verl", "repexp")
    assert rc.train.train_batch_size == 512 and rc.train.max_response_length == 8192
    assert rc.eval.max_new_tokens == 8192  # null -> the task's response length
    assert rc.verl.max_num_batched_tokens == 10240
    assert rc.run_dir == "results/train/dapo-with-aime24/verl_repexp_k128_b0.01_s43"
    math = C.compose(paper, C.parse_run("math", "verl_grpo_s41"))
    assert math.train.train_batch_size == 1024 and math.beta == 0.0 and math.eval.max_new_tokens == 1024
    base = C.compose(paper, C.parse_run("gsm8k", "base"))
    assert base.seed == 41 and base.model == "Qwen/Qwen2.5-7B-Instruct"
    # the composed config survives a YAML round trip (job.yaml) with plain Python types
    again = C.RunConfig.from_dict(yaml.safe_load(C.dump_yaml(rc)))
    assert again == rc


def test_compose_rejects_runs_outside_the_config():
    paper = C.load(REPO / "configs" / "paper.yaml")
    with pytest.raises(C.ConfigError, match="sweep.tasks"):
        C.compose(paper, C.parse_run("aime24", "base"))


def test_training_hash_tracks_exactly_what_training_depends_on():
    raw = _raw("paper.yaml")
    spec = C.parse_run("gsm8k", "verl_repexp_k32_b0.01_s42")
    base_hash = C.training_hash(C.compose(C.load(raw), spec))

    def hash_with(patch):
        changed = copy.deepcopy(raw)
        for dotted, value in patch.items():
            *parents, leaf = dotted.split(".")
            node = changed
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return C.training_hash(C.compose(C.load(changed), spec))

    assert hash_with({"eval.n_samples": 64}) == base_hash  # eval settings: no retraining
    assert hash_with({"resources.train.runtime": 1000}) == base_hash  # scheduler settings: none
    assert hash_with({"tracking.experiment": "other"}) == base_hash
    assert hash_with({"task_overrides.math.train.lr": 3e-6}) == base_hash  # another task: none
    assert hash_with({"train.lr": 3e-6}) != base_hash
    assert hash_with({"task_overrides.gsm8k.train.lr": 3e-6}) != base_hash
    assert hash_with({"bonus.lamb": 0.1}) != base_hash
    # issue 15: what does not change this run's training
    assert hash_with({"trl.eval_batch_size": 4}) == base_hash  # the other backend
    assert hash_with({"verl.ray_num_cpus": 32}) == base_hash  # where it runs
    assert hash_with({"train.max_checkpoints_to_keep": 3}) == base_hash  # retention
    assert hash_with({"train.walltime_margin_minutes": 30}) == base_hash  # where a chunk ends, not what is trained


@pytest.mark.parametrize("backend", ["trl", "verl"])
def test_training_hash_covers_the_runs_own_backend_and_method(backend):
    raw = _patched({"sweep": {"backends": [backend]}, "verl": VERL})
    other = "verl" if backend == "trl" else "trl"
    repexp, grpo = C.parse_run("gsm8k", f"{backend}_repexp_k8_b0.01_s42"), C.parse_run("gsm8k", f"{backend}_grpo_s42")

    def hashes(patch: dict) -> tuple[str, str]:
        cfg = C.load(_deep_merge(copy.deepcopy(raw), patch))
        return C.training_hash(C.compose(cfg, repexp)), C.training_hash(C.compose(cfg, grpo))

    base = hashes({})
    own_field = {"trl": {"logging_steps": 2}, "verl": {"max_num_batched_tokens": 4096}}[backend]
    other_field = {"trl": {"logging_steps": 2}, "verl": {"max_num_batched_tokens": 4096}}[other]
    assert all(a != b for a, b in zip(hashes({backend: own_field}), base))  # both runs use their backend's section
    assert hashes({other: other_field}) == base
    lamb = hashes({"bonus": {"lamb": 0.5}})
    assert lamb[0] != base[0] and lamb[1] == base[1]  # β = 0 runs ignore the bonus settings
    runtime = {"trl": {"eval_batch_size": 3, "num_threads": 2, "bonus_micro_batch_size": 4},
               "verl": {"ray_num_cpus": 1, "log_prob_micro_batch_size_per_gpu": 4}}[backend]
    assert hashes({backend: runtime}) == base


def test_runtime_settings_are_marked_in_the_dataclasses():
    runtime = {f"{section.__name__}.{f.name}" for section in (C.TrainConfig, C.VerlConfig, C.TrlConfig, C.BonusConfig)
               for f in dataclasses.fields(section) if f.metadata.get("runtime")}
    assert runtime == {
        "TrainConfig.max_checkpoints_to_keep", "TrainConfig.prune_when_done", "TrainConfig.walltime_margin_minutes",
        "VerlConfig.ray_num_cpus",
        "VerlConfig.log_prob_micro_batch_size_per_gpu", "VerlConfig.reward_workers", "VerlConfig.agent_workers",
        "VerlConfig.kv_cache_gib", "VerlConfig.dynamic_batch_tokens", "VerlConfig.replay_poll_seconds",
        "VerlConfig.repexp_micro_batch_size_per_gpu", "TrlConfig.eval_batch_size", "TrlConfig.gradient_checkpointing",
        "TrlConfig.bonus_micro_batch_size", "TrlConfig.num_threads", "TrlConfig.gpu_memory_fraction",
        "TrlConfig.vllm_gpu_memory_utilization", "TrlConfig.vllm_kv_cache_gib", "TrlConfig.vllm_enforce_eager",
        "TrlConfig.vllm_sleep_mode"}


def test_rule_resources_fill_defaults():
    raw = _raw("test.yaml")
    raw["resources"] = {"train": {"gpu": 2}}
    cfg = C.load(raw)
    train = C.rule_resources(cfg, "train")
    assert (train.gpu, train.nodes, train.cpus_per_task) == (2, 1, 1)
    assert C.rule_resources(cfg, "figures") == C.RuleResources()
    with pytest.raises(C.ConfigError, match="resources.plot"):
        C.rule_resources(cfg, "plot")


def test_every_config_key_is_documented():
    doc = (REPO / "docs" / "configuration.md").read_text()

    def keys(schema, prefix=""):
        for name, sub in schema.get("properties", {}).items():
            if "properties" in sub:
                yield from keys(sub, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}"

    missing = [key for key in keys(C.json_schema()) if f"`{key}`" not in doc]
    missing += [f"resources.<rule>.{f.name}" for f in dataclasses.fields(C.RuleResources)
                if f"`resources.<rule>.{f.name}`" not in doc]
    assert not missing, f"docs/configuration.md lacks {missing}"


# --------------------------------------------------------------------------- the cost plan (issue 23, item 5)


def test_plan_reproduces_its_measured_point_and_scales_by_parameters_and_tokens():
    from repexp import plan

    raw = {"model": "Qwen/Qwen2.5-1.5B-Instruct", "sweep": {"tasks": ["gsm8k"], "backends": ["verl"]},
           "train": {"n_rollouts": 8, "train_batch_size": 32, "ppo_mini_batch_size": 32, "max_prompt_length": 512,
                     "max_response_length": 512, "total_steps": 1, "val_before_train": False, "test_freq": 20},
           "verl": {"n_gpus_per_node": 1, "rollout_tensor_parallel_size": 1},
           "resources": {"train": {"gpu": 1, "runtime": 600}, "eval": {"gpu": 1, "runtime": 600},
                         "testtime": {"gpu": 1, "runtime": 600}}}
    cfg = C.load(raw)
    spec = next(s for s in C.sweep_runs(cfg) if s.trains)
    sizes = plan.split_sizes(cfg, "gsm8k")
    one = plan.train_cost(cfg, spec, 1.54e9, sizes)
    # the benchmark's own shape: one step is the measured 58.65 GPU-s (+ one allocation's start-up)
    assert one.hours * 3600 == pytest.approx(plan.TRAIN_STEP_GPU_S + plan.TRAIN_STARTUP_S)
    # twice the parameters and twice the tokens per sequence: four times the step
    double = plan.train_cost(C.load({**raw, "train": {**raw["train"], "max_response_length": 1536}}), spec,
                             3.08e9, sizes)
    assert double.hours * 3600 - plan.TRAIN_STARTUP_S == pytest.approx(4 * plan.TRAIN_STEP_GPU_S)
    assert plan.model_params("Qwen/Qwen2.5-7B-Instruct") == 7.62e9 and plan.model_params("org/Some-3B") == 3e9
    assert plan.model_params("org/unnamed") is None


def test_plan_of_the_paper_config_counts_the_dry_runs_jobs_and_chunks_training():
    from repexp import plan

    paper = C.load(REPO / "configs" / "paper.yaml")
    # tests/test_workflow.py checks these counts against `snakemake -n --profile slurm all`
    assert plan.job_counts(paper) == {"preprocess": 3, "train": 18, "select": 18, "merge": 18, "eval": 21,
                                      "testtime": 21, "aggregate": 1, "figures": 1}
    jobs = plan.job_costs(paper, plan.model_params(paper.model))
    trains = [j for j in jobs if j.rule == "train"]
    assert len(trains) == 18 and all(j.gpus == 8 and j.allocations > 1 for j in trains)  # spans several 24 h chunks
    assert all(j.unit_hours * 60 <= 1440 for j in jobs)  # every unit fits its allocation (the check passes)
    text = plan.report(paper, gpus=64)
    assert "| train | 18 | 8 |" in text and "GPU-hours" in text and "peak disk" in text and "on 64 GPUs" in text


@pytest.mark.parametrize("setting, key", [
    ("resources.testtime.runtime=240", "resources.testtime.runtime: 240 min is below the estimate for the whole "
                                       "testtime job of math/"),
    ("resources.eval.gpu=1 eval.data_parallel_size=1",
     "resources.eval.runtime: 1440 min is below the estimate for the whole eval job"),
    ("resources.train.runtime=60", "resources.train.runtime: 60 min is below the estimate for one step"),
], ids=["testtime-at-4h", "eval-on-one-gpu", "train-chunk-of-1h"])
def test_a_gpu_rule_whose_runtime_is_below_its_estimate_is_refused(setting, key):
    with pytest.raises(C.ConfigError, match=re.escape(key)):
        C.load(REPO / "configs" / "paper.yaml", overrides=setting.split())


def test_plan_command_prints_the_paper_plan(capsys):
    from repexp.cli import main

    assert main(["plan", "--configfile", str(REPO / "configs" / "paper.yaml"), "--gpus", "64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan for repexp-paper: model Qwen/Qwen2.5-7B-Instruct (7.62 B parameters), 21 runs")
    assert "| eval | 21 | 8 |" in out and "wall time on 64 GPUs ≥" in out


def test_repexp_eval_refuses_absurd_sizes_before_writing_anything(tmp_path, capsys):
    """A direct `repexp eval --set eval.n_samples=1000000000000` stops with the config's limit, no
    MemoryError, and leaves no sample store (samples/meta.json) behind."""
    from repexp.cli import main

    out = tmp_path / "eval"
    for flags, key in ((["--set", f"eval.n_samples={10**12}"], "eval.n_samples"),
                       (["--set", "eval.n_samples=65536", "eval.shard_size=1000"], "eval.shard_size")):
        assert main(["eval", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "test.parquet"),
                     "--out", str(out), *flags]) == 2
        assert key in capsys.readouterr().err and not out.exists()


def test_the_parity_overlay_on_the_pilot_trains_both_backends_with_the_pilots_settings():
    """configs/overlays/parity.yaml merged onto configs/pilot.yaml as Snakemake merges two --configfile files:
    the pilot's training settings, both backends, and the runs benchmarks/parity_report.py names."""
    from snakemake.utils import update_config

    raw = yaml.safe_load((REPO / "configs" / "pilot.yaml").read_text())
    update_config(raw, yaml.safe_load((REPO / "configs" / "overlays" / "parity.yaml").read_text()))
    parity, pilot = C.load(raw), C.load(REPO / "configs" / "pilot.yaml")
    # the overlay changes only what no compared curve depends on: checkpoints kept and how often dev runs
    assert parity.train == dataclasses.replace(pilot.train, max_checkpoints_to_keep=1, test_freq=40, save_freq=40,
                                               val_before_train=False)
    assert parity.sweep.backends == ["trl", "verl"] and parity.sweep.seeds == pilot.sweep.seeds
    runs = {s.name for s in C.sweep_runs(parity) if s.trains}
    for backend in ("trl", "verl"):
        assert {f"{backend}_{name}_s{seed}" for seed in (1, 2, 3) for name in (
            "grpo", "repexp_k32_b0.01", "passk_k4", "outcome_historical_c1", "kl_cov_r0.002")} == {
            run for run in runs if run.startswith(backend)}
