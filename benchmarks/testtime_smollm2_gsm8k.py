"""Test-time RepExp on real weights: SmolLM2-135M-Instruct on a GSM8K test subset (docs/evaluation.md).

    # given an evaluation (the lead's H200 run; GPU when present, about a minute for 128 × 256 samples):
    python benchmarks/testtime_smollm2_gsm8k.py --model .cache/smollm2 --eval-dir .cache/testtime/eval \\
        --out .cache/testtime
    # or generate the evaluation first (first --problems GSM8K test problems × --n-samples, T = 1.0):
    python benchmarks/testtime_smollm2_gsm8k.py --model .cache/smollm2 --problems 128 --n-samples 256 \\
        --out .cache/testtime [--engine hf --batch-size 1024]

`.cache/smollm2` comes from `repexp model smollm2 --out .cache/smollm2`. Runs `repexp eval` (only without
--eval-dir; resumable) and `repexp testtime` (features of the frozen SmolLM2 itself, sparse_dim 32,
λ = 0.01, 2,000 bootstrap replicates over problems), then writes `summary.json` and `summary.md` in
--out: pass@k of both orders, verifier efficiency at every reference k and samples-to-correct, each
with its 95% interval, plus timings. Not a test: no threshold.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))


def summary_markdown(result: dict, timings: dict) -> str:
    eff, stc = result["efficiency"], result["samples_to_correct"]
    ks = result["k"]
    lines = [f"# Test-time RepExp: {result['num_problems']} problems × {result['n_samples']} samples "
             f"({result.get('task')}, feature model {Path(result['settings']['feature_model']).name}, "
             f"sparse_dim {result['settings']['sparse_dim']}, λ {result['settings']['lamb']})", "",
             f"samples-to-correct over {stc['num_solved']} solved problems: random {stc['random']}, "
             f"RepExp {stc['repexp']}, ratio {stc['ratio']} (95% CI {stc.get('ratio_ci95')})", "",
             "| k | pass@k random | pass@k RepExp | k RepExp needs for random's pass@k | efficiency | 95% CI |",
             "|---|---|---|---|---|---|"]
    for i, k in enumerate(eff["reference_k"]):
        at = ks.index(k)
        ci = (eff.get("ratio_ci95") or [None] * len(eff["reference_k"]))[i]
        ratio = eff["ratio"][i]
        lines.append(f"| {k} | {result['pass_at_k_random'][at]:.4f} | {result['pass_at_k_repexp'][at]:.4f} | "
                     f"{eff['k_repexp'][i]} | {'–' if ratio is None else f'{ratio:.2f}×'} | "
                     f"{'–' if ci is None else f'[{ci[0]:.2f}, {ci[1]:.2f}]'} |")
    lines += ["", f"timings (s): {json.dumps(timings)}", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / ".cache" / "smollm2")
    parser.add_argument("--eval-dir", type=Path, help="an existing evaluation (skip generation)")
    parser.add_argument("--problems", type=int, default=128)
    parser.add_argument("--n-samples", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--batch-size", type=int, default=1024, help="hf engine: sequences per generate call")
    parser.add_argument("--feature-batch-size", type=int, default=256, help="sequences per feature forward")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "testtime")
    parser.add_argument("extra", nargs="*", help="more `repexp eval` settings, eval.KEY=VALUE (after --)")
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        print(f"{args.model}: run `repexp model smollm2 --out {args.model}` first", file=sys.stderr)
        return 2
    from repexp import cli

    timings = {}
    eval_dir = args.eval_dir
    if eval_dir is None:
        from eval_smollm2_gsm8k import find_gsm8k_test, write_problems

        eval_dir = args.out / "eval"
        data = write_problems(find_gsm8k_test(), args.out / "data" / "gsm8k" / "test.parquet", args.problems)
        started = time.perf_counter()
        code = cli.main(["eval", "--model", str(args.model), "--data", str(data), "--out", str(eval_dir),
                         "--seed", "0", "--no-progress", "--set", f"eval.engine={args.engine}",
                         f"eval.n_samples={args.n_samples}", "eval.temperature=1.0", "eval.top_p=1.0",
                         f"eval.max_new_tokens={args.max_new_tokens}", f"eval.batch_size={args.batch_size}",
                         "eval.shard_size=16", *args.extra])
        timings["eval"] = round(time.perf_counter() - started, 1)
        if code != 0:
            return code
    started = time.perf_counter()
    code = cli.main(["testtime", "--eval-dir", str(eval_dir), "--model", str(args.model), "--out",
                     str(args.out / "testtime"), "--set", f"testtime.batch_size={args.feature_batch_size}",
                     f"testtime.bootstrap={args.bootstrap}"])
    timings["testtime"] = round(time.perf_counter() - started, 1)
    if code != 0:
        return code
    result = json.loads((args.out / "testtime" / "testtime.json").read_text())
    timings.update({f"testtime_{k}": v for k, v in result["timing_s"].items()})
    eval_result = json.loads((eval_dir / "eval.json").read_text())
    summary = {"timings_s": timings, "num_problems": result["num_problems"], "n_samples": result["n_samples"],
               "settings": result["settings"], "efficiency": result["efficiency"],
               "samples_to_correct": result["samples_to_correct"],
               "pass_at_k": {"k": result["k"], "random": result["pass_at_k_random"],
                             "repexp": result["pass_at_k_repexp"]},
               "eval": {key: eval_result.get(key) for key in ("pass_at_k", "mean_response_tokens", "truncated_fraction",
                                                               "engine", "sampling")}}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    text = summary_markdown(result, timings)
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
