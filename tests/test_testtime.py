"""`repexp testtime`: the pure metrics (repexp.testtime.core) and the command on a real tiny-model evaluation."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from repexp import cli, passk
from repexp import metrics as metric_names
from repexp.testtime import core

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


# --------------------------------------------------------------------------- core


def random_case(seed: int, problems: int = 30, n: int = 16):
    rng = np.random.default_rng(seed)
    scores = [(rng.random(n) < rng.choice([0.0, 0.05, 0.3, 0.9])).astype(float).tolist() for _ in range(problems)]
    orders = [rng.permutation(n).tolist() for _ in range(problems)]
    return [f"p{i}" for i in range(problems)], scores, orders


@pytest.mark.parametrize("seed", range(3))
def test_curves_agree_at_k_equal_n_and_repexp_is_the_prefix_hit_rate(seed):
    ids, scores, orders = random_case(seed)
    result = core.testtime_result(problem_ids=ids, scores=scores, orders=orders, bootstrap=50)
    n = len(scores[0])
    assert result["k"] == list(range(1, n + 1))
    solved = np.mean([sum(s) > 0 for s in scores])
    assert result["pass_at_k_repexp"][-1] == pytest.approx(solved, abs=1e-15)
    assert result["pass_at_k_random"][-1] == pytest.approx(solved, abs=1e-15)
    first = [next((i + 1 for i, j in enumerate(o) if s[j] > 0), math.inf) for o, s in zip(orders, scores)]
    for k in (1, 3, n):
        assert result["pass_at_k_repexp"][k - 1] == pytest.approx(np.mean([f <= k for f in first]))
    assert np.all(np.diff(result["pass_at_k_repexp"]) >= 0)
    random = passk.pass_at_k([n] * len(scores), [int(sum(s)) for s in scores], result["k"]).mean(0)
    np.testing.assert_allclose(result["pass_at_k_random"], random)
    # k = n needs at most n samples by construction: the efficiency is defined wherever random > 0
    assert all(r is not None for r, t in zip(result["efficiency"]["ratio"], result["efficiency"]["pass_at_k_random"])
               if t > 0)


def test_random_curve_is_the_average_over_every_order():
    # 1 − C(n−c, k)/C(n, k) is exactly the mean over all n! orders of "a correct sample among the first k"
    scores = [[0, 1, 0, 0, 1], [0, 0, 0, 1, 0], [0, 0, 0, 0, 0]]
    per_order = []
    for perm in itertools.permutations(range(5)):
        r = core.testtime_result(problem_ids=["a", "b", "c"], scores=scores, orders=[list(perm)] * 3, bootstrap=0)
        per_order.append(r["pass_at_k_repexp"])
    np.testing.assert_allclose(np.mean(per_order, 0), r["pass_at_k_random"], atol=1e-12)


def test_efficiency_and_samples_to_correct_by_hand():
    # problem a: correct sample taken 1st by RepExp (random expectation (4+1)/(1+1) = 2.5);
    # problem b: correct taken 2nd (random 2.5); problem c: unsolved.
    scores = [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    orders = [[2, 0, 1, 3], [3, 0, 1, 2], [0, 1, 2, 3]]
    r = core.testtime_result(problem_ids=["a", "b", "c"], scores=scores, orders=orders, reference_ks=[1, 2, 4],
                             bootstrap=200, bootstrap_seed=1)
    assert r["pass_at_k_repexp"] == pytest.approx([1 / 3, 2 / 3, 2 / 3, 2 / 3])
    assert r["pass_at_k_random"] == pytest.approx([1 / 6, 1 / 3, 1 / 2, 2 / 3])
    eff = r["efficiency"]
    assert eff["k_repexp"] == [1, 1, 2] and eff["ratio"] == [1.0, 2.0, 2.0]
    stc = r["samples_to_correct"]
    assert (stc["repexp"], stc["random"], stc["num_solved"]) == (1.5, 2.5, 2)
    assert stc["ratio"] == pytest.approx(2.5 / 1.5)
    lo, hi = stc["ratio_ci95"]
    assert lo <= stc["ratio"] <= hi
    assert [p["first_correct_repexp"] for p in r["per_problem"]] == [1, 2, None]
    again = core.testtime_result(problem_ids=["a", "b", "c"], scores=scores, orders=orders, reference_ks=[1, 2, 4],
                                 bootstrap=200, bootstrap_seed=1)
    assert again == r  # the bootstrap is seeded
    metrics = metric_names.testtime_metrics(r)
    assert metrics["testtime/efficiency_at_2"] == 2.0 and metrics["testtime/samples_to_correct_ratio"] == stc["ratio"]
    assert metrics["testtime/pass_at_4_repexp"] == metrics["testtime/pass_at_4_random"]


def test_nothing_solved_leaves_efficiency_undefined_and_bad_input_fails():
    r = core.testtime_result(problem_ids=["a"], scores=[[0, 0]], orders=[[1, 0]], bootstrap=10)
    assert r["efficiency"]["ratio"] == [None, None] and r["samples_to_correct"]["ratio"] is None
    with pytest.raises(ValueError, match="permutation"):
        core.testtime_result(problem_ids=["a"], scores=[[0, 1]], orders=[[0, 0]])
    with pytest.raises(ValueError, match="0 or 1"):
        core.testtime_result(problem_ids=["a"], scores=[[0, 0.5]], orders=[[0, 1]])
    with pytest.raises(ValueError, match="reference ks"):
        core.testtime_result(problem_ids=["a"], scores=[[0, 1]], orders=[[0, 1]], reference_ks=[4])


# --------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory):
    """A real `repexp eval` of the tiny model (6 problems × 8 samples), with correct samples planted in its
    shards (the tiny model solves nothing): problem i gets sample i marked correct, problem 5 none."""
    import pyarrow as pa
    from test_evaluate import write_split

    from repexp.models import build_tiny_qwen2

    root = tmp_path_factory.mktemp("testtime")
    model = build_tiny_qwen2(root / "tiny", seed=0)
    data = write_split(root / "data" / "toy" / "test.parquet")
    out = root / "eval"
    assert cli.main(["eval", "--model", str(model), "--data", str(data), "--out", str(out), "--seed", "1",
                     "--no-progress", "--set", "eval.n_samples=8", "eval.max_new_tokens=6", "eval.shard_size=4",
                     "eval.batch_size=16"]) == 0
    for shard in sorted((out / "samples").glob("shard-*.parquet")):
        table = pq.read_table(shard)
        rows = table.to_pydict()
        rows["score"] = [1.0 if int(p.rsplit("/", 1)[1]) == s and s < 5 else 0.0
                         for p, s in zip(rows["problem_id"], rows["sample_index"])]
        pq.write_table(pa.Table.from_pydict(rows, schema=table.schema), shard)
    result = json.loads((out / "eval.json").read_text())  # eval.json's pass@k of the planted scores
    counts = [1] * 5 + [0]
    result["pass_at_k"] = {str(k): float(v) for k, v in
                           zip(result["ks"], passk.pass_at_k([8] * 6, counts, result["ks"]).mean(0))}
    (out / "eval.json").write_text(json.dumps(result))
    return model, out


def cmd_args(model, eval_dir, out, *extra):
    return ["testtime", "--eval-dir", str(eval_dir), "--model", str(model), "--out", str(out), "--set",
            "testtime.sparse_dim=4", "testtime.bootstrap=100", "testtime.batch_size=16", *extra]


def test_command_writes_the_contract_and_resumes_from_cached_features(evaluation, tmp_path, capsys):
    import torch
    from greedy_reference import greedy_order_reference

    model, eval_dir = evaluation
    out = tmp_path / "tt"
    assert cli.main(cmd_args(model, eval_dir, out)) == 0
    assert "features of 48 samples" in capsys.readouterr().err
    result = json.loads((out / "testtime.json").read_text())
    assert result["k"] == list(range(1, 9)) and result["num_problems"] == 6 and result["n_samples"] == 8
    assert result["pass_at_k_repexp"][-1] == result["pass_at_k_random"][-1] == pytest.approx(5 / 6)
    assert result["settings"]["sparse_dim"] == 4 and result["settings"]["lamb"] == 0.01
    assert result["efficiency"]["reference_k"] == [1, 2, 4, 8] and len(result["efficiency"]["ratio_ci95"]) == 4
    orders = pq.read_table(out / "order.parquet").to_pydict()
    firsts = {p["problem_id"]: p["first_correct_repexp"] for p in result["per_problem"]}
    features = {}
    for shard in sorted((out / "features").glob("shard-*.pt")):
        features[shard.name] = torch.load(shard, weights_only=True)
    assert sum(len(f) for f in features.values()) == 48
    for pid, order in zip(orders["problem_id"], orders["order"]):
        assert sorted(order) == list(range(8))
        i = int(pid.rsplit("/", 1)[1])
        assert firsts[pid] == (order.index(i) + 1 if i < 5 else None)
    # the stored order is the definition's order of the cached features
    shards = pq.read_table(eval_dir / "samples" / "shard-00000.parquet").to_pydict()
    pid = shards["problem_id"][0]
    rows = [j for j, p in enumerate(shards["problem_id"]) if p == pid]
    pool = features["shard-00000.pt"][sorted(rows, key=lambda j: shards["sample_index"][j])]
    assert orders["order"][orders["problem_id"].index(pid)] == greedy_order_reference(pool.double(), lamb=0.01)[0]

    assert cli.main(cmd_args(model, eval_dir, out)) == 0  # resumed: every shard's features are cached
    assert "features of" not in capsys.readouterr().err
    assert json.loads((out / "testtime.json").read_text())["pass_at_k_repexp"] == result["pass_at_k_repexp"]
    assert cli.main(cmd_args(model, eval_dir, out, "testtime.projection_seed=5")) == 0
    assert "other settings; recomputing" in capsys.readouterr().err


def test_features_are_the_mean_hidden_state_over_the_response(evaluation, tmp_path):
    import torch
    from transformers import AutoModel

    from repexp.elliptical import sparse_projection
    from repexp.evaluate.engines import encode_prompts, load_tokenizer
    from repexp.evaluate.problems import load_problems

    model, eval_dir = evaluation
    out = tmp_path / "tt"
    assert cli.main(cmd_args(model, eval_dir, out, "testtime.bootstrap=0")) == 0
    shard = pq.read_table(eval_dir / "samples" / "shard-00000.parquet").to_pydict()
    meta = json.loads((eval_dir / "samples" / "meta.json").read_text())
    problems = load_problems(meta["data_path"])
    tokenizer = load_tokenizer(str(model))
    backbone = AutoModel.from_pretrained(model).eval()
    prompt = encode_prompts(tokenizer, [problems.prompts[problems.problem_ids.index(shard["problem_id"][0])]])[0]
    response = tokenizer(shard["response"][0], add_special_tokens=False)["input_ids"]
    if shard["finish_reason"][0] == "stop":
        response = response + [tokenizer.eos_token_id]
    with torch.no_grad():
        hidden = backbone(input_ids=torch.tensor([prompt + response])).last_hidden_state[0]
    expected = hidden[len(prompt):].mean(0) @ sparse_projection(hidden.shape[-1], 4, seed=0)
    cached = torch.load(out / "features" / "shard-00000.pt", weights_only=True)[0]
    torch.testing.assert_close(cached, expected, rtol=1e-4, atol=1e-5)


def test_incomplete_evaluation_and_bad_settings_are_refused(evaluation, tmp_path, capsys):
    import shutil

    model, eval_dir = evaluation
    partial = tmp_path / "partial"
    shutil.copytree(eval_dir, partial)
    (partial / "eval.json").unlink()
    assert cli.main(cmd_args(model, partial, tmp_path / "a")) == 2
    assert "not complete" in capsys.readouterr().err
    assert not (tmp_path / "a" / "testtime.json").exists()
    assert cli.main(cmd_args(model, eval_dir, tmp_path / "b", "bonus.lamb=0")) == 2
    assert "bonus.lamb" in capsys.readouterr().err
    assert cli.main(cmd_args(tmp_path, eval_dir, tmp_path / "c")) == 2
    assert "no config.json" in capsys.readouterr().err


def test_aggregate_column_and_figure_from_testtime_results(evaluation, tmp_path):
    """`repexp aggregate --testtime` puts the RepExp-order curve beside pass@k; `repexp figures` draws both."""
    model, eval_dir = evaluation
    eval_json = tmp_path / "eval" / "gsm8k" / "base" / "eval.json"
    eval_json.parent.mkdir(parents=True)
    eval_json.write_text(json.dumps({**json.loads((eval_dir / "eval.json").read_text()), "task": "gsm8k"}))
    tt_dir = tmp_path / "testtime" / "gsm8k" / "base"
    assert cli.main(cmd_args(model, eval_dir, tt_dir, "testtime.bootstrap=20")) == 0
    result = json.loads((tt_dir / "testtime.json").read_text())
    agg = tmp_path / "aggregate"
    assert cli.main(["aggregate", "--inputs", str(eval_json), "--testtime", str(tt_dir / "testtime.json"),
                     "--out-dir", str(agg)]) == 0
    import pandas as pd

    table = pd.read_csv(agg / "pass_at_k.csv")
    for row in table.itertuples():
        assert row.testtime_pass_at_k == pytest.approx(result["pass_at_k_repexp"][row.k - 1])
    assert "Test-time RepExp" in (agg / "pass_at_k.md").read_text()
    assert "test-time efficiency" in (agg / "pass_at_k.html").read_text()
    figs = tmp_path / "figures"
    assert cli.main(["figures", "--table", str(agg / "pass_at_k.csv"), "--out-dir", str(figs)]) == 0
    index = json.loads((figs / "index.json").read_text())
    record = next(f for f in index["figures"] if f["id"] == "testtime_pass_at_k")
    curves = {s["order"]: s for s in record["panels"][0]["series"]}
    assert curves["RepExp order"]["k"] == [1, 2, 4, 8]
    assert curves["RepExp order"]["mean"] == pytest.approx([result["pass_at_k_repexp"][k - 1] for k in (1, 2, 4, 8)])
    assert curves["random order"]["mean"] == pytest.approx([result["pass_at_k_random"][k - 1] for k in (1, 2, 4, 8)])
    assert (figs / "testtime_pass_at_k.png").stat().st_size > 0
    # a testtime.json of a run that was not evaluated is refused
    other = tmp_path / "testtime" / "gsm8k" / "trl_grpo_s1" / "testtime.json"
    other.parent.mkdir(parents=True)
    other.write_text((tt_dir / "testtime.json").read_text())
    assert cli.main(["aggregate", "--inputs", str(eval_json), "--testtime", str(other), "--out-dir",
                     str(tmp_path / "agg2")]) == 1


def _variant_job(model, eval_dir, out, variants):
    from repexp.config import TesttimeConfig
    from repexp.jobs import TesttimeJob

    config = TesttimeConfig(sparse_dim=4, projection_seed=0, batch_size=16, dtype="float32", bootstrap=0,
                            variants=list(variants), device="cpu")
    return TesttimeJob(config=config, eval_dir=str(eval_dir), model=str(model), out=str(out), lamb=0.01, center=True)


def test_registered_variants_of_the_order_are_scored_beside_the_main_one(evaluation, tmp_path):
    """testtime.variants (docs/pilot.md, "Fourth design: pre-registration"): a random first pick, no centring and
    the sampling model's own features, each scored like the main order in testtime.json's `variants`."""
    import shutil

    import torch

    from repexp.elliptical_order import greedy_order, pad_pools
    from repexp.testtime import core, testtime

    model, eval_dir = evaluation
    out = tmp_path / "tt"
    result = testtime(_variant_job(model, eval_dir, out, ("random_first", "no_center", "own_features")))
    variants = result["variants"]
    assert set(variants) == {"random_first", "no_center", "own_features"}
    # the base model's own features are the initial policy's: the same order as the main one
    assert variants["own_features"]["samples_to_correct"] == result["samples_to_correct"]
    assert (variants["no_center"]["center"], variants["random_first"]["random_first"]) == (False, True)
    # recomputed from the cached features: the first pick drawn by default_rng(projection_seed), then greedy
    order_table = pq.read_table(out / "order.parquet").to_pydict()
    shards = [torch.load(p, weights_only=True) for p in sorted((out / "features").glob("shard-*.pt"))]
    samples = [pq.read_table(p).to_pydict() for p in sorted((eval_dir / "samples").glob("shard-*.parquet"))]
    pools: dict[str, list] = {}
    scores: dict[str, list] = {}
    for shard, rows in zip(shards, samples):
        for j, (pid, index, score) in enumerate(zip(rows["problem_id"], rows["sample_index"], rows["score"])):
            pools.setdefault(pid, []).append((index, shard[j]))
            scores.setdefault(pid, []).append((index, score))
    ids = order_table["problem_id"]
    padded, sizes = pad_pools([torch.stack([f for _, f in sorted(pools[pid], key=lambda t: t[0])]) for pid in ids])
    rng = np.random.default_rng(0)
    first = [int(rng.integers(0, int(s))) for s in sizes]
    for name, kwargs in (("random_first", {"first": first, "center": True}), ("no_center", {"center": False})):
        ordered = greedy_order(padded, sizes, lamb=0.01, **kwargs)
        orders = [ordered.order[g, : int(s)].tolist() for g, s in enumerate(sizes)]
        expected = core.testtime_result(problem_ids=ids, scores=[[s for _, s in sorted(scores[pid])] for pid in ids],
                                        orders=orders, bootstrap=0)
        assert variants[name]["samples_to_correct"] == expected["samples_to_correct"], name
        if name == "random_first":
            assert [o[0] for o in orders] == first
    # a trained model's own features: a second feature pass with the evaluated model, cached apart
    from repexp.models import build_tiny_qwen2

    other = build_tiny_qwen2(tmp_path / "other", seed=1)
    copied = tmp_path / "eval_other"
    shutil.copytree(eval_dir, copied)
    meta_path = copied / "samples" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["generation"]["model_path"] = str(other)
    meta_path.write_text(json.dumps(meta))
    result = testtime(_variant_job(model, copied, tmp_path / "tt2", ("own_features",)))
    assert result["variants"]["own_features"]["feature_model"] == str(other)
    assert sorted((tmp_path / "tt2" / "own_features" / "features").glob("shard-*.pt"))
