"""`repexp eval` with the real hf engine on the offline tiny Qwen2, the real verifier and pass@k."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from repexp import cli, passk
from repexp.evaluate.core import derived_seed, shard_plan
from repexp.evaluate.engines import plan_batches
from repexp.evaluate.store import SampleStore
from repexp.metrics import eval_metrics
from repexp.models import build_tiny_qwen2

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

SUFFIX = ' Let\'s think step by step and output the final answer after "####".'
PROBLEMS = [("What is 2 + 3?", "5"), ("What is 10 - 4?", "6"), ("What is 3 * 3?", "9"),
            ("Tom has 7 apples and eats 2. How many are left?", "5"), ("What is 1 + 1?", "2"),
            ("What is 1,000 + 1,125?", "2125")]
CONTRACT_KEYS = {"pass_at_k", "pass_at_k_sem", "mean_at_n", "num_problems", "n_samples", "per_problem",
                 "model_path", "checkpoint_step", "engine", "sampling", "seed", "data_hash", "task", "split"}


def write_split(path, problems=PROBLEMS, *, drop=None):
    rows = [{
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question + SUFFIX}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "test", "index": i, "problem_id": f"toy/test/{i}"},
    } for i, (question, answer) in enumerate(problems)]
    if drop:
        rows = [{k: v for k, v in row.items() if k != drop} for row in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path




@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_qwen2(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="module")
def eos_prone_model(tiny_model, tmp_path_factory):
    """The tiny model edited so that <|im_end|> is likely at every step: exercises the `stop` path."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():  # logits become h_0 · E[:, 0] with a large E[eos, 0]
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.model.embed_tokens.weight[tokenizer.eos_token_id, 0] = 20.0
    out = tmp_path_factory.mktemp("models") / "eos_prone"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_split(tmp_path_factory.mktemp("data") / "toy" / "test.parquet")


def eval_args(model, data, out, *extra, n=4, max_new_tokens=10, shard_size=2, batch_size=6):
    return ["eval", "--model", str(model), "--data", str(data), "--out", str(out), "--set", f"eval.n_samples={n}",
            f"eval.max_new_tokens={max_new_tokens}", f"eval.shard_size={shard_size}", f"eval.batch_size={batch_size}",
            "--seed", "3", "--no-progress", *extra]


def read_shards(out):
    return [pq.read_table(p).to_pydict() for p in sorted((out / "samples").glob("shard-*.parquet"))]


@pytest.fixture(scope="module")
def reference_run(tiny_model, data_file, tmp_path_factory):
    """One uninterrupted evaluation that several tests compare against."""
    out = tmp_path_factory.mktemp("eval") / "reference"
    assert cli.main(eval_args(tiny_model, data_file, out)) == 0
    return out


def test_outputs_follow_the_evaluation_contract(reference_run, tiny_model, data_file):
    result = json.loads((reference_run / "eval.json").read_text())
    assert CONTRACT_KEYS <= set(result)
    assert result["engine"] == "hf" and result["num_problems"] == 6 and result["n_samples"] == 4
    assert result["model_path"] == str(tiny_model.resolve()) and result["checkpoint_step"] is None
    assert (result["task"], result["split"], result["seed"]) == ("toy", "test", 3)
    assert {k: result["sampling"][k] for k in ("n", "temperature", "top_p", "top_k", "max_new_tokens")} == {
        "n": 4, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 10}
    assert result["data_hash"].startswith("sha256:")
    assert list(result["pass_at_k"]) == ["1", "2", "4"]

    shards = read_shards(reference_run)
    assert len(shards) == math.ceil(6 / 2)
    scores: dict[str, list[float]] = {}
    for shard in shards:
        assert len(shard["problem_id"]) == 2 * 4
        assert set(shard["finish_reason"]) <= {"stop", "length"}
        assert all(1 <= t <= 10 for t in shard["num_tokens"])
        assert all(t == 10 for t, f in zip(shard["num_tokens"], shard["finish_reason"]) if f == "length")
        for pid, s, score in zip(shard["problem_id"], shard["sample_index"], shard["score"]):
            scores.setdefault(pid, [None] * 4)[s] = score
    # per-problem counts in eval.json are the shard scores, in data-file order
    assert [p["problem_id"] for p in result["per_problem"]] == [f"toy/test/{i}" for i in range(6)]
    counts = [int(sum(scores[p["problem_id"]])) for p in result["per_problem"]]
    assert [p["c"] for p in result["per_problem"]] == counts
    want = passk.pass_at_k(4, counts, [1, 2, 4]).mean(axis=0)
    np.testing.assert_allclose([result["pass_at_k"][k] for k in ("1", "2", "4")], want)
    assert result["mean_at_n"] == pytest.approx(want[0])


def test_resume_after_interruption_equals_uninterrupted_run(reference_run, tiny_model, data_file, tmp_path):
    out = tmp_path / "resumed"
    assert cli.main(eval_args(tiny_model, data_file, out, "--max-shards", "1")) == 0
    assert [p.name for p in sorted((out / "samples").glob("shard-*"))] == ["shard-00000.parquet"]
    assert not (out / "eval.json").exists()
    first_shard = (out / "samples" / "shard-00000.parquet").stat().st_mtime_ns
    # --overwrite (which the Snakemake rule always passes) keeps samples made with the same settings
    assert cli.main(eval_args(tiny_model, data_file, out, "--overwrite")) == 0
    assert (out / "samples" / "shard-00000.parquet").stat().st_mtime_ns == first_shard
    # a killed shard (file absent) is regenerated on the next run
    (out / "samples" / "shard-00001.parquet").unlink()
    assert cli.main(eval_args(tiny_model, data_file, out)) == 0
    for name in ("shard-00000.parquet", "shard-00001.parquet", "shard-00002.parquet"):
        assert (out / "samples" / name).read_bytes() == (reference_run / "samples" / name).read_bytes()
    assert (out / "eval.json").read_text() == (reference_run / "eval.json").read_text()


def test_another_seed_gives_other_samples(reference_run, tiny_model, data_file, tmp_path):
    args = eval_args(tiny_model, data_file, tmp_path / "other", "--limit", "2")
    args[args.index("--seed") + 1] = "4"
    assert cli.main(args) == 0
    ours = {(p, s): r for shard in read_shards(tmp_path / "other")
            for p, s, r in zip(shard["problem_id"], shard["sample_index"], shard["response"])}
    ref = {(p, s): r for shard in read_shards(reference_run)
           for p, s, r in zip(shard["problem_id"], shard["sample_index"], shard["response"])}
    assert sum(ours[key] != ref[key] for key in ours) >= len(ours) - 1


def test_resume_refuses_other_settings(reference_run, tiny_model, data_file, tmp_path, capsys):
    out = tmp_path / "partial"
    assert cli.main(eval_args(tiny_model, data_file, out, "--max-shards", "1")) == 0
    assert cli.main(eval_args(tiny_model, data_file, out, "--set", "eval.temperature=0.7")) == 2
    assert "sampling.temperature: stored 1.0, now 0.7" in capsys.readouterr().err
    assert cli.main(eval_args(tiny_model, data_file, out, "--set", "eval.temperature=0.7", "--max-shards", "0",
                              "--overwrite")) == 0
    assert not list((out / "samples").glob("shard-*"))


def test_rescore_with_known_responses(reference_run, tmp_path):
    """Replace the stored responses by hand-written ones; --rescore must give the hand-computed numbers."""
    import shutil

    out = tmp_path / "rescored"
    shutil.copytree(reference_run, out)
    truth = {f"toy/test/{i}": answer for i, (_, answer) in enumerate(PROBLEMS)}
    correct_count = {"toy/test/0": 0, "toy/test/1": 1, "toy/test/2": 2, "toy/test/3": 4,
                     "toy/test/4": 3, "toy/test/5": 1}
    store = SampleStore(out)
    for i in range(3):
        rows = store.read_shard(i)
        for j, (pid, s) in enumerate(zip(rows["problem_id"], rows["sample_index"])):
            if s < correct_count[pid]:
                rows["response"][j] = f"We add them up.\n#### {truth[pid]}"
            else:  # wrong answers alternate with no answer at all
                rows["response"][j] = "#### 999999" if s % 2 == 0 else "I am not sure."
            rows["score"][j] = 0.5  # stale; must be replaced
        store.write_shard(i, rows)
    assert cli.main(["eval", "--rescore", "--out", str(out)]) == 0
    result = json.loads((out / "eval.json").read_text())
    assert {p["problem_id"]: p["c"] for p in result["per_problem"]} == correct_count
    # pass@k(n=4): c=0 → 0; c=1 → ¼, ½, 1; c=2 → ½, ⅚, 1; c=3 → ¾, 1, 1; c=4 → 1
    assert result["pass_at_k"]["1"] == pytest.approx((0 + 0.25 + 0.5 + 1 + 0.75 + 0.25) / 6)
    assert result["pass_at_k"]["2"] == pytest.approx((0 + 0.5 + 5 / 6 + 1 + 1 + 0.5) / 6)
    assert result["pass_at_k"]["4"] == pytest.approx(5 / 6)
    # maj@4 = the vote of all four: c=1 ties the right answer with 999999 (½), c ≥ 2 wins, c=0 loses
    assert result["maj_at_k"]["4"] == pytest.approx((0 + 0.5 + 1 + 1 + 1 + 0.5) / 6)
    assert result["samples_to_first_correct"]["solved_fraction"] == pytest.approx(5 / 6)
    assert set(store.read_shard(0)["score"]) <= {0.0, 1.0}
    original = json.loads((reference_run / "eval.json").read_text())
    assert {k: result[k] for k in ("model_path", "sampling", "seed", "data_hash", "task", "split")} == {
        k: original[k] for k in ("model_path", "sampling", "seed", "data_hash", "task", "split")}


def test_model_pointer_and_greedy_sampling(tiny_model, data_file, tmp_path):
    pointer = tmp_path / "model.json"
    pointer.write_text(json.dumps({"model_path": str(tiny_model), "checkpoint_step": 7}))
    args = eval_args(tiny_model, data_file, tmp_path / "greedy", "--set", "eval.temperature=0", "--limit", "2", n=3)
    args[1:3] = ["--model-pointer", str(pointer)]
    assert cli.main(args) == 0
    result = json.loads((tmp_path / "greedy" / "eval.json").read_text())
    assert result["checkpoint_step"] == 7 and result["model_path"] == str(tiny_model.resolve())
    assert result["num_problems"] == 2
    for shard in read_shards(tmp_path / "greedy"):
        by_problem: dict[str, set[str]] = {}
        for pid, response in zip(shard["problem_id"], shard["response"]):
            by_problem.setdefault(pid, set()).add(response)
        assert all(len(responses) == 1 for responses in by_problem.values())  # greedy: n identical samples


def test_stop_and_length_finish_reasons(eos_prone_model, data_file, tmp_path):
    out = tmp_path / "eos"
    assert cli.main(eval_args(eos_prone_model, data_file, out, n=8, max_new_tokens=6, batch_size=16)) == 0
    rows = [(t, f, r) for shard in read_shards(out)
            for t, f, r in zip(shard["num_tokens"], shard["finish_reason"], shard["response"])]
    assert {f for _, f, _ in rows} == {"stop", "length"}
    assert all(t == 6 for t, f, _ in rows if f == "length")
    assert all(1 <= t <= 6 for t, f, _ in rows if f == "stop")  # the count includes <|im_end|> …
    assert not any("<|im_end|>" in r or "<|endoftext|>" in r for _, _, r in rows)  # … the text does not


def test_bad_inputs_are_named(tiny_model, data_file, tmp_path, capsys):
    assert cli.main(eval_args(tiny_model, tmp_path / "missing.parquet", tmp_path / "a")) == 2
    assert "missing.parquet: data file not found" in capsys.readouterr().err
    bad = write_split(tmp_path / "bad" / "test.parquet", drop="reward_model")
    assert cli.main(eval_args(tiny_model, bad, tmp_path / "b")) == 2
    assert "missing column(s) ['reward_model']" in capsys.readouterr().err
    assert cli.main(eval_args(tiny_model, data_file, tmp_path / "c", "--set", "eval.ks=[1,8]")) == 2
    assert "eval.ks: k = 8 needs n_samples ≥ k, not 4" in capsys.readouterr().err
    pointer = tmp_path / "pointer.json"
    pointer.write_text(json.dumps({"checkpoint_step": 3}))
    args = eval_args(tiny_model, data_file, tmp_path / "d")
    args[1:3] = ["--model-pointer", str(pointer)]
    assert cli.main(args) == 2
    assert "needs the key 'model_path'" in capsys.readouterr().err
    assert cli.main(eval_args(tmp_path / "no_model", data_file, tmp_path / "e")) == 2
    assert "model directory not found" in capsys.readouterr().err
    assert cli.main(["eval", "--rescore", "--out", str(tmp_path / "nothing")]) == 2
    assert "no sample store (nothing to rescore)" in capsys.readouterr().err


def test_eval_metrics_are_flat_and_named_under_the_split(reference_run):
    result = json.loads((reference_run / "eval.json").read_text())
    metrics = eval_metrics(result)
    assert [name for name in metrics if name.startswith("test/pass_at_") and name[-1].isdigit()] == [
        "test/pass_at_1", "test/pass_at_2", "test/pass_at_4"]
    assert metrics["test/pass_at_4"] == result["pass_at_k"]["4"]
    assert metrics["test/mean_at_n"] == result["mean_at_n"]
    assert metrics["test/n_samples"] == 4.0
    assert all(isinstance(v, float) for v in metrics.values())
    assert eval_metrics({**result, "split": "dev"}).keys() == {n.replace("test/", "dev/", 1) for n in metrics}


@pytest.mark.slow
def test_data_parallel_processes_match_one_process(reference_run, tiny_model, data_file, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the spawned workers, like this process
    out = tmp_path / "dp"
    assert cli.main(eval_args(tiny_model, data_file, out, "--set", "eval.data_parallel_size=2")) == 0
    for name in ("shard-00000.parquet", "shard-00001.parquet", "shard-00002.parquet"):
        assert (out / "samples" / name).read_bytes() == (reference_run / "samples" / name).read_bytes()
    assert (out / "eval.json").read_text() == (reference_run / "eval.json").read_text()


def test_batch_plan_covers_every_sample_once():
    lengths = [5, 3, 9, 3, 7]
    for n, batch in [(4, 6), (4, 8), (8, 3), (256, 64), (5, 5), (1, 2)]:
        calls = plan_batches(lengths, n, batch)
        seen = [(p, start + i) for call in calls for p, start, count in call for i in range(count)]
        assert sorted(seen) == [(p, s) for p in range(5) for s in range(n)]
        assert all(sum(count for _, _, count in call) <= max(batch, 1) for call in calls)
        assert all(len({count for _, _, count in call}) == 1 for call in calls)  # one num_return_sequences


def test_shard_plan_and_seeds_are_deterministic():
    plan = shard_plan(10, 3, seed=5)
    assert [len(s) for s in plan] == [3, 3, 3, 1]
    assert sorted(np.concatenate(plan).tolist()) == list(range(10))
    assert [s.tolist() for s in shard_plan(10, 3, seed=5)] == [s.tolist() for s in plan]
    assert [s.tolist() for s in shard_plan(10, 3, seed=6)] != [s.tolist() for s in plan]
    assert derived_seed(5, 0) == derived_seed(5, 0) != derived_seed(5, 1)
    assert 0 <= derived_seed(2**40, 7) < 2**62
