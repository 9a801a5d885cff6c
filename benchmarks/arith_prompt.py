"""How often the local demo's answers are cut off, per prompt form and token cap.

    python benchmarks/arith_prompt.py --model results/models/smollm2 [--samples 8] [--caps 16 32]

Samples SmolLM2-135M-Instruct on 24 `arith` questions of one split (default: train, split seed 0;
the choice of prompt is made there, never on test) at T = 1.0 with plain `transformers.generate`,
for each prompt form (`plain`: the system instruction and the question; `shots`: the same with
worked examples as earlier chat turns, as arith-hard does) and each cap, and prints: the fraction
of samples that hit the cap without an end-of-sequence token (truncated), mean generated tokens,
pass@1 and pass@n graded by the arith verifier (the last number of the response). The prompt is
chosen by truncation (the form of the answers), not by its grade; the grade is printed to check
that the curves stay above zero.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from repexp import arith
from repexp.passk import pass_at_k
from repexp.verify import score


def messages(form: str, question: str) -> list[dict]:
    if form == "plain":
        return [{"role": "system", "content": arith.SYSTEM_PROMPT}, {"role": "user", "content": question}]
    return arith.shot_messages(question)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--questions", type=int, default=24)
    parser.add_argument("--split", choices=["train", "dev", "test"], default="train")
    parser.add_argument("--caps", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--forms", nargs="+", default=["plain", "shots"])
    args = parser.parse_args()
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(args.model)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    questions = arith.split(0)[args.split][: args.questions]
    print(f"| prompt | cap | truncated | mean tokens | pass@1 | pass@{args.samples} | seconds |")
    print("|---|---|---|---|---|---|---|")
    for form in args.forms:
        prompts = [tok.apply_chat_template(messages(form, q.text), tokenize=False, add_generation_prompt=True)
                   for q in questions]
        batch = tok(prompts, return_tensors="pt", padding=True)
        for cap in args.caps:
            started = time.perf_counter()
            with torch.no_grad():
                out = model.generate(**batch, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                     max_new_tokens=cap, num_return_sequences=args.samples,
                                     pad_token_id=tok.pad_token_id)
            new = out[:, batch["input_ids"].shape[1]:]
            ended = (new == tok.eos_token_id).any(dim=1)
            lengths = [int((row == tok.eos_token_id).nonzero()[0]) + 1 if e else cap for row, e in zip(new, ended)]
            texts = tok.batch_decode(new, skip_special_tokens=True)
            correct = np.array([score("repexp/arith", text, str(questions[i // args.samples].answer))
                                for i, text in enumerate(texts)]).reshape(len(questions), args.samples)
            counts = correct.sum(axis=1)
            p1 = np.mean([pass_at_k(args.samples, int(c), 1) for c in counts])
            pn = np.mean([pass_at_k(args.samples, int(c), args.samples) for c in counts])
            print(f"| {form} | {cap} | {1 - ended.float().mean():.2f} | {np.mean(lengths):.1f} | {p1:.3f} | {pn:.3f} "
                  f"| {time.perf_counter() - started:.0f} |", flush=True)
            if cap == args.caps[-1]:
                print("   e.g. " + " / ".join(repr(t[:60]) for t in texts[:3]), flush=True)


if __name__ == "__main__":
    main()
