"""Throughput of the `hf` evaluation engine against a naive per-prompt `generate` loop.

    .venv/bin/python benchmarks/eval_engine.py                 # CPU: offline tiny Qwen2 (or --model DIR)
    python3 benchmarks/eval_engine.py --gpu                     # GPU: random-weight Qwen2.5-1.5B-sized model, bf16

Both paths generate the same prompts × samples with the same sampling settings; the engine batches
several prompts × num_return_sequences per `generate` call (left padding), the baseline calls
`generate` once per sample. On the GPU the engine runs at several batch sizes and the baseline on a
few samples only (its rate is per sample, so that suffices). Prints one JSON object with samples/s,
generated tokens/s and the ratios, all measured in this run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repexp.evaluate.core import SamplingSettings  # noqa: E402
from repexp.evaluate.engines import EngineOptions, HFEngine, encode_prompts, generate_samples  # noqa: E402

SUFFIX = ' Let\'s think step by step and output the final answer after "####".'
QUESTIONS = [
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast and bakes muffins with four. "
    "She sells the rest at $2 each. How much does she make every day?",
    "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
    "Josh buys a house for $80,000 and puts in $50,000 in repairs. This increased the value by 150%. "
    "How much profit did he make?",
    "James runs 3 sprints 3 times a week, 60 meters each. How many meters does he run a week?",
    "Every day, Wendi feeds each of her 20 chickens three cups of feed in three meals. "
    "She gives 15 cups in the morning and 25 in the afternoon. How many cups in the final meal?",
    "Kylar wants 16 glasses. One costs $5, every second one costs 60% of the price. How much does he pay?",
    "Toulouse has twice as many sheep as Charleston, which has 4 times as many as Seattle (20 sheep). "
    "How many sheep do they have together?",
    "Carla downloads a 200 GB file at 2 GB/minute; 40% through, Windows restarts for 20 minutes and she "
    "must start over. How long does the download take?",
]


def prompts_for(tokenizer, count: int) -> list[list[int]]:
    chats = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] + SUFFIX}] for i in range(count)]
    return encode_prompts(tokenizer, chats)


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def time_engine(engine: HFEngine, prompts, settings) -> dict:
    synchronize(engine.device)
    started = time.perf_counter()
    completions = generate_samples(engine, prompts, settings, shard_seed=1, prompt_seeds=[0] * len(prompts))
    synchronize(engine.device)
    seconds = time.perf_counter() - started
    samples = sum(len(row) for row in completions)
    tokens = sum(c.num_tokens for row in completions for c in row)
    return {"samples": samples, "tokens": tokens, "seconds": round(seconds, 3),
            "samples_per_s": samples / seconds, "tokens_per_s": tokens / seconds}


def time_naive(engine: HFEngine, prompts, settings, samples_per_prompt: int) -> dict:
    """One `generate` call per sample: batch 1, no padding, no num_return_sequences."""
    import torch

    config = engine._generation_config(settings, 1)
    synchronize(engine.device)
    started = time.perf_counter()
    samples = tokens = 0
    with torch.inference_mode():
        for ids in prompts:
            input_ids = torch.tensor([ids], device=engine.device)
            for _ in range(samples_per_prompt):
                out = engine.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                            generation_config=config)
                new = out[0, len(ids):]
                eos = torch.isin(new, torch.tensor(engine.eos_ids, device=engine.device)).nonzero()
                tokens += int(eos[0, 0]) + 1 if len(eos) else len(new)
                samples += 1
    synchronize(engine.device)
    seconds = time.perf_counter() - started
    return {"samples": samples, "tokens": tokens, "seconds": round(seconds, 3),
            "samples_per_s": samples / seconds, "tokens_per_s": tokens / seconds}


def cpu_benchmark(args) -> dict:
    import torch

    from repexp.models import build_tiny_qwen2

    # One thread by default: on a shared 2-core machine two OpenMP threads wait on each other
    # whenever the other core is busy (measured: 15-60x slower per step under load 2-3).
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or build_tiny_qwen2(Path(tmp) / "tiny", seed=0)
        engine = HFEngine.load(str(model_dir), EngineOptions(batch_size=args.batch_size, dtype="float32"))
    settings = SamplingSettings(n=args.n, max_new_tokens=args.max_new_tokens, seed=0)
    prompts = prompts_for(engine.tokenizer, args.prompts)
    time_engine(engine, prompts[:1], SamplingSettings(n=2, max_new_tokens=4))  # warm-up
    batched = time_engine(engine, prompts, settings)
    naive = time_naive(engine, prompts, settings, args.n)
    return {
        "device": "cpu", "torch_threads": torch.get_num_threads(),
        "model": str(args.model or "tiny Qwen2 (hidden 128)"),
        "prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
        "hf_engine": batched, "naive_loop": naive,
        "speedup_samples_per_s": batched["samples_per_s"] / naive["samples_per_s"],
    }


QWEN25_1_5B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                   num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                   rope_theta=1_000_000.0, tie_word_embeddings=True)


def gpu_benchmark(args) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from repexp.models import build_tokenizer

    if not torch.cuda.is_available():
        raise SystemExit("--gpu needs CUDA")
    tokenizer = build_tokenizer()  # offline BPE (4,096 tokens); ids beyond it decode to nothing
    tokenizer.padding_side = "left"
    config = Qwen2Config(**QWEN25_1_5B, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    started = time.perf_counter()
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        model = Qwen2ForCausalLM(config)
        torch.set_default_dtype(torch.float32)
    build_s = time.perf_counter() - started
    params = sum(p.numel() for p in model.parameters())
    settings = SamplingSettings(n=args.n, max_new_tokens=args.max_new_tokens, seed=0)
    engine = HFEngine(model, tokenizer, [tokenizer.eos_token_id], EngineOptions(batch_size=64))
    prompts = prompts_for(tokenizer, args.prompts)
    time_engine(engine, prompts[:1], SamplingSettings(n=8, max_new_tokens=8))  # warm-up (kernels, allocator)
    naive = time_naive(engine, prompts[:1], settings, args.naive_samples)
    runs = {}
    for batch_size in args.batch_sizes:
        engine.options = EngineOptions(batch_size=batch_size)
        torch.cuda.reset_peak_memory_stats()
        run = time_engine(engine, prompts, settings)
        run["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
        run["speedup_vs_naive"] = run["samples_per_s"] / naive["samples_per_s"]
        runs[str(batch_size)] = run
        print(f"batch {batch_size}: {run['samples_per_s']:.1f} samples/s, {run['tokens_per_s']:.0f} tok/s",
              file=sys.stderr, flush=True)
    return {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "model": f"random Qwen2 with Qwen2.5-1.5B dims ({params / 1e9:.2f} B params), bf16, sdpa",
        "build_s": round(build_s, 1), "prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens,
        "prompt_tokens": [len(p) for p in prompts], "naive_loop": naive, "hf_engine_by_batch_size": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="GPU benchmark (real-size random model)")
    parser.add_argument("--model", type=Path, help="CPU: a Hugging Face model directory instead of the tiny model")
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--n", type=int, default=None, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=64, help="CPU: engine batch size")
    parser.add_argument("--threads", type=int, default=1, help="CPU: torch threads")
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[64, 128, 256, 512])
    parser.add_argument("--naive-samples", type=int, default=4, help="GPU: baseline samples (rate per sample)")
    args = parser.parse_args()
    if args.gpu:
        args.prompts, args.n, args.max_new_tokens = args.prompts or 8, args.n or 64, args.max_new_tokens or 256
        result = gpu_benchmark(args)
    else:
        args.prompts, args.n, args.max_new_tokens = args.prompts or 8, args.n or 8, args.max_new_tokens or 48
        result = cpu_benchmark(args)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
