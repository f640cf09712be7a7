"""Samplers for Gaussian (embedding) diffusion: DDPM ancestral and DDIM.

The last interval always ends at t = 0, where the step returns the denoiser's x0 estimate: the
clean data is what a sampler must deliver, whatever small noise floor the schedule keeps.

With ``token_steps`` the grid becomes one per token (``rolling``): denoising sweeps left to right
and a token is decided with its left context already clean, the order in which the masked
sampler's left-to-right blocks work.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from cdlm import rng
from cdlm.denoiser import Denoiser, per_position
from cdlm.processes.gaussian import GaussianProcess
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, categorical_at, register


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


def rolling(timesteps: Tensor, length: int, token_steps: int) -> Tensor:
    """A (K + 1, length) grid, one column per token, from a shared grid ``timesteps`` (K + 1,).

    Every token walks the same ``token_steps``-step version of the shared grid, token i starting
    round(i (K - W) / (length - 1)) steps after token 0, so the noisy band sweeps left to right:
    tokens ahead wait at the start time, tokens behind are already clean (Rolling Diffusion,
    Ruhe et al. 2024; diffusion forcing, Chen et al. 2024). W = K is the shared grid itself.
    """
    k = len(timesteps) - 1
    if not 1 <= token_steps <= k:
        raise ValueError(f"token_steps must be in [1, steps = {k}], got {token_steps}")
    # the W-step grid: the shared grid read at W + 1 evenly spaced (fractional) step indices
    at = torch.linspace(0, k, token_steps + 1, dtype=torch.float64, device=timesteps.device)
    lo = at.floor().long().clamp(max=k - 1)
    frac = (at - lo).to(timesteps.dtype)
    own = timesteps[lo] * (1 - frac) + timesteps[lo + 1] * frac
    index = torch.arange(length, dtype=torch.float64, device=timesteps.device)
    offsets = torch.round(index * (k - token_steps) / max(length - 1, 1)).long()
    steps = torch.arange(k + 1, device=timesteps.device)
    return own[(steps[:, None] - offsets[None, :]).clamp(0, token_steps)]


def rolling_rows(timesteps: Tensor, width: int, token_steps: int, generator: rng.Draws) -> Tensor:
    """``rolling`` on a canvas of ``width`` positions; with per-row generators (``rng.Rows``) of
    shorter rows, each row's own (K + 1, B, width) grid on its own length, as alone, its
    right padding at level 0 (held, it never moves)."""
    lengths = generator.lengths if isinstance(generator, rng.Rows) else [width]
    if min(lengths) == width:
        return rolling(timesteps, width, token_steps)
    grids = [rolling(timesteps, n, token_steps) for n in lengths]
    return torch.stack([torch.nn.functional.pad(g, (0, width - g.shape[1])) for g in grids], 1)


def step_loop(
    step: Callable[..., Tensor],
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    process: GaussianProcess,
    generator: torch.Generator | None,
    callback: Callback | None,
    token_steps: int | None = None,
    draw_tokens: bool = False,
    temperature: float = 1.0,
    **step_kwargs,
) -> SampleOutput:
    """Walks the grid with a one-evaluation-per-step update
    ``step(x, x0, alpha_t, sigma_t, alpha_s, sigma_s, noise, **step_kwargs)``; DDPM, DDIM, Euler
    and Euler-Maruyama differ only in ``step``.

    ``token_steps``: walk the ``rolling`` per-token grid instead (the denoiser then gets (B, L)
    levels); a token whose level does not move keeps its state. ``draw_tokens``: a token reaching
    t = 0 becomes the embedding of a token drawn from its predicted distribution (float64, only
    at those positions) instead of the x0 estimate (whose argmax is greedy decoding when a token
    gets few steps), at ``temperature`` (draws only)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if token_steps is not None:
        timesteps = rolling_rows(timesteps, x.shape[1], token_steps, generator)
    schedule, pred, n = process.schedule, None, len(timesteps) - 1
    tokens = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
    for i in range(n):
        # levels per sequence (B,) on a shared grid, per token (B, L) on a rolling one (its
        # columns shared by every row, or each row's own)
        t, s = (v.to(x.dtype).expand(x.shape[: min(v.dim() + 1, 2)]) for v in timesteps[i : i + 2])
        pred = denoiser(x, t)
        ss = torch.where(s <= 0, t, s)  # the interval ending at 0 takes a token, not a step
        noise = rng.randn(x.shape, generator, device=x.device, dtype=x.dtype)
        coefficients = [
            per_position(f(v)) for v in (t, ss) for f in (schedule.alpha, schedule.sigma)
        ]
        stepped = step(x, pred.x0, *coefficients, noise, **step_kwargs)
        x = torch.where(per_position(t > s), stepped, x)
        # positions reaching t = 0 now
        ends = ((s <= 0) & (t > 0)).reshape(x.shape[0], -1).expand(x.shape[:2])
        if ends.any():
            if draw_tokens:
                logp = torch.log_softmax(pred.logits.double(), -1)
                drawn = categorical_at(logp, ends, generator, temperature)
                x[ends] = process.embedding(drawn).to(x.dtype)
            else:
                drawn = pred.logits[ends].argmax(-1)
                x[ends] = pred.x0[ends]
            tokens[ends] = drawn
        if callback is not None:
            callback(StepInfo(i=i, t=float(t.max()), s=float(s.max()), x=x, prediction=pred))
    return SampleOutput(x=x, tokens=tokens, prediction=pred, nfe=n)


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
    token_steps: int | None = None,
    draw_tokens: bool = False,
    temperature: float = 1.0,
) -> SampleOutput:
    """DDPM ancestral sampling (Ho et al. 2020): the reverse SDE discretised by posterior draws.
    x: (B, L, D) prior draw; timesteps: (T+1,) from 1 to 0; token_steps: left to right on the
    ``rolling`` grid, each token in that many steps; draw_tokens, temperature: see
    ``step_loop``."""
    return step_loop(
        step_ddpm,
        denoiser,
        x,
        timesteps,
        process,
        generator,
        callback,
        token_steps,
        draw_tokens,
        temperature,
    )


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
    token_steps: int | None = None,
    draw_tokens: bool = False,
    temperature: float = 1.0,
) -> SampleOutput:
    """DDIM (Song et al. 2021); deterministic for eta = 0 (and draw_tokens false).
    x: (B, L, D); timesteps: (T+1,); token_steps, draw_tokens, temperature: as for DDPM."""
    if eta < 0:
        raise ValueError(f"eta must be >= 0, got {eta}")
    return step_loop(
        step_ddim,
        denoiser,
        x,
        timesteps,
        process,
        generator,
        callback,
        token_steps,
        draw_tokens,
        temperature,
        eta=eta,
    )


@register("rolling", processes=("gaussian",))
@torch.no_grad()
def sample_rolling(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: GaussianProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    token_steps: int = 1,
    temperature: float = 1.0,
) -> SampleOutput:
    """Left-to-right gaussian decoding: DDPM on the ``rolling`` grid, each token drawn from its
    predicted distribution at ``temperature`` as it reaches t = 0. With ``token_steps=1`` a
    token goes from noise to a drawn token in one call, its left context already decided: the
    gaussian counterpart of the masked process's left-to-right ancestral sampler."""
    return sample_ddpm(
        denoiser,
        x,
        timesteps,
        process=process,
        generator=generator,
        callback=callback,
        token_steps=token_steps,
        draw_tokens=True,
        temperature=temperature,
    )
