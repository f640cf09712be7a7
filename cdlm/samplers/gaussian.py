"""Samplers for Gaussian (embedding) diffusion: DDPM ancestral and DDIM.

The last interval always ends at t = 0, where the step returns the denoiser's x0 estimate: the
clean data is what a sampler must deliver, whatever small noise floor the schedule keeps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser
from cdlm.processes.gaussian import GaussianProcess
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, register


def step_ddpm(
    x: Tensor,
    x0: Tensor,
    alpha_t: Tensor,
    sigma_t: Tensor,
    alpha_s: Tensor,
    sigma_s: Tensor,
    noise: Tensor,
) -> Tensor:
    """One ancestral step from t to s < t: a draw from the posterior q(x_s | x_t, x0_hat)
    (Ho et al. 2020, eq. 6-7, in continuous-time VP form, Kingma et al. 2021, eq. 29-32)."""
    alpha_ts = alpha_t / alpha_s
    var_ts = sigma_t**2 - alpha_ts**2 * sigma_s**2  # variance of q(x_t | x_s)
    mean = (alpha_ts * sigma_s**2 / sigma_t**2) * x + (alpha_s * var_ts / sigma_t**2) * x0
    std = (var_ts * sigma_s**2 / sigma_t**2).clamp_min(0).sqrt()
    return mean + std * noise


def step_ddim(
    x: Tensor,
    x0: Tensor,
    alpha_t: Tensor,
    sigma_t: Tensor,
    alpha_s: Tensor,
    sigma_s: Tensor,
    noise: Tensor,
    eta: float = 0.0,
) -> Tensor:
    """One DDIM step from t to s < t (Song et al. 2021, eq. 12): eta = 0 is the deterministic
    ODE-like update, eta = 1 matches the DDPM posterior variance."""
    eps = (x - alpha_t * x0) / sigma_t
    c = eta * (sigma_s / sigma_t) * (1 - alpha_t**2 / alpha_s**2).clamp_min(0).sqrt()
    return alpha_s * x0 + (sigma_s**2 - c**2).clamp_min(0).sqrt() * eps + c * noise


def step_loop(
    step: Callable[..., Tensor],
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    process: GaussianProcess,
    generator: torch.Generator | None,
    callback: Callback | None,
    **step_kwargs,
) -> SampleOutput:
    """Walks the grid with a one-evaluation-per-step update
    ``step(x, x0, alpha_t, sigma_t, alpha_s, sigma_s, noise, **step_kwargs)``; DDPM, DDIM, Euler
    and Euler-Maruyama differ only in ``step``."""
    schedule, pred, n = process.schedule, None, len(timesteps) - 1
    for i in range(n):
        t, s = timesteps[i], timesteps[i + 1]
        pred = denoiser(x, torch.full((x.shape[0],), float(t), device=x.device, dtype=x.dtype))
        if s <= 0:
            x = pred.x0
        else:
            tt, ss = t.to(x.dtype), s.to(x.dtype)
            noise = torch.randn(x.shape, device=x.device, generator=generator, dtype=x.dtype)
            x = step(
                x,
                pred.x0,
                schedule.alpha(tt),
                schedule.sigma(tt),
                schedule.alpha(ss),
                schedule.sigma(ss),
                noise,
                **step_kwargs,
            )
        if callback is not None:
            callback(StepInfo(i=i, t=float(t), s=float(s), x=x, prediction=pred))
    return SampleOutput(x=x, tokens=pred.logits.argmax(-1), prediction=pred, nfe=n)


@register("ddpm", processes=("gaussian",))
@torch.no_grad()
def sample_ddpm(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: GaussianProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
) -> SampleOutput:
    """DDPM ancestral sampling (Ho et al. 2020): the reverse SDE discretised by posterior draws.
    x: (B, L, D) prior draw; timesteps: (T+1,) from 1 to 0."""
    return step_loop(step_ddpm, denoiser, x, timesteps, process, generator, callback)


@register("ddim", processes=("gaussian",))
@torch.no_grad()
def sample_ddim(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: GaussianProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    eta: float = 0.0,
) -> SampleOutput:
    """DDIM (Song et al. 2021); deterministic for eta = 0. x: (B, L, D); timesteps: (T+1,)."""
    if eta < 0:
        raise ValueError(f"eta must be >= 0, got {eta}")
    return step_loop(step_ddim, denoiser, x, timesteps, process, generator, callback, eta=eta)
