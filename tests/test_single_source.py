"""One source of truth (issue 17): every results path, metric name and default is defined once.

These tests fail when a copy reappears: a results file name or a metric name spelled outside
`repexp.layout` / `repexp.metrics`, a bonus default or enum that differs between the pipeline
config and the bonus maths or is restated in the verl config node (Python and YAML), or a `repexp eval`
default that is not the config's. The pure cores are checked to import no framework, the package to have no import
circles (issue 24) beyond the known one, and the tracking layer to import no stage's core.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest
import yaml

from repexp import bonus_defaults as B
from repexp import config as C
from repexp import layout
from repexp import metrics as M

REPO = Path(__file__).resolve().parents[1]
OWNERS = {"repexp/layout.py", "repexp/metrics.py"}

# --------------------------------------------------------------------------- spellings outside the owners

_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'')
# The slash-separated names of repexp.metrics (`dev/pass_at_1`, `repexp/bonus_raw/mean`, ...); human-readable
# labels ("pass@1") and the keys of eval.json / the tidy table ("pass_at_k", "mean_at_n") are not metric names.
_METRIC = re.compile(r"(^|[^\w.])(dev|test|testtime)/|repexp/(bonus|groups|hidden)|reward/(verifier|shaped)|"
                     r"timing_s/|^best_dev_value$")


def _layout_names() -> set[str]:
    """The file and marker names of repexp.layout that no other module may spell as a path."""
    names = {value for key, value in vars(layout).items() if key.isupper() and isinstance(value, str)
             and (("." in value and not value.startswith(".") or value == layout.SUPERSEDED_DIR)
                  or any(c.isupper() for c in value))}
    return names | {layout.CHECKPOINTS_DIR, layout.STEP_PREFIX, layout.TRL_STAGING_DIR}


def _python_strings(text: str):
    """(line, string) of every string constant and f-string piece that is not a docstring."""
    tree = ast.parse(text)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def _snakemake_strings(text: str):
    for number, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("#"):
            for match in _STRING.finditer(line):
                yield number, match.group(0)[1:-1]


def spellings(path: Path, rel: str) -> list[str]:
    """Where `path` spells a results file name or a metric name as code (a string without spaces: a
    path or a key, not a message or help text)."""
    text = path.read_text()
    strings = _python_strings(text) if path.suffix == ".py" else _snakemake_strings(text)
    found = []
    names = _layout_names()
    for line, value in strings:
        if any(c.isspace() for c in value):
            continue
        for name in names:
            if re.search(rf"(^|/){re.escape(name)}" + ("" if name.endswith("_") else "($|/)"), value):
                found.append(f"{rel}:{line}: results name {name!r} in {value!r} (use repexp.layout)")
        if _METRIC.search(value):
            found.append(f"{rel}:{line}: metric name in {value!r} (use repexp.metrics)")
    return found


def _code_files() -> list[tuple[Path, str]]:
    files = sorted((REPO / "repexp").rglob("*.py")) + sorted((REPO / "workflow" / "rules").glob("*.smk"))
    files.append(REPO / "Snakefile")
    return [(p, str(p.relative_to(REPO))) for p in files if str(p.relative_to(REPO)) not in OWNERS]


def test_results_paths_and_metric_names_are_spelled_only_by_their_owners():
    found = [hit for path, rel in _code_files() for hit in spellings(path, rel)]
    assert not found, "\n".join(found)


def test_the_spelling_check_finds_copies(tmp_path):
    copy = tmp_path / "copy.py"
    copy.write_text('"""eval.json in a docstring is prose."""\n'
                    'A = f"{root}/eval/{task}/eval.json"\nB = "metrics.jsonl"\nC = f"global_step_{n}"\n'
                    'D = "dev/pass_at_1"\nE = f"timing_s/{name}"\nF = "no eval.json here"\nG = "pass_at_k"\n')
    rule = tmp_path / "x.smk"
    rule.write_text('rule x:\n    output:\n        f"{RESULTS}/train/{{task}}/{{run}}/DONE",\n'
                    '    # "DONE" in a comment\n')
    assert sorted(int(h.split(":")[1]) for h in spellings(copy, "copy.py")) == [2, 3, 4, 5, 6]
    assert [int(h.split(":")[1]) for h in spellings(rule, "x.smk")] == [3]


def test_the_rules_take_their_outputs_from_the_layout():
    """No rule builds a results path itself: the Snakefile's helpers (common.smk) use repexp.layout."""
    for path in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        text = path.read_text()
        assert "{RESULTS}" not in text, f"{path.name} builds a results path from RESULTS"
    common = (REPO / "workflow" / "rules" / "common.smk").read_text()
    pipeline = (REPO / "repexp" / "pipeline.py").read_text()  # what common.smk calls for targets
    assert "from repexp import layout as L" in common and "L.figure_stems(" in pipeline  # not its own figure list


# --------------------------------------------------------------------------- bonus defaults and enums


def test_the_bonus_enums_are_one_object_everywhere():
    from repexp import elliptical
    from repexp.evaluate import engines

    assert C.REWARD_TYPES is B.REWARD_TYPES is elliptical.REWARD_TYPES
    assert C.NORMALIZATIONS is B.NORMALIZATIONS is elliptical.NORMALIZATIONS
    assert engines.ENGINES is C.ENGINES
    fields = {f.name: f for f in dataclasses.fields(C.BonusConfig)}
    assert tuple(fields["reward_type"].metadata["enum"]) == B.REWARD_TYPES
    assert tuple(fields["normalization"].metadata["enum"]) == B.NORMALIZATIONS


def _bonus_default_of(name: str):
    return getattr(B, name.upper())


def test_bonus_defaults_agree_across_config_and_maths_and_the_verl_node_has_none_of_its_own():
    from repexp.elliptical import PersistentCovariance, bonuses, combine_rewards
    from repexp.elliptical_order import greedy_order
    from repexp.verl.settings import RepExpSettings

    bonus = C.BonusConfig()
    for name in [f.name for f in dataclasses.fields(C.BonusConfig) if f.name != "representation_model"]:
        assert getattr(bonus, name) == _bonus_default_of(name), name
    repexp_grid = C.SweepConfig().methods.repexp
    assert repexp_grid.beta == [B.BETA] and repexp_grid.sparse_dim == [B.SPARSE_DIM]
    # verl's node: the bonus settings are BonusConfig's own fields (inherited, not restated), and the sweep
    # point has no default there
    assert issubclass(RepExpSettings, C.BonusConfig)
    assert not set(vars(RepExpSettings)["__annotations__"]) & {f.name for f in dataclasses.fields(C.BonusConfig)}
    own = {f.name: f for f in dataclasses.fields(RepExpSettings)}
    assert own["beta"].default is own["sparse_dim"].default is dataclasses.MISSING
    pipeline_verl = C.VerlConfig()
    verl = RepExpSettings(beta=B.BETA, sparse_dim=B.SPARSE_DIM)
    assert (verl.strategy, verl.micro_batch_size_per_gpu) == \
        (pipeline_verl.strategy, pipeline_verl.repexp_micro_batch_size_per_gpu)
    from repexp.verl.attention import resolve

    # the node's attention defaults are the pipeline's `auto` on a node where flash-attn imports
    flash = resolve(pipeline_verl.attn_implementation, pipeline_verl.use_remove_padding, None)
    assert (verl.attn_implementation, verl.use_remove_padding) == (flash.implementation, flash.packing)
    for function in (bonuses, PersistentCovariance, combine_rewards, greedy_order):
        for name, parameter in inspect.signature(function).parameters.items():
            if hasattr(B, name.upper()) and parameter.default is not inspect.Parameter.empty:
                assert parameter.default == _bonus_default_of(name), f"{function.__name__}({name}=...)"


def _yaml_node(*keys: str) -> dict:
    node = yaml.safe_load((REPO / "repexp" / "verl" / "config" / "repexp_trainer.yaml").read_text())
    for key in keys:
        node = node[key]
    return node


@pytest.mark.parametrize("keys, cls_name", [(("actor_rollout_ref", "repexp"), "RepExpSettings"),
                                            (("repexp_run",), "RunSettings")])
def test_the_verl_yaml_nodes_equal_the_settings_dataclasses(keys, cls_name):
    """The verl config node repeats its own defaults for people reading it; they must be the dataclass's.
    The bonus settings are not among them: their node's schema is BonusConfig (repexp/verl/config)."""
    from repexp.verl import settings as verl_settings

    cls = getattr(verl_settings, cls_name)
    node = _yaml_node(*keys)
    bonus = {f.name for f in dataclasses.fields(C.BonusConfig)} if cls is verl_settings.RepExpSettings else set()
    assert set(node) == {f.name for f in dataclasses.fields(cls)} - bonus, f"{'.'.join(keys)}: keys differ"
    for f in dataclasses.fields(cls):
        value = node.get(f.name)
        if f.name in bonus or isinstance(value, str) and value.startswith("${"):
            continue  # the bonus node; an interpolation of verl's own setting (the actor's strategy, its packing)
        expected = "???" if f.default is dataclasses.MISSING else f.default  # required: every run sets it
        assert value == expected, f"{'.'.join(keys)}.{f.name}: {value!r} in the YAML"


# --------------------------------------------------------------------------- eval defaults


def _config_dataclasses() -> list[type]:
    """The pipeline config's dataclasses: PipelineConfig and every dataclass its fields' types name."""
    found: list[type] = []

    def walk(tp) -> None:
        if dataclasses.is_dataclass(tp) and tp not in found:
            found.append(tp)
            for hint in typing.get_type_hints(tp).values():
                walk(hint)
        for arg in typing.get_args(tp):
            walk(arg)

    walk(C.PipelineConfig)
    return found


# A job field named like a setting of the config, and why it is not that setting restated.
NOT_RESTATED = {
    ("EvalJob", "model"): "the model to sample: the base run's resolved initial policy (None beside a pointer)",
    ("EvalJob", "data"): "the split file the job samples, not the `data` section",
    ("EvalJob", "grader"): "the run's grader: the config's top-level scalar (no section to carry); rescore's choice",
    ("TesttimeJob", "model"): "the frozen feature model: bonus.representation_model, else the resolved initial policy",
    ("TesttimeJob", "data"): "the evaluated split file (hand use), not the `data` section",
    ("TesttimeJob", "lamb"): "the one bonus setting besides `center` that the order reads, carried alone so that "
                             "other bonus settings rerun no test-time job",
    ("TesttimeJob", "center"): "as lamb",
    ("DownloadDataJob", "tasks"): "the sweep's tasks whose tables to download",
    ("AggregateJob", "testtime"): "the testtime.json files to read, not the `testtime` section",
    ("AggregateJob", "grader"): "a hand run's choice of the graders that eval.json holds",
    ("AggregateJob", "experiment"): "where a hand run logs; the workflow's: tracking.experiment, else the name",
    ("AggregateJob", "tracking_uri"): "where a hand run logs; the workflow's job logs into its node run",
    ("FiguresJob", "experiment"): "as AggregateJob's",
    ("FiguresJob", "tracking_uri"): "as AggregateJob's",
}


def test_no_job_restates_a_setting_of_the_config():
    """Every setting is declared once, as a field of a config dataclass (its help and bounds beside it): a job
    carries its composed section whole (`config`) and has no field of its own named like a setting, except
    the few in NOT_RESTATED, each with the reason it is another thing."""
    from repexp import jobs as J

    settings: dict[str, list[str]] = {}
    for cls in _config_dataclasses():
        for f in dataclasses.fields(cls):
            settings.setdefault(f.name, []).append(cls.__name__)
    restated = {(job.__name__, f.name): settings[f.name] for job in typing.get_args(J.Job)
                for f in dataclasses.fields(job) if f.name in settings and f.name != "config"}
    assert set(restated) <= set(NOT_RESTATED), {k: v for k, v in restated.items() if k not in NOT_RESTATED}
    assert set(NOT_RESTATED) <= set(restated), set(NOT_RESTATED) - set(restated)  # no stale exception
    for job, section in ((J.EvalJob, C.EvalConfig), (J.TesttimeJob, C.TesttimeConfig), (J.PreprocessJob, C.DataConfig)):
        assert typing.get_type_hints(job)["config"] is section, job


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found |= {d for sub in action.choices.values() for d in _flags(sub)}
        elif action.option_strings:
            found.add(action.dest)
    return found


def test_the_hand_clis_take_their_settings_from_the_config():
    """`repexp eval`, `repexp testtime` and `repexp data prepare` set a setting through the config (`--config`,
    `--set`), never through a flag of its own: a flag named like a setting is one of NOT_RESTATED's."""
    from repexp import cli

    settings = {f.name for cls in _config_dataclasses() for f in dataclasses.fields(cls)}
    for command, job in (("eval", "EvalJob"), ("testtime", "TesttimeJob"), ("data", "PreprocessJob")):
        flags = _flags(cli.command_parser(command))
        assert {"config", "set"} <= flags, command
        assert {f for f in flags & settings if (job, f) not in NOT_RESTATED} == set(), command


def test_the_samplers_defaults_are_the_config_defaults():
    """The sampler's own settings classes default to the config's eval section (as a job on a whole GPU
    sees it), for direct callers such as the benchmarks."""
    from repexp.evaluate.core import SamplingSettings
    from repexp.evaluate.engines import EngineOptions

    ev = C.resolve_gpus(C.PipelineConfig()).eval
    sampling, options = SamplingSettings(), EngineOptions()
    assert (sampling.n, sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_new_tokens) == \
        (ev.n_samples, ev.temperature, ev.top_p, ev.top_k, C.max_new_tokens(ev, C.TrainConfig()))
    for name in ("batch_size", "dtype", "tensor_parallel_size", "gpu_memory_utilization", "max_model_len",
                 "enforce_eager", "max_num_seqs", "max_num_batched_tokens"):
        assert getattr(options, name) == getattr(ev, name), f"EngineOptions.{name}"
    assert (options.enable_prefix_caching, options.enable_chunked_prefill) == (ev.prefix_caching, ev.chunked_prefill)


# --------------------------------------------------------------------------- both backends, one set of metrics


def test_both_backends_build_their_step_and_dev_metrics_with_one_function():
    """verl's bonus glue and TRL's reward build their metrics with repexp.metrics: the same names, and
    nothing (never zeros) for a step in which no row takes part."""
    import torch

    from repexp.bonus_step import BonusState, compute_step_bonus
    from repexp.verl.settings import RepExpSettings
    from repexp.verl.validation import dev_pass_at_k

    settings = RepExpSettings(beta=0.01, sparse_dim=4)
    hidden = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])
    uids = ["a", "a", "b", "b"]
    def step(excluded):
        return compute_step_bonus(hidden, uids, scores, settings, beta=settings.beta, step=1, excluded=excluded,
                                  state=BonusState(settings, sparse_dim=settings.sparse_dim, seed=settings.seed))

    result = step(torch.zeros(4, dtype=torch.bool))
    expected = {M.statistic(prefix, s) for prefix in (M.BONUS_RAW, M.BONUS_SCALED) for s in M.STATISTICS}
    expected |= {M.BONUS_TURNED_OFF, M.HIDDEN_NORM_MEAN, M.REWARD_VERIFIER_MEAN, M.REWARD_SHAPED_MEAN}
    expected |= {M.group_fraction(status) for status in M.GROUP_STATUSES}
    assert set(result.metrics) == expected
    excluded = step(torch.ones(4, dtype=torch.bool))
    assert excluded.metrics == {}
    assert M.bonus_metrics([], [], 0.1, []) == {} and M.group_metrics({}, [], []) == {} and M.summary("x", []) == {}

    dev = dev_pass_at_k(["p", "p", "q", "q"], [1.0, 0.0, 0.0, 0.0])
    assert dev == M.dev_metrics([2, 2], [1, 0])  # repexp.trl.validation.validate returns dev_metrics(n, correct)
    assert dev == {"dev/pass_at_1": 0.25, "dev/pass_at_2": 0.5, "dev/num_problems": 2.0,
                   "dev/samples_per_problem": 2.0}
    source = (REPO / "repexp" / "trl" / "validation.py").read_text()
    assert "return dev_metrics(n, correct)" in source


def test_distinct_fraction_counts_token_identical_responses_once_per_group():
    n = 4
    distinct = [[1, 2], [1, 3], [2], []]  # the empty response is one response too
    assert M.distinct_fraction(["a"] * n, distinct) == {M.DISTINCT_FRACTION: 1.0}
    assert M.distinct_fraction(["a"] * n, [[5, 6, 2]] * n) == {M.DISTINCT_FRACTION: 1 / n}
    # group keys are any hashables, rows of a group need not be adjacent; groups are averaged unweighted
    mixed = M.distinct_fraction([7, "u", 7, "u", 7, "u", 7, "u"],
                                [[1], [9, 9], [1], [9, 8], [1, 0], [9, 9], [1], [9]])
    assert mixed[M.DISTINCT_FRACTION] == pytest.approx((2 / 4 + 3 / 4) / 2)
    # a prefix is not the same response; padding after a row's length is ignored
    assert M.distinct_fraction(["a", "a"], [[3, 4], [3, 4, 2]]) == {M.DISTINCT_FRACTION: 1.0}
    padded = np.array([[3, 4, 2, 0, 0], [3, 4, 2, 2, 2], [3, 4, 0, 0, 0], [3, 4, 2, 9, 9]])
    assert M.distinct_fraction(["a"] * 4, padded, lengths=[3, 3, 2, 3]) == {M.DISTINCT_FRACTION: 2 / 4}
    assert M.distinct_fraction(["a"] * 4, padded) == {M.DISTINCT_FRACTION: 1.0}  # without lengths: whole rows
    assert M.distinct_fraction([], []) == {}
    with pytest.raises(ValueError, match="one per row"):
        M.distinct_fraction(["a"], [[1], [2]])


def test_all_correct_identical_fraction_counts_only_all_correct_groups():
    # four groups of 2: g0 all correct and identical, g1 all correct and different, g2 identical but one
    # wrong (not all correct), g3 all wrong and identical; a score of 0.3 is correct (> 0, the group rule)
    groups = ["g0", "g0", "g1", "g1", "g2", "g2", "g3", "g3"]
    responses = [[5], [5], [5], [6], [7], [7], [8], [8]]
    scores = [1.0, 0.3, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    out = M.rollout_diversity(groups, responses, scores=scores)
    assert out[M.ALL_CORRECT_IDENTICAL_FRACTION] == 0.5  # g0 of {g0, g1}
    assert out[M.DISTINCT_FRACTION] == pytest.approx((1 / 2 + 2 / 2 + 1 / 2 + 1 / 2) / 4)
    # identity is by the response within its length (padding ignored), as for distinct_frac
    padded = [[5, 0], [5, 9], [5, 0], [6, 0]]
    out = M.rollout_diversity(["a", "a", "b", "b"], padded, [1, 1, 1, 1], scores=[1, 1, 1, 1])
    assert out[M.ALL_CORRECT_IDENTICAL_FRACTION] == 0.5
    # no all-correct group: the statistic is left out, never 0
    assert M.ALL_CORRECT_IDENTICAL_FRACTION not in M.rollout_diversity(["a", "a"], [[1], [1]], scores=[1, 0])
    # without scores or answers it is distinct_fraction
    assert M.rollout_diversity(groups, responses) == M.distinct_fraction(groups, responses)
    with pytest.raises(ValueError, match="one per row"):
        M.rollout_diversity(["a", "a"], [[1], [2]], scores=[1.0])


def test_the_all_correct_groups_of_the_diversity_metric_are_the_reward_rules_own(monkeypatch):
    import torch

    from repexp import elliptical

    groups = ["g0", "g0", "g1", "g1", "g2", "g2", "g3", "g3"]
    responses = [[5], [5], [5], [6], [7], [7], [8], [8]]
    scores = [1.0, 0.3, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    combined = elliptical.combine_rewards(torch.tensor(scores), torch.zeros(8), groups, beta=0.0)
    assert combined.status_fractions()["all_correct"] == 2 / 4  # g0 and g1, as the metric counts them
    # one definition: a changed correctness rule changes the metric too (here 0 counts as correct: g2, g3 join)
    monkeypatch.setattr(elliptical, "is_correct", lambda s: s >= 0)
    assert M.rollout_diversity(groups, responses, scores=scores)[M.ALL_CORRECT_IDENTICAL_FRACTION] == 3 / 4


def test_distinct_answers_counts_answers_per_group_with_no_answer_as_one():
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    answers = ["7", "7", "8", None, None, None, "3", "3"]  # g0: 7, 8, none → 3; g1: none, 3 → 2
    out = M.rollout_diversity(groups, [[i] for i in range(8)], answers=answers)
    assert out[M.DISTINCT_ANSWERS] == pytest.approx((3 + 2) / 2)
    assert M.ALL_CORRECT_IDENTICAL_FRACTION not in out  # needs scores


# --------------------------------------------------------------------------- pure cores

PURE_CORES = ("repexp.elliptical", "repexp.elliptical_order", "repexp.passk", "repexp.verify",
              "repexp.verify.compare", "repexp.verify.extract", "repexp.verify.normalize", "repexp.verify.paper",
              "repexp.verify.pool", "repexp.verify.routing", "repexp.verify.scoring", "repexp.verify.timeout",
              "repexp.splits", "repexp.config", "repexp.arith", "repexp.testtime.core", "repexp.layout",
              "repexp.metrics", "repexp.bonus_defaults", "repexp.io", "repexp.walltime", "repexp.plan",
              "repexp.intermediates", "repexp.features", "repexp.bonus_step", "repexp.pipeline", "repexp.gpus",
              "repexp.joblog")
FRAMEWORKS = ("verl", "trl", "transformers", "mlflow", "vllm", "snakemake", "ray", "hydra")


def test_every_verify_submodule_is_listed():
    listed = {m for m in PURE_CORES if m.startswith("repexp.verify.")}
    assert listed == {f"repexp.verify.{p.stem}" for p in (REPO / "repexp" / "verify").glob("*.py")
                      if p.stem != "__init__"}


def test_the_pure_cores_import_no_framework():
    """In a fresh interpreter, importing (and using) the pure cores loads none of the frameworks; the
    verifier and the config stay free of torch too."""
    code = (
        "import importlib, sys\n"
        f"for name in {PURE_CORES!r}:\n"
        "    importlib.import_module(name)\n"
        "from repexp import config, verify\n"
        "config.load('configs/test.yaml')\n"
        "assert verify.score('openai/gsm8k', '#### 18.00', '18') == 1.0\n"
        "assert verify.score('aime24', 'so \\\\boxed{33}', '33', grader='paper') == 1.0\n"
        "verify.score_batch(['DigitalLearningGmbH/MATH-lighteval'] * 2, ['\\\\boxed{0.5}', '\\\\fbox{1}'],"
        " '\\\\frac12', workers=1)\n"
        f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[-2] == "[]", result.stdout
    torch_free = ("repexp.config", "repexp.verify", "repexp.layout", "repexp.metrics", "repexp.passk", "repexp.splits",
                  "repexp.pipeline")
    code = ("import importlib, sys\n"
            f"for name in {torch_free!r}:\n    importlib.import_module(name)\n"
            "print('torch' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stdout + result.stderr[-3000:]


# --------------------------------------------------------------------------- import direction

KNOWN_IMPORT_CIRCLES: set[frozenset[str]] = set()  # none left (the last, config.rules <-> plan, went 2026-12-04)


def _repexp_imports() -> dict[str, set[str]]:
    """Every repexp module -> the repexp modules it imports, at module level or inside a function
    (`from repexp.x import y` names the submodule `repexp.x.y` when that is a module)."""
    modules = {}
    for path in (REPO / "repexp").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                               for a in node.names)
        edges[name] = {t for t in targets if t in modules and t != name}
    return edges


def test_no_import_circles_in_the_package():
    """No repexp module imports, directly or through others, a module that imports it back; function-level
    imports count (issue 24: verify.pool <-> verify.scoring, verl.train <-> verl.trainer)."""
    edges = _repexp_imports()

    def reachable(start: str) -> set[str]:
        seen, stack = set(), [start]
        while stack:
            for nxt in edges[stack.pop()] - seen:
                seen.add(nxt)
                stack.append(nxt)
        return seen

    reach = {name: reachable(name) for name in edges}
    circles = {frozenset({a} | {b for b in reach[a] if a in reach[b]}) for a in edges if a in reach[a]}
    assert circles == KNOWN_IMPORT_CIRCLES, sorted(map(sorted, circles - KNOWN_IMPORT_CIRCLES))


def test_the_tracking_layer_imports_no_stage_core():
    """repexp.tracking reads the stages' outputs through repexp.layout / repexp.metrics, not the stages'
    packages (their cores, nor the public `repexp.evaluate` / `repexp.testtime` in front of them)."""
    edges = _repexp_imports()
    imported = {t for name, targets in edges.items() if name.startswith("repexp.tracking") for t in targets}
    stages = ("repexp.evaluate", "repexp.testtime", "repexp.trl", "repexp.verl", "repexp.train")
    assert not {t for t in imported if t.endswith(".core") or t.startswith(stages)}, imported


def test_the_stage_table_imports_its_stages_and_the_jobs_import_none():
    """repexp.stages holds each rule's stage as an imported callable (the import graph shows the dependency);
    repexp.jobs, which the stages import for their job types, imports no stage back."""
    from repexp import jobs, stages

    assert set(stages.STAGES) == set(jobs.RULES) and all(map(callable, stages.STAGES.values()))
    edges = _repexp_imports()
    stage_modules = {f.__module__ for f in stages.STAGES.values()} - {"repexp.stages"}
    assert stage_modules <= edges["repexp.stages"], stage_modules - edges["repexp.stages"]
    assert not edges["repexp.jobs"] & (stage_modules | {"repexp.stages", "repexp.run_cli"}), edges["repexp.jobs"]
    assert edges["repexp.stage"] == set()  # StageResult's module is a leaf
