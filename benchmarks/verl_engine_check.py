"""G1 of docs/gpu-validation.md: the RepExp engine inside verl's TrainingWorker vs plain transformers.

    python benchmarks/verl_engine_check.py --model /models/Qwen2.5-0.5B-Instruct --out results/g1   # 1 GPU
    python benchmarks/verl_engine_check.py --model <tiny> --cpu --dtype fp32 --attn sdpa              # CPU smoke

One process, one rank (no Ray). For each FSDP strategy it builds the representation engine
exactly as `RepExpActorRolloutRefWorker.init_model` does (`build_repexp_worker_config` on the
Hydra-composed ``actor_rollout_ref`` node), feeds the same rollouts in verl's layouts (V1
jagged with and without remove-padding, dynamic batch size, the legacy left/right-padded layout)
and compares the response-mean features with one unpadded plain-transformers forward per
sequence. Checks: cosine > 0.999 everywhere (bf16), the parameters are back on the CPU after the
forward (forward-only engines offload them), no LM head. Writes ``<out>/engine_check.json``;
exit status 1 on a failed check.

The batch layouts, the worker build and (``--cpu``) the CPU platform are the ones
tests/test_verl_runtime.py runs on CPU: they live in tests/ (`verl_layouts`, `verl_platform_cpu`),
which this script puts on ``sys.path``, so the check and the tests feed verl the same batches.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.append(str(ROOT / "tests"))  # the helpers shared with tests/test_verl_runtime.py; last: shadows nothing

from verl_layouts import build_worker, hidden_means, v0_batch, v1_batch  # noqa: E402

COSINE_MIN = 0.999


def reference_means(backbone, prompts, responses, device) -> torch.Tensor:
    """Plain transformers: one unpadded forward per sequence, float32 mean over the response tokens."""
    with torch.no_grad():
        return torch.stack([
            backbone(torch.cat([p, r])[None].to(device), use_cache=False)
            .last_hidden_state[0, len(p):].float().mean(0).cpu()
            for p, r in zip(prompts, responses)
        ])


def random_rollouts(seed: int, count: int, vocab: int, max_prompt: int, max_response: int):
    gen = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(max(2, max_prompt // 4), max_prompt + 1, (count,), generator=gen)
    response_lengths = torch.randint(1, max_response + 1, (count,), generator=gen)
    prompts = [torch.randint(3, vocab, (int(n),), generator=gen) for n in prompt_lengths]
    responses = [torch.randint(3, vocab, (int(n),), generator=gen) for n in response_lengths]
    return prompts, responses


def compose_actor_rollout_ref(model: str, strategy: str, dtype: str, attn: str, micro: int, remove_padding: bool):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="repexp.verl.config", version_base="1.3"):
        cfg = compose(config_name="repexp_trainer", overrides=[
            f"actor_rollout_ref.model.path={model}",
            f"actor_rollout_ref.repexp.strategy={strategy}",
            f"actor_rollout_ref.repexp.dtype={dtype}",
            f"actor_rollout_ref.repexp.attn_implementation={attn}",
            f"actor_rollout_ref.repexp.micro_batch_size_per_gpu={micro}",
            f"actor_rollout_ref.repexp.use_remove_padding={str(remove_padding).lower()}",
        ])
    return cfg.actor_rollout_ref


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=1).min())


def check_strategy(args, strategy: str, prompts, responses, reference, device) -> dict:
    arr = compose_actor_rollout_ref(args.model, strategy, args.dtype, args.attn, args.micro, remove_padding=True)
    start = time.perf_counter()
    worker = build_worker(arr)
    result = {"build_s": time.perf_counter() - start}
    module = worker.repexp.engine.module
    result["no_lm_head"] = not any(name.startswith("lm_head") for name, _ in module.named_parameters())
    layouts = {
        "v1_packed": dict(use_remove_padding=True),
        "v1_padded": dict(use_remove_padding=False),
        "v1_packed_dynamic_bsz": dict(use_remove_padding=True, use_dynamic_bsz=True,
                                      max_token_len_per_gpu=args.max_tokens),
    }
    for name, flags in layouts.items():
        start = time.perf_counter()
        means = hidden_means(worker, v1_batch(prompts, responses), **flags)
        result[name] = {"min_cosine": _cosine(means, reference), "seconds": time.perf_counter() - start}
    means = hidden_means(worker, v0_batch(prompts, responses), use_remove_padding=True)
    result["v0_packed"] = {"min_cosine": _cosine(means, reference)}
    local = [p.to_local() if hasattr(p, "to_local") else p for p in module.parameters()]
    result["params_on_cpu_after_forward"] = all(t.device.type == "cpu" for t in local)
    if device.type == "cuda":
        result["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
    del worker, module, local
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="local Hugging Face causal-LM directory")
    parser.add_argument("--strategies", nargs="+", default=["fsdp", "fsdp2"], choices=["fsdp", "fsdp2"])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--attn", default="flash_attention_2")
    parser.add_argument("--micro", type=int, default=4, help="micro-batch size of the fixed-size layouts")
    parser.add_argument("--max-tokens", type=int, default=4096, help="token budget of the dynamic layout")
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--cpu", action="store_true", help="run on CPU through tests/verl_platform_cpu.py (smoke run)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not Path(args.model).is_dir():
        print(f"--model: {args.model} is not a local model directory", file=sys.stderr)
        return 2

    from transformers import AutoConfig, AutoModel

    with contextlib.ExitStack() as stack:
        if args.cpu:
            import verl_platform_cpu as platform_cpu

            stack.enter_context(platform_cpu.cpu_platform())
            stack.enter_context(platform_cpu.single_process_group())
            strategies = [s for s in args.strategies if s == "fsdp2"]  # FSDP1 needs an accelerator
            device = torch.device("cpu")
        else:
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
            os.environ.setdefault("LOCAL_RANK", "0")
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29517")
            strategies = args.strategies
            device = torch.device("cuda")
        vocab = AutoConfig.from_pretrained(args.model).vocab_size
        prompt_len, response_len = (12, 12) if args.cpu else (200, 300)
        prompts, responses = random_rollouts(0, args.rollouts, vocab, prompt_len, response_len)
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
        backbone = AutoModel.from_pretrained(args.model, dtype=dtype, attn_implementation=args.attn).to(device).eval()
        reference = reference_means(backbone, prompts, responses, device)
        del backbone
        report = {"model": args.model, "dtype": args.dtype, "attn": args.attn, "rollouts": args.rollouts,
                  "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"}
        for strategy in strategies:
            report[strategy] = check_strategy(args, strategy, prompts, responses, reference, device)

    failures = []
    for strategy in strategies:
        for name, value in report[strategy].items():
            if isinstance(value, dict) and value.get("min_cosine", 1.0) <= COSINE_MIN:
                failures.append(f"{strategy}:{name}")
            if value is False:
                failures.append(f"{strategy}:{name}")
    report["failures"] = failures
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "engine_check.json").write_text(text + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
