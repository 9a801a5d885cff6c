"""G0 of docs/gpu-validation.md: the RepExp feature pooling and bonus on a GPU with torch + transformers only.

    python benchmarks/verl_gpu_check.py --out results/            # CUDA, Qwen2.5-7B-sized random weights
    python benchmarks/verl_gpu_check.py --quick --device cpu      # smoke run of this script

No verl, no vLLM, no Hub access. A random-weight Qwen2 backbone with Qwen2.5-7B's shapes runs in
bfloat16; the response-mean features of `repexp.features` in each layout the verl engine uses
(packed sequences, right-padded rows, the recipe's left/right padding) are compared with one
unpadded forward per sequence (the plain-transformers reference). It also checks that
``hidden_states[-1]`` is the final-norm output ``last_hidden_state``, runs the step bonus
(`repexp.bonus_step`, `repexp.elliptical`) on CPU and CUDA features of the same batch, and times
the frozen forward and a pinned host-to-device copy of one rank's offloaded parameter shard.
Results go to ``<out>/gpu_check.json``; the exit status is 1 if a correctness check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from repexp.bonus_step import BonusState, compute_step_bonus  # noqa: E402
from repexp.features import response_mean_masked, response_mean_packed, response_mean_right_padded  # noqa: E402
from repexp.verl.settings import RepExpSettings  # noqa: E402

COSINE_MIN = 0.999  # bf16 features vs the unpadded bf16 reference


def qwen25_7b_shapes(quick: bool):
    from transformers import Qwen2Config

    if quick:
        return Qwen2Config(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    return Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                       rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                       tie_word_embeddings=False)


def build_backbone(config, device: torch.device, dtype: torch.dtype, attn: str):
    from transformers import Qwen2Model

    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2Model(config)
    finally:
        torch.set_default_dtype(default)
    _set_attention(model, attn)
    return model.eval().requires_grad_(False)


def _set_attention(model, attn: str) -> None:
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(attn)
    else:
        model.config._attn_implementation = attn


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _cosines(a: torch.Tensor, b: torch.Tensor) -> dict:
    cos = torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=1)
    rel = (a.double() - b.double()).norm(dim=1) / b.double().norm(dim=1)
    return {"min_cosine": float(cos.min()), "max_rel_l2": float(rel.max())}


def pooling_checks(model, device, vocab: int, quick: bool) -> dict:
    gen = torch.Generator().manual_seed(1)
    count = 6 if quick else 12
    prompt_lengths = torch.randint(8 if quick else 64, 24 if quick else 400, (count,), generator=gen)
    response_lengths = torch.randint(1, 24 if quick else 600, (count,), generator=gen)
    prompts = [torch.randint(0, vocab, (int(n),), generator=gen) for n in prompt_lengths]
    responses = [torch.randint(0, vocab, (int(n),), generator=gen) for n in response_lengths]
    sequences = [torch.cat([p, r]) for p, r in zip(prompts, responses)]

    with torch.no_grad():
        # reference: one unpadded forward per sequence
        reference = torch.stack([
            model(s[None].to(device)).last_hidden_state[0, len(p):].float().mean(0).cpu()
            for s, p in zip(sequences, prompts)
        ])
        results = {}
        # right-padded rows (verl's padded path: each row's sequence in columns [0, len))
        width = max(map(len, sequences))
        ids = torch.zeros(count, width, dtype=torch.long)
        mask = torch.zeros(count, width, dtype=torch.long)
        for i, s in enumerate(sequences):
            ids[i, : len(s)] = s
            mask[i, : len(s)] = 1
        hidden = model(ids.to(device), attention_mask=mask.to(device)).last_hidden_state
        seq_lengths = torch.tensor([len(s) for s in sequences])
        results["right_padded"] = _cosines(response_mean_right_padded(hidden, seq_lengths.to(device),
                                                                      response_lengths.to(device)).cpu(), reference)
        # the recipe's layout: prompts left-padded to P, responses right-padded from column P
        p_width, r_width = int(prompt_lengths.max()), int(response_lengths.max())
        ids = torch.zeros(count, p_width + r_width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        response_mask = torch.zeros_like(ids)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            ids[i, p_width - len(p): p_width + len(r)] = torch.cat([p, r])
            mask[i, p_width - len(p): p_width + len(r)] = 1
            response_mask[i, p_width: p_width + len(r)] = 1
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = model(ids.to(device), attention_mask=mask.to(device),
                       position_ids=position_ids.to(device)).last_hidden_state
        recipe = response_mean_masked(hidden, response_mask.to(device)).cpu()
        results["recipe_left_right_padded"] = _cosines(recipe, reference)
        # packed (verl's remove-padding path): one row, positions restart per sequence, no attention mask
        packed = torch.cat(sequences)[None].to(device)
        positions = torch.cat([torch.arange(len(s)) for s in sequences])[None].to(device)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), seq_lengths.cumsum(0)])
        # use_cache=False as in verl: with a cache transformers does not split packed sequences
        hidden = model(packed, position_ids=positions, use_cache=False).last_hidden_state[0]
        results[f"packed_{model.config._attn_implementation}"] = _cosines(
            response_mean_packed(hidden, offsets.to(device), response_lengths.to(device)).cpu(), reference)
        # the feature is the final-norm output: hidden_states[-1] == last_hidden_state
        out = model(sequences[0][None].to(device), output_hidden_states=True)
        same = torch.equal(out.hidden_states[-1], out.last_hidden_state)
        results["hidden_states_last_is_last_hidden_state"] = bool(same)
    return {"num_sequences": count, "prompt_lengths": prompt_lengths.tolist(),
            "response_lengths": response_lengths.tolist(), "layouts": results}


def flash_packed_check(model, device, vocab: int) -> dict:
    """The production path (flash-attention varlen from position_ids), when flash-attn is installed."""
    try:
        import flash_attn  # noqa: F401
    except ImportError as err:
        return {"skipped": f"flash_attn not importable: {err}"}
    _set_attention(model, "flash_attention_2")
    try:
        return pooling_checks(model, device, vocab, quick=False)["layouts"]
    finally:
        _set_attention(model, "sdpa")


def bonus_checks(hidden_dim: int, device: torch.device, groups: int, n: int) -> dict:
    """compute_step_bonus on the same batch with CPU and with CUDA features; driver-side CPU timing."""
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(groups * n, hidden_dim, generator=gen)
    uids = [f"u{i // n}" for i in range(groups * n)]
    scores = (torch.rand(groups * n, generator=gen) < 0.5).double()
    excluded = torch.zeros(groups * n, dtype=torch.bool)
    out = {"rows": groups * n, "hidden_dim": hidden_dim}
    for sparse_dim in (32, 128):
        settings = RepExpSettings(sparse_dim=sparse_dim, beta=0.01, seed=42)

        def step(hidden, scores, excluded, settings=settings):  # as the verl trainer calls it, fresh state
            state = BonusState(settings, sparse_dim=settings.sparse_dim, seed=settings.seed)
            return compute_step_bonus(hidden, uids, scores, settings, beta=settings.beta, step=7, state=state,
                                      excluded=excluded)

        times = []
        for _ in range(3):
            start = time.perf_counter()
            cpu = step(hidden, scores, excluded)
            times.append(time.perf_counter() - start)
        entry = {"cpu_step_bonus_s_median": statistics.median(times)}
        if device.type == "cuda":
            hidden_dev, scores_dev, excluded_dev = hidden.to(device), scores.to(device), excluded.to(device)
            step(hidden_dev, scores_dev, excluded_dev)  # warm-up
            times = []
            for _ in range(3):
                _sync(device)
                start = time.perf_counter()
                dev = step(hidden_dev, scores_dev, excluded_dev)
                _sync(device)
                times.append(time.perf_counter() - start)
            entry["cuda_step_bonus_s_median"] = statistics.median(times)
            entry["cpu_over_cuda"] = entry["cpu_step_bonus_s_median"] / entry["cuda_step_bonus_s_median"]
            diff = (dev.bonus_raw.cpu() - cpu.bonus_raw).abs().max() / cpu.bonus_raw.abs().max()
            entry["cuda_vs_cpu_max_rel_diff"] = float(diff)
        out[f"sparse_dim_{sparse_dim}"] = entry
    return out


def forward_timing(model, device, vocab: int, quick: bool) -> dict:
    """Frozen bf16 forward, weights resident (no CPU offload): a lower bound per micro-batch."""
    batch, length = (2, 64) if quick else (16, 2048)
    ids = torch.randint(0, vocab, (batch, length), device=device)
    times = []
    with torch.no_grad():
        for i in range(4):
            _sync(device)
            start = time.perf_counter()
            model(ids).last_hidden_state.float().mean(1)
            _sync(device)
            if i:  # first call warms up kernels
                times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return {"batch": batch, "seq_len": length, "seconds_median": seconds, "tokens_per_s": batch * length / seconds}


def offload_copy_timing(device: torch.device, params: int) -> dict:
    """Host->device copy of one rank's bf16 parameter shard from pinned memory (FSDP CPU offload streams it)."""
    if device.type != "cuda":
        return {"skipped": "needs CUDA"}
    shard = torch.empty(params, dtype=torch.bfloat16, pin_memory=True)
    target = torch.empty(params, dtype=torch.bfloat16, device=device)
    times = []
    for _ in range(4):
        torch.cuda.synchronize()
        start = time.perf_counter()
        target.copy_(shard, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times[1:])
    return {"bytes": params * 2, "seconds_median": seconds, "GB_per_s": params * 2 / seconds / 1e9}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (smoke run of the script)")
    parser.add_argument("--out", type=Path, default=None, help="directory for gpu_check.json")
    args = parser.parse_args(argv)
    import transformers

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available", file=sys.stderr)
        return 2
    report = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
              "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or "cpu",
              "quick": args.quick}
    config = qwen25_7b_shapes(args.quick)
    errors = {}

    def section(name, fn, *fn_args):
        # one command on a lent GPU: record a failing section and go on with the others
        try:
            report[name] = fn(*fn_args)
        except Exception as err:  # noqa: BLE001
            errors[name] = f"{type(err).__name__}: {err}"

    start = time.perf_counter()
    model = build_backbone(config, device, torch.bfloat16, "sdpa")
    _sync(device)
    report["build_s"] = time.perf_counter() - start
    report["backbone_params"] = sum(p.numel() for p in model.parameters())
    section("pooling", pooling_checks, model, device, config.vocab_size, args.quick)
    if device.type == "cuda" and not args.quick:
        section("pooling_flash_attention_2", flash_packed_check, model, device, config.vocab_size)
    section("forward", forward_timing, model, device, config.vocab_size, args.quick)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    section("bonus", bonus_checks, config.hidden_size, device, *((16, 8) if args.quick else (1024, 8)))
    section("offload_copy", offload_copy_timing, device, report["backbone_params"] // 8)
    report["errors"] = errors

    layouts = dict(report.get("pooling", {}).get("layouts", {}))
    flash = report.get("pooling_flash_attention_2", {})
    if isinstance(flash, dict) and "skipped" not in flash:
        layouts.update({f"flash:{k}": v for k, v in flash.items()})
    failures = [name for name, value in layouts.items()
                if (isinstance(value, dict) and not value["min_cosine"] > COSINE_MIN) or value is False]
    failures += [f"error in {name}" for name in errors]
    for name, entry in report.get("bonus", {}).items():
        if isinstance(entry, dict) and entry.get("cuda_vs_cpu_max_rel_diff", 0.0) > 1e-4:
            failures.append(f"bonus {name}")
    report["failures"] = failures
    text = json.dumps(report, indent=2, default=lambda o: o if not isinstance(o, float) or math.isfinite(o) else str(o))
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(text + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
