"""Entropy-preserving updates (Cui et al., arXiv 2505.22617): KL-Cov and Clip-Cov, which restrain the few
tokens whose log-probability and advantage covary most. verl runs its own `policy_loss.loss_mode`; TRL
runs this module's loss (docs/methods.md)."""

from __future__ import annotations

from dataclasses import dataclass

from repexp.methods.base import Method, param

LOSS_MODES = ("kl_cov", "clip_cov")


@dataclass(frozen=True)
class Params:
    loss_mode: str = param("kl_cov", help="kl_cov (a KL penalty on the top tokens by covariance) or clip_cov "
                           "(their gradient detached)", enum=LOSS_MODES)
    cov_ratio: float = param(0.002, help="fraction of the batch's tokens selected by covariance", exclusiveMinimum=0,
                             maximum=1)
    cov_kl_coef: float = param(1.0, help="KL-Cov: coefficient of the |log π − log π_old| penalty", minimum=0)
    cov_clip_lb: float = param(1.0, help="Clip-Cov: lower bound of the covariance window")
    cov_clip_ub: float = param(5.0, help="Clip-Cov: upper bound of the covariance window")


METHOD = Method(name="cov", params=Params, run_name="{backend}_{loss_mode}_r{cov_ratio}_s{seed}",
                label="KL-Cov / Clip-Cov", color="#c44e52", marker="^", hooks=("loss",),
                point_text=lambda p: f"{p.loss_mode}, r={p.cov_ratio:g}")
