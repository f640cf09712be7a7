"""Stochastic samplers for Gaussian (embedding) diffusion: Euler-Maruyama on the reverse SDE with
tunable noise, and the multistep consistency sampler that re-noises each x0 estimate afresh."""

from __future__ import annotations

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser
from cdlm.processes.gaussian import GaussianProcess
from cdlm.samplers.base import Callback, SampleOutput, register
from cdlm.samplers.gaussian import step_loop


def step_euler_maruyama(
    x: Tensor,
    x0: Tensor,
    alpha_t: Tensor,
    sigma_t: Tensor,
    alpha_s: Tensor,
    sigma_s: Tensor,
    noise: Tensor,
    churn: float = 1.0,
) -> Tensor:
    """One Euler-Maruyama step from t to s < t of the family of reverse SDEs sharing the forward
    marginals (Karras et al. 2022, eq. 6, with beta = churn^2 * dsigma/dt / sigma), written in
    y = x / alpha and v = sigma_ve^2 = (sigma / alpha)^2:

        dy = -(1 + churn^2) / 2 * grad log p(y) dv + churn * sqrt(dv) dW,
        grad log p(y) = -(y - x0_hat) / v.

    churn = 1 is the reverse-time SDE (Anderson 1982; Song et al. 2021, eq. 6), churn = 0 the
    probability-flow ODE (Euler in v), churn > 1 injects more noise than the SDE."""
    y, v_t, v_s = x / alpha_t, (sigma_t / alpha_t) ** 2, (sigma_s / alpha_s) ** 2
    dv = v_t - v_s
    y = y - (1 + churn**2) / 2 * (dv / v_t) * (y - x0) + churn * dv.sqrt() * noise
    return alpha_s * y


@register("euler_maruyama", processes=("gaussian",))
@torch.no_grad()
def sample_euler_maruyama(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: GaussianProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    churn: float = 1.0,
) -> SampleOutput:
    """Euler-Maruyama on the reverse SDE (Song et al. 2021, Sec. 4.1; Karras et al. 2022, eq. 6),
    first order (weak), 1 NFE per step; ``churn`` >= 0 scales the injected noise. Stable for
    churn <= sqrt(3) on any grid (the drift never overshoots x0_hat by more than its distance).
    x: (B, L, D) prior draw; timesteps: (T+1,) from 1 to 0."""
    if churn < 0:
        raise ValueError(f"churn must be >= 0, got {churn}")
    return step_loop(
        step_euler_maruyama, denoiser, x, timesteps, process, generator, callback, churn=churn
    )


def step_consistency(
    x: Tensor,
    x0: Tensor,
    alpha_t: Tensor,
    sigma_t: Tensor,
    alpha_s: Tensor,
    sigma_s: Tensor,
    noise: Tensor,
) -> Tensor:
    """One step of multistep consistency sampling (Song et al. 2023, Alg. 1): the estimate
    noised afresh to s, x_s = alpha_s x0_hat + sigma_s z. Unlike DDPM's posterior draw it keeps
    nothing of x_t but what the estimate carries: a consistency model maps any point of a
    trajectory to its end, so x_t has nothing more to give."""
    return alpha_s * x0 + sigma_s * noise


@register("consistency", processes=("gaussian",))
@torch.no_grad()
def sample_consistency(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: GaussianProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
) -> SampleOutput:
    """Multistep consistency sampling (Song et al. 2023, Alg. 1), 1 NFE per step: the sampler a
    consistency-distilled student is made for. x: (B, L, D) prior draw; timesteps: (T+1,) from
    1 to 0 (one step: the student's single jump to x0)."""
    return step_loop(step_consistency, denoiser, x, timesteps, process, generator, callback)
