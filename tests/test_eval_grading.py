"""Graders in `repexp eval`: both curves in eval.json from stored samples, re-grading, and the config routing.

No model: the sample store is opened by `repexp eval --max-shards 0` and its shards are written by
hand with responses on which the two graders disagree, so every number below is hand-computed.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from repexp import cli
from repexp import config as C
from repexp.evaluate import runner
from repexp.evaluate.core import shard_plan
from repexp.evaluate.store import SampleStore

GSM8K, MATH = "openai/gsm8k", "DigitalLearningGmbH/MATH-lighteval"
COLUMN = "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"
# (data_source, gold, four responses, repexp scores, paper scores)
PROBLEMS = [
    (GSM8K, "18", ["#### 18", "#### 18.00", "#### $18", "#### 17"], [1, 1, 1, 0], [1, 0, 0, 0]),
    (GSM8K, "5", ["#### 5", "#### 5", "#### Step 2: add\n\\boxed{5}", "no idea"], [1, 1, 1, 0], [1, 1, 0, 0]),
    (MATH, COLUMN, ["\\boxed{\\begin{bmatrix}1\\\\2\\end{bmatrix}}", "\\boxed{7}", "\\boxed{7}", "\\boxed{7}"],
     [1, 0, 0, 0], [0, 0, 0, 0]),
    (MATH, "\\frac{1}{2}", ["\\boxed{\\frac12}", "\\boxed{0.5}", "\\boxed{1/2}", "\\boxed{\\text{half}}"],
     [1, 1, 1, 0], [1, 1, 1, 0]),
]
N = 4


def write_split(path):
    rows = [{
        "data_source": source,
        "prompt": [{"role": "user", "content": f"Problem {i}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gold},
        "extra_info": {"split": "test", "index": i, "problem_id": f"toy/test/{i}"},
    } for i, (source, gold, *_rest) in enumerate(PROBLEMS)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def stored_run(tmp_path, name="run"):
    """A complete sample store holding the hand-written responses (scores left stale on purpose)."""
    data = write_split(tmp_path / "toy" / "test.parquet")
    out = tmp_path / name
    args = ["eval", "--model", "someorg/somemodel", "--data", str(data), "--out", str(out), "--set", "eval.engine=hf",
            f"eval.n_samples={N}", "eval.shard_size=3", "--seed", "1", "--max-shards", "0", "--no-progress"]
    assert cli.main(args) == 0  # opens the store (meta.json), generates nothing
    store = SampleStore(out)
    plan = shard_plan(len(PROBLEMS), 3, 1)
    for i, idx in enumerate(plan):
        rows = {c: [] for c in ("problem_id", "sample_index", "response", "num_tokens", "finish_reason", "score",
                                "answer", "data_source", "ground_truth")}
        for j in idx:
            source, gold, responses, *_ = PROBLEMS[int(j)]
            for s, response in enumerate(responses):
                rows["problem_id"].append(f"toy/test/{int(j)}")
                rows["sample_index"].append(s)
                rows["response"].append(response)
                rows["num_tokens"].append(5)
                rows["finish_reason"].append("stop")
                rows["score"].append(0.0)
                rows["answer"].append(None)
                rows["data_source"].append(source)
                rows["ground_truth"].append(gold)
        store.write_shard(i, rows)
    return data, out, args


def expected_curve(column):
    counts = [sum(p[column]) for p in PROBLEMS]  # 3, 3, 1, 3 (repexp) / 1, 2, 0, 3 (paper)
    pass1 = sum(c / N for c in counts) / len(counts)
    pass4 = sum(c > 0 for c in counts) / len(counts)
    return counts, pass1, pass4


def test_eval_json_reports_both_graders_from_the_stored_samples(tmp_path):
    _, out, _ = stored_run(tmp_path)
    assert cli.main(["eval", "--rescore", "--out", str(out)]) == 0
    result = json.loads((out / "eval.json").read_text())
    counts, pass1, pass4 = expected_curve(3)
    paper_counts, paper1, paper4 = expected_curve(4)
    assert result["grader"] == "repexp"
    assert [p["c"] for p in result["per_problem"]] == counts
    assert result["pass_at_k"]["1"] == pytest.approx(pass1) and result["pass_at_k"]["4"] == pytest.approx(pass4)
    assert result["graders"]["repexp"]["pass_at_k"] == result["pass_at_k"]
    assert result["graders"]["repexp"]["pass_at_k_sem"] == result["pass_at_k_sem"]
    paper = result["graders"]["paper"]
    assert paper["pass_at_k"]["1"] == pytest.approx(paper1) and paper["pass_at_k"]["4"] == pytest.approx(paper4)
    assert paper["num_correct"] == sum(paper_counts) and paper["mean_at_n"] == pytest.approx(paper1)
    assert result["grader_agreement"] == {"samples": 16, "agree_fraction": 12 / 16, "repexp_only_correct": 4,
                                          "paper_only_correct": 0}


def test_rescore_under_the_other_grader_swaps_the_roles(tmp_path):
    _, out, _ = stored_run(tmp_path)
    assert cli.main(["eval", "--rescore", "--out", str(out)]) == 0
    first = json.loads((out / "eval.json").read_text())
    assert cli.main(["eval", "--rescore", "--grader", "paper", "--out", str(out)]) == 0
    result = json.loads((out / "eval.json").read_text())
    assert result["grader"] == "paper" and result["graders"] == first["graders"]
    assert result["pass_at_k"] == first["graders"]["paper"]["pass_at_k"]
    assert [p["c"] for p in result["per_problem"]] == expected_curve(4)[0]
    agreement = result["grader_agreement"]
    assert agreement["paper_only_correct"] == 0 and agreement["repexp_only_correct"] == 4
    store = SampleStore(out)
    assert store.read_meta()["grader"] == "paper"
    scores = {(pid, s): v for i in range(2) for pid, s, v in zip(*(store.read_shard(i)[c] for c in
                                                                    ("problem_id", "sample_index", "score")))}
    assert scores[("toy/test/0", 1)] == 0.0 and scores[("toy/test/0", 0)] == 1.0  # "#### 18.00" under paper
    # a rescore without --grader keeps the store's grader
    assert cli.main(["eval", "--rescore", "--out", str(out)]) == 0
    assert json.loads((out / "eval.json").read_text())["grader"] == "paper"


def test_a_resumed_run_under_another_grader_regrades_without_generating(tmp_path):
    _, out, args = stored_run(tmp_path)
    assert cli.main(["eval", "--rescore", "--out", str(out)]) == 0  # an eval.json under repexp
    # every shard is complete, so no engine is loaded (the model id does not even exist)
    assert cli.main([a for a in args if a not in ("--max-shards", "0")] + ["--grader", "paper"]) == 0
    result = json.loads((out / "eval.json").read_text())
    assert result["grader"] == "paper" and [p["c"] for p in result["per_problem"]] == expected_curve(4)[0]
    assert SampleStore(out).read_meta()["grader"] == "paper"
    assert runner.stored_grader({}) == "repexp"  # stores from before graders existed
    # an interrupted re-grade leaves no eval.json of the old grader beside the new scores
    store = SampleStore(out)
    runner.regrade(store, store.complete_shards(), "repexp", workers=1)
    assert not (out / "eval.json").exists()


def test_the_config_key_reaches_every_consumer(tmp_path):
    with pytest.raises(C.ConfigError, match="^grader: 'verl' is not one of repexp, paper"):
        C.load({"grader": "verl"})
    paper = C.load("configs/paper.yaml")
    assert paper.grader == "paper" and C.PipelineConfig().grader == "repexp"
    spec = next(s for s in C.sweep_runs(paper) if s.trains)
    rc = C.compose(paper, spec)
    assert rc.grader == "paper"
    assert C.RunConfig.from_dict({k: v for k, v in rc.to_dict().items() if k != "grader"}).grader == "repexp"

    from repexp.verl.overrides import build_overrides

    overrides = build_overrides(rc)
    assert "reward.custom_reward_function.name=compute_score_paper" in overrides
    from repexp.verl import reward

    assert reward.compute_score_paper("openai/gsm8k", "#### 42.00", "42") == 0.0
    assert reward.compute_score("openai/gsm8k", "#### 42.00", "42") == 1.0


def char_tokenizer(texts):
    """A real (character-level) Hugging Face tokenizer, built in milliseconds instead of training a BPE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1}
    for ch in sorted(set("".join(texts))):
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def test_trl_reward_scores_under_the_run_grader():
    import torch

    from repexp.trl.reward import RepExpReward

    texts = ["#### 42.00", "#### 42"]
    tokenizer = char_tokenizer(texts)
    raw = {"sweep": {"tasks": ["gsm8k"], "backends": ["trl"], "betas": [0.01], "seeds": [1]},
           "train": {"n_rollouts": 2, "train_batch_size": 2, "ppo_mini_batch_size": 2}}
    prompts = [[{"role": "user", "content": "What is 40 + 2?"}]] * 2
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert tokenizer.batch_decode(ids, skip_special_tokens=True) == texts
    verifier_mean = {}
    for grader in ("repexp", "paper"):
        cfg = C.compose(C.load({**raw, "grader": grader}), C.RunSpec.of("gsm8k", "grpo", "trl", 1))
        reward = RepExpReward(cfg, tokenizer, optimizer_steps_per_step=1, device=torch.device("cpu"))
        reward(prompts, [[{"role": "assistant", "content": t}] for t in texts], ids, data_source=["openai/gsm8k"] * 2,
               reward_model=[{"ground_truth": "42"}] * 2)
        verifier_mean[grader] = reward.last_metrics["reward/verifier/mean"]
    assert verifier_mean == {"repexp": 1.0, "paper": 0.5}


def test_aggregate_tabulates_both_graders(tmp_path, capsys):
    from test_aggregate import log_linear, write_eval

    from repexp import aggregate

    root = tmp_path / "eval"
    for run, a in (("verl_grpo_s41", 0.5), ("verl_repexp_k32_b0.01_s41", 0.6), ("base", 0.4)):
        ours, theirs = log_linear(a), log_linear(a - 0.1)
        write_eval(root, "math", run, ours, grader="repexp", graders={
            "repexp": {"pass_at_k": {str(k): v for k, v in ours.items()}},
            "paper": {"pass_at_k": {str(k): v for k, v in theirs.items()},
                      "pass_at_k_sem": {str(k): 0.02 for k in theirs}}})
    paths = aggregate.find_eval_files(root)
    config = tmp_path / "cfg.yaml"
    config.write_text("grader: paper\nsweep: {tasks: [math], backends: [verl], sparse_dims: [32], betas: [0.01], "
                      "seeds: [41]}\n")
    assert cli.main(["aggregate", "--inputs", *map(str, paths), "--out-dir", str(tmp_path / "out"),
                     "--config", str(config)]) == 0
    table = aggregate.read_table(tmp_path / "out" / "pass_at_k.csv")
    grpo = table[(table.run == "verl_grpo_s41") & (table.k == 256)].iloc[0]
    assert grpo.grader == "paper" and grpo.pass_at_k == pytest.approx(0.8) and grpo["sem"] == pytest.approx(0.02)
    assert grpo.pass_at_k_repexp == pytest.approx(0.9) and grpo.pass_at_k_paper == pytest.approx(0.8)
    md = (tmp_path / "out" / "pass_at_k.md").read_text()
    assert "## Mean over seeds (paper grader)" in md and "## Mean over seeds (repexp grader, same samples)" in md
    # without a config the files' own grader (repexp) heads the table
    result = aggregate.aggregate(paths, tmp_path / "o2")
    assert set(result["table"].grader) == {"repexp"}
    assert result["table"].pass_at_k.equals(result["table"].pass_at_k_repexp)

    # files graded differently cannot share a table unless a grader is chosen
    data = json.loads(paths[0].read_text())
    data["grader"], data["pass_at_k"] = "paper", data["graders"]["paper"]["pass_at_k"]
    paths[0].write_text(json.dumps(data))
    with pytest.raises(ValueError, match="runs were graded differently"):
        aggregate.aggregate(paths, tmp_path / "o3")
    assert aggregate.aggregate(paths, tmp_path / "o3", grader="repexp")["table"].grader.eq("repexp").all()
    # an eval.json from before both graders were reported names the command that adds the curve
    old = write_eval(tmp_path / "old", "math", "base", log_linear(0.4))
    with pytest.raises(ValueError, match="no pass@k under the paper grader.*repexp eval --rescore"):
        aggregate.load_evals([old], grader="paper")
    assert cli.main(["aggregate", "--inputs", str(old), "--out-dir", str(tmp_path / "o4"),
                     "--set", "grader=paper"]) == 1
    assert "--rescore" in capsys.readouterr().err
