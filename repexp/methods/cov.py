"""Entropy-preserving updates (Cui et al., arXiv 2505.22617, §4): KL-Cov and Clip-Cov, which restrain the
few tokens whose log-probability and advantage covary most. verl runs its own `policy_loss.loss_mode`;
TRL runs `cov_policy_loss` (docs/methods.md).

`cov_policy_loss` computes what verl 0.9.1's `compute_policy_loss_kl_cov` / `compute_policy_loss_clip_cov`
compute (verl's code was contributed by the paper's authors), for one data-parallel rank
(`global_batch_info` empty). Over the valid tokens (response_mask > 0), per token

    cov = (A − mean A) · (log π − mean log π)        (log π detached in the mean)

KL-Cov: the loss is −A·r with r = π/π_old, NOT clipped, and the ⌊cov_ratio · #valid⌋ tokens (at least
one) of largest cov get + cov_kl_coef·|log π − log π_old| added. Metric: ppo_kl = mean |log r|.

Clip-Cov: the PPO clipped loss max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)); among the valid tokens the
PPO clip did not bind and whose cov lies strictly inside (cov_clip_lb, cov_clip_ub), ⌊cov_ratio · #valid⌋
(at least one) are drawn at random and their loss set to 0 (no gradient, still counted by the
aggregation). Metrics: pg_clipfrac = the fraction of valid tokens so removed (verl's name), ppo_kl =
mean(log π_old − log π). The random draw is `torch.randperm` over the eligible tokens in row-major
order: with `generator` it uses that generator, else the global RNG as verl does; a generator seeded
like the global RNG draws the same tokens as verl.

Settings of the paper's recipes (PRIME-RL/Entropy-Mechanism-of-RL, recipe/dapo/*.sh; Qwen2.5-7B/32B on
DAPO data, n = 8, 256 prompts a step, token-mean, lr 5e-7 (7B) / 1e-6 (32B)): KL-Cov k = 0.2 % (7B) and
0.02 % (32B) of tokens, coefficient 1, PPO clip 0.2; Clip-Cov ratio 2e-4, bounds (1, 5), PPO clip 1.

Pure: standard library at import; torch inside the function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from repexp.methods.base import Method, param

LOSS_MODES = ("kl_cov", "clip_cov")
LOSS_LABELS = {"kl_cov": "KL-Cov", "clip_cov": "Clip-Cov"}
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


@dataclass(frozen=True)
class Params:
    loss_mode: str = param("kl_cov", help="kl_cov (a KL penalty on the top tokens by covariance) or clip_cov "
                           "(the loss of random tokens in a covariance window removed)", enum=LOSS_MODES)
    cov_ratio: float = param(0.002, help="fraction of the batch's valid tokens selected by covariance (the "
                             "paper: KL-Cov 0.002 for 7B, 0.0002 for 32B; Clip-Cov 0.0002)", exclusiveMinimum=0,
                             maximum=1)
    cov_kl_coef: float = param(1.0, help="KL-Cov: coefficient of the |log π − log π_old| penalty (the paper: 1)",
                               minimum=0)
    cov_clip_lb: float = param(1.0, help="Clip-Cov: lower bound of the covariance window (the paper: 1)")
    cov_clip_ub: float = param(5.0, help="Clip-Cov: upper bound of the covariance window (the paper: 5)")


def _masked_sum(values: Any, mask: Any, dim: Optional[int] = None) -> Any:  # verl_F.masked_sum
    import torch

    kept = torch.where(mask.bool(), values, 0.0) * mask
    return kept.sum() if dim is None else kept.sum(dim=dim)


def _masked_mean(values: Any, mask: Any) -> Any:  # verl_F.masked_mean: sum / (count + 1e-8)
    return _masked_sum(values, mask) / (mask.sum() + 1e-8)


def aggregate(loss_mat: Any, mask: Any, loss_agg_mode: str) -> Any:
    """verl's `agg_loss` on one rank: token-mean, seq-mean-token-sum or seq-mean-token-mean."""
    if loss_agg_mode == "token-mean":
        return _masked_sum(loss_mat, mask) / mask.sum()
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode: {loss_agg_mode!r} (known: {', '.join(LOSS_AGG_MODES)})")
    tokens = mask.sum(dim=-1)
    seq_losses = (loss_mat * mask).sum(dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_losses / (tokens + 1e-8)
    seq_mask = (tokens > 0).to(loss_mat.dtype)  # fully masked sequences take no part
    return _masked_sum(seq_losses, seq_mask) / seq_mask.sum()


def cov_policy_loss(log_prob: Any, old_log_prob: Any, advantages: Any, response_mask: Any, params: Params, *,
                    clip_ratio: float, loss_agg_mode: str, clip_ratio_low: Optional[float] = None,
                    clip_ratio_high: Optional[float] = None, generator: Any = None) -> tuple[Any, dict[str, float]]:
    """The KL-Cov or Clip-Cov policy loss (scalar tensor, differentiable in `log_prob`) and its metrics.

    Tensors are [B, T]; `clip_ratio` is PPO's ε (`clip_ratio_low` / `clip_ratio_high` override either
    side, Clip-Cov only: KL-Cov does not clip); `generator`: the torch.Generator of Clip-Cov's draw
    (module docstring)."""
    import torch

    from repexp import metrics as M

    if params.loss_mode not in LOSS_MODES:
        raise ValueError(f"loss_mode: unknown mode {params.loss_mode!r} (known: {', '.join(LOSS_MODES)})")
    if not params.cov_ratio > 0:
        raise ValueError(f"cov_ratio: {params.cov_ratio} must be > 0")
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode: {loss_agg_mode!r} (known: {', '.join(LOSS_AGG_MODES)})")
    mask = response_mask.to(log_prob.dtype)
    valid = response_mask > 0
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    n_valid = int(valid.sum().item())
    selected = torch.zeros_like(valid)

    if params.loss_mode == "kl_cov":
        ppo_kl = _masked_mean(log_ratio.abs(), mask)
        if n_valid > 0:
            adv = advantages[valid].detach().reshape(-1).cpu()
            logp = log_prob[valid].detach().reshape(-1).cpu()
            cov = (adv - adv.mean()) * (logp - logp.mean())
            top = torch.topk(cov, max(1, int(n_valid * params.cov_ratio)), largest=True).indices
            flat = torch.nonzero(valid.reshape(-1), as_tuple=True)[0][top.to(valid.device)]
            selected.view(-1)[flat] = True
        penalised = pg_losses + params.cov_kl_coef * log_ratio.abs()
        pg_losses = torch.where(selected, penalised, pg_losses)
        metrics = {M.POLICY_PPO_KL: ppo_kl.detach().item()}
    else:
        low = clip_ratio if clip_ratio_low is None else clip_ratio_low
        high = clip_ratio if clip_ratio_high is None else clip_ratio_high
        ppo_kl = _masked_mean(-log_ratio, mask)
        clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
        clip_binds = (clipped > pg_losses) & valid
        cov = ((advantages - _masked_mean(advantages, mask))
               * (log_prob - _masked_mean(log_prob.detach(), mask))).detach()
        eligible = (cov > params.cov_clip_lb) & (cov < params.cov_clip_ub) & valid & ~clip_binds
        candidates = torch.nonzero(eligible)
        if len(candidates) > 0:
            take = max(int(params.cov_ratio * n_valid), 1)
            perm = torch.randperm(len(candidates), generator=generator)
            chosen = candidates[perm[: min(take, len(candidates))].to(candidates.device)]
            selected[chosen[:, 0], chosen[:, 1]] = True
        pg_losses = torch.maximum(pg_losses, clipped) * (~selected).to(pg_losses.dtype)
        metrics = {M.POLICY_CLIPFRAC: _masked_mean(selected.to(mask.dtype), mask).item(),
                   M.POLICY_PPO_KL: ppo_kl.detach().item()}
    metrics[M.COV_SELECTED_FRAC] = _masked_mean(selected.to(mask.dtype), mask).item()
    return aggregate(pg_losses, mask, loss_agg_mode), metrics


METHOD = Method(name="cov", params=Params, run_name="{backend}_{loss_mode}_r{cov_ratio}_s{seed}",
                label="KL-Cov / Clip-Cov", color="#c44e52", marker="^", hooks=("loss",),
                point_text=lambda p: f"r={p.cov_ratio:g}", point_name=lambda p: LOSS_LABELS[p.loss_mode])
