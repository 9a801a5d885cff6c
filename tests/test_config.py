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
    assert SCHEMA == C.json_schema(), "configs/schema.yaml is stale: run `repexp config schema --out configs/schema.yaml`"
    assert SCHEMA["$schema"] == jsonschema.Draft202012Validator.META_SCHEMA["$schema"]  # no Snakemake draft warning


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    raw = yaml.safe_load(path.read_text())
    assert _schema_errors(raw) == []
    cfg = C.load(path)
    assert C.sweep_runs(cfg)


def test_shipped_configs_are_the_documented_ones():
    assert {p.name for p in SHIPPED} == {"paper.yaml", "local.yaml", "test.yaml"}
    paper = C.load(REPO / "configs" / "paper.yaml")
    assert paper.model == "Qwen/Qwen2.5-7B-Instruct" and paper.sweep.backends == ["verl"]
    assert paper.sweep.seeds == [41, 42, 43] and paper.sweep.betas == [0.01]
    assert paper.eval.n_samples == 256 and paper.eval.engine == "vllm"
    runs = {s.path for s in C.sweep_runs(paper)}
    assert "dapo-with-aime24/verl_repexp_k128_b0.01_s41" in runs and "math/verl_repexp_k32_b0.01_s43" in runs
    assert {"math/base", "gsm8k/base", "dapo-with-aime24/base", "gsm8k/verl_grpo_s42"} <= runs
    assert len(runs) == 3 * (3 * 2) + 3
    test = C.load(REPO / "configs" / "test.yaml")
    assert test.model == "tiny" and test.sweep.tasks == ["gsm8k"] and len(test.sweep.seeds) == 1
    assert {s.method for s in C.sweep_runs(test)} == {"repexp", "grpo", "base"}


def test_paper_task_settings_follow_the_upstream_recipe():
    paper = C.load(REPO / "configs" / "paper.yaml")
    for task in ("math", "gsm8k"):
        train = C.task_section(paper, task, "train")
        assert (train.train_batch_size, train.ppo_mini_batch_size, train.micro_batch_size_per_gpu) == (1024, 256, 16)
        assert (train.max_prompt_length, train.max_response_length, train.test_freq, train.save_freq) == (1024, 1024, 20, 20)
        assert C.task_sweep(paper, task)[0] == [32]
    dapo = C.task_section(paper, "dapo-with-aime24", "train")
    assert (dapo.train_batch_size, dapo.ppo_mini_batch_size, dapo.micro_batch_size_per_gpu) == (512, 128, 8)
    assert (dapo.max_prompt_length, dapo.max_response_length, dapo.test_freq, dapo.save_freq) == (2048, 8192, 10, 10)
    verl = C.task_section(paper, "dapo-with-aime24", "verl")
    assert (verl.max_num_batched_tokens, verl.gpu_memory_utilization, verl.repexp_micro_batch_size_per_gpu) == (10240, 0.5, 16)
    assert C.task_sweep(paper, "dapo-with-aime24")[0] == [128]
    assert paper.data.dapo_source == "hf"


# Each broken config: (patch applied to configs/test.yaml, key the error must name, schema catches it too)
BROKEN = {
    "unknown top-level key": ({"learning_rate": 1e-6}, "learning_rate", True),
    "unknown nested key": ({"train": {"lrr": 1e-6}}, "train.lrr", True),
    "wrong type": ({"train": {"lr": "fast"}}, "train.lr", True),
    "float seed": ({"sweep": {"seeds": [1.5]}}, "sweep.seeds[0]", True),
    "negative beta": ({"sweep": {"betas": [-0.1]}}, "sweep.betas[0]", True),
    "zero beta (GRPO is the baseline flag)": ({"sweep": {"betas": [0]}}, "sweep.betas[0]", True),
    "sparse_dim below 1": ({"sweep": {"sparse_dims": [0]}}, "sweep.sparse_dims[0]", True),
    "unknown task": ({"sweep": {"tasks": ["gsm8k", "mathh"]}}, "sweep.tasks[1]", True),
    "unknown backend": ({"sweep": {"backends": ["deepspeed"]}}, "sweep.backends[0]", True),
    "top_p above 1": ({"eval": {"top_p": 1.5}}, "eval.top_p", True),
    "bad name": ({"name": "my run"}, "name", True),
    "bool for int": ({"train": {"total_steps": True}}, "train.total_steps", True),
    "inconsistent batch sizes": ({"train": {"train_batch_size": 6, "ppo_mini_batch_size": 4}},
                                 "train.ppo_mini_batch_size", False),
    "save_freq does not divide test_freq": ({"train": {"test_freq": 4, "save_freq": 3}}, "train.save_freq", False),
    "duplicate betas": ({"sweep": {"betas": [0.01, 0.010]}}, "sweep.betas", False),
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
}


def _patched(patch: dict) -> dict:
    raw = copy.deepcopy(_raw("test.yaml"))

    def merge(dst, src):
        for key, value in src.items():
            if isinstance(value, dict) and isinstance(dst.get(key), dict) and key != "task_overrides":
                merge(dst[key], value)
            else:
                dst[key] = value

    merge(raw, patch)
    return raw


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
    repexp = C.RunSpec(task, "repexp", backend, k, beta, seed)
    for spec in (repexp, C.RunSpec(task, "grpo", backend, None, 0.0, seed), C.RunSpec(task, "base")):
        assert C.parse_run(task, spec.name) == spec
        assert re.fullmatch(C.RUN_PATTERN, spec.name)  # the Snakemake wildcard accepts it
    assert C.parse_run(task, repexp.name).beta == beta  # exact float round trip
    # numpy scalars (e.g. from a Paramspace) name the same run
    assert C.RunSpec(task, "repexp", backend, np.int64(k), np.float64(beta), np.int64(seed)).name == repexp.name


@pytest.mark.parametrize("name", [
    "trl_repexp_k32_b0.010_s42", "trl_repexp_k32_b1e-05_s42", "trl_repexp_k032_b0.01_s42",
    "trl_repexp_k32_b0.01_s042", "trl_grpo_s42_extra", "deepspeed_grpo_s1", "base2",
])
def test_parse_run_rejects_non_canonical_or_unknown_names(name):
    with pytest.raises(C.ConfigError, match="run:"):
        C.parse_run("gsm8k", name)


def test_wildcard_patterns_separate_trained_verl_and_base_runs():
    assert re.fullmatch(C.TRAINED_RUN_PATTERN, "trl_grpo_s1") and not re.fullmatch(C.TRAINED_RUN_PATTERN, "base")
    assert re.fullmatch(C.VERL_RUN_PATTERN, "verl_repexp_k8_b0.5_s3") and not re.fullmatch(C.VERL_RUN_PATTERN, "trl_grpo_s1")
    assert all(re.fullmatch(C.TASK_PATTERN, t) for t in C.TASKS) and not re.fullmatch(C.TASK_PATTERN, "gsm8k/base")


def test_duplicate_spellings_collapse_to_one_run():
    raw = _patched({"sweep": {"betas": [0.01, 0.1]}})
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
    assert hash_with({"resources.train.runtime": 10}) == base_hash  # scheduler settings: none
    assert hash_with({"tracking.experiment": "other"}) == base_hash
    assert hash_with({"task_overrides.math.train.lr": 3e-6}) == base_hash  # another task: none
    assert hash_with({"train.lr": 3e-6}) != base_hash
    assert hash_with({"task_overrides.gsm8k.train.lr": 3e-6}) != base_hash
    assert hash_with({"bonus.lamb": 0.1}) != base_hash


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
