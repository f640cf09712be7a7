"""Fixed-step solvers of the probability-flow ODE for Gaussian (embedding) diffusion.

The VP probability-flow ODE (Song et al. 2021, eq. 13) is solved in the variables of Karras et al.
2022 (eq. 4 with s(t) = alpha): y = x / alpha and the VE noise level sigma_ve = sigma / alpha =
exp(-logsnr / 2), where it reads dy / dsigma_ve = (y - x0_hat) / sigma_ve. Every sampler walks the
grid like DDPM/DDIM: the last interval ends at t = 0 and returns the x0 estimate at the last
positive grid time (the clean data is what a sampler must deliver).
"""

from __future__ import annotations

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser, Prediction
from cdlm.processes.gaussian import GaussianProcess
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, register
from cdlm.samplers.gaussian import step_loop


def call(denoiser: Denoiser, x: Tensor, t: Tensor) -> Prediction:
    """The denoiser at one time t for the whole batch."""
    return denoiser(x, torch.full((x.shape[0],), float(t), device=x.device, dtype=x.dtype))


def step_euler(
    x: Tensor,
    x0: Tensor,
    alpha_t: Tensor,
    sigma_t: Tensor,
    alpha_s: Tensor,
    sigma_s: Tensor,
    noise: Tensor | None = None,
) -> Tensor:
    """One Euler step of dy/dsigma_ve = (y - x0) / sigma_ve from t to s (Karras et al. 2022,
    Alg. 1 without churn). In x it equals DDIM with eta = 0 (Song et al. 2021). ``noise`` is
    ignored (the step is deterministic)."""
    y, ve_t, ve_s = x / alpha_t, sigma_t / alpha_t, sigma_s / alpha_s
    return alpha_s * (y + (ve_s - ve_t) * (y - x0) / ve_t)


def step_heun(
    x: Tensor,
    x0_t: Tensor,
    x0_euler: Tensor,
    alpha_t: Tensor,
    sigma_t: Tensor,
    alpha_s: Tensor,
    sigma_s: Tensor,
) -> Tensor:
    """Heun's 2nd-order correction (Karras et al. 2022, Alg. 1, lines 9-11): averages the slope
    at t with the slope at s evaluated at the Euler prediction; ``x0_euler`` is the denoiser's
    estimate there."""
    y, ve_t, ve_s = x / alpha_t, sigma_t / alpha_t, sigma_s / alpha_s
    d_t = (y - x0_t) / ve_t
    y_euler = y + (ve_s - ve_t) * d_t
    d_s = (y_euler - x0_euler) / ve_s
    return alpha_s * (y + (ve_s - ve_t) * (d_t + d_s) / 2)


def step_dpmpp_2m(
    x: Tensor,
    x0: Tensor,
    x0_prev: Tensor | None,
    h_prev: Tensor | None,
    alpha_t: Tensor,
    sigma_t: Tensor,
    alpha_s: Tensor,
    sigma_s: Tensor,
) -> Tensor:
    """DPM-Solver++(2M) (Lu et al. 2022b, Alg. 2): the exact solution of the linear part in
    half-log-SNR lambda = log(alpha / sigma), with x0 extrapolated linearly in lambda from the
    previous step (step size ``h_prev``). Without a previous estimate it is first order (= DDIM).
    """
    h = torch.log(alpha_s / sigma_s) - torch.log(alpha_t / sigma_t)
    d = x0
    if x0_prev is not None:
        r = h_prev / h
        d = (1 + 1 / (2 * r)) * x0 - (1 / (2 * r)) * x0_prev
    return (sigma_s / sigma_t) * x + alpha_s * (-torch.expm1(-h)) * d


def _coefficients(process: GaussianProcess, t: Tensor, s: Tensor, dtype: torch.dtype):
    sch, tt, ss = process.schedule, t.to(dtype), s.to(dtype)
    return sch.alpha(tt), sch.sigma(tt), sch.alpha(ss), sch.sigma(ss)


@register("euler", processes=("gaussian",))
@torch.no_grad()
def sample_euler(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: GaussianProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
) -> SampleOutput:
    """Euler on the probability-flow ODE in (y, sigma_ve) (Karras et al. 2022, Alg. 1);
    first order, 1 NFE per step. x: (B, L, D) prior draw; timesteps: (T+1,) from 1 to 0."""
    return step_loop(step_euler, denoiser, x, timesteps, process, generator, callback)


@register("heun", processes=("gaussian",))
@torch.no_grad()
def sample_heun(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: GaussianProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
) -> SampleOutput:
    """Heun's method on the probability-flow ODE (Karras et al. 2022, Alg. 1); second order,
    2 NFE per step except the last, which returns the x0 estimate (NFE = 2T - 1).
    x: (B, L, D); timesteps: (T+1,)."""
    pred, n, nfe = None, len(timesteps) - 1, 0
    for i in range(n):
        t, s = timesteps[i], timesteps[i + 1]
        pred, nfe = call(denoiser, x, t), nfe + 1
        if s <= 0:
            x = pred.x0
        else:
            coef = _coefficients(process, t, s, x.dtype)
            x_euler = step_euler(x, pred.x0, *coef)
            x0_euler, nfe = call(denoiser, x_euler, s).x0, nfe + 1
            x = step_heun(x, pred.x0, x0_euler, *coef)
        if callback is not None:
            callback(StepInfo(i=i, t=float(t), s=float(s), x=x, prediction=pred))
    return SampleOutput(x=x, tokens=pred.logits.argmax(-1), prediction=pred, nfe=nfe)


@register("dpmpp_2m", processes=("gaussian",))
@torch.no_grad()
def sample_dpmpp_2m(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: GaussianProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
) -> SampleOutput:
    """DPM-Solver++(2M) (Lu et al. 2022b, "DPM-Solver++", Alg. 2): second-order multistep
    data-prediction solver of the probability-flow ODE, 1 NFE per step. Works best on
    ``grid=logsnr``. x: (B, L, D); timesteps: (T+1,)."""
    pred, n = None, len(timesteps) - 1
    x0_prev, h_prev = None, None
    for i in range(n):
        t, s = timesteps[i], timesteps[i + 1]
        pred = call(denoiser, x, t)
        if s <= 0:
            x = pred.x0
        else:
            a_t, s_t, a_s, s_s = _coefficients(process, t, s, x.dtype)
            x = step_dpmpp_2m(x, pred.x0, x0_prev, h_prev, a_t, s_t, a_s, s_s)
            x0_prev, h_prev = pred.x0, torch.log(a_s / s_s) - torch.log(a_t / s_t)
        if callback is not None:
            callback(StepInfo(i=i, t=float(t), s=float(s), x=x, prediction=pred))
    return SampleOutput(x=x, tokens=pred.logits.argmax(-1), prediction=pred, nfe=n)
