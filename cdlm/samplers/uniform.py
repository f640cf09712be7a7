"""Ancestral sampling of uniform-state diffusion (UDLM, Schiff et al. 2025; Duo, Sahoo et al.
2025, with its greedy last step).

Each interval t -> s draws x_s from q(x_s | x_t, x0_hat), the exact uniform-state posterior
with the denoiser's x0 distribution in place of x0 (``step_posterior``); the last interval
(s = 0) takes the denoiser's most likely token instead (the reference's
``noise_removal=greedy``; it spends one extra call at t = eps where this spends none). Unlike
masking, every position stays open: any token may change at any step, which ``stats`` counts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, register, sample_categorical


def uniform_posterior(p_x0: Tensor, x_t: Tensor, alpha_s: Tensor, alpha_t: Tensor) -> Tensor:
    """(B, L, V) q(x_s | x_t, x0) with x0 ~ ``p_x0`` (B, L, V) probabilities, in float64.

    With a = alpha_t / alpha_s the s -> t transition keeps a token with probability a, so
    q(x_s = v) is proportional to q(x_t | x_s = v) q(x_s = v | x0):
    (a [v = x_t] + (1 - a) / V) (alpha_s p_v + (1 - alpha_s) / V); alpha_s, alpha_t: (B,)."""
    p, vocab = p_x0.double(), p_x0.shape[-1]
    a_s, a_t = (v.double().view(-1, 1, 1) for v in (alpha_s, alpha_t))
    a, at = a_t / a_s, x_t[..., None]
    forward = a_s * p + (1 - a_s) / vocab  # q(x_s | x0)
    joint = forward * ((1 - a) / vocab)  # times q(x_t | x_s) off x_t; at x_t add a q(x_s | x0)
    joint.scatter_add_(-1, at, a * forward.gather(-1, at))
    return joint / joint.sum(-1, keepdim=True)


def step_posterior(
    x_t: Tensor,
    logp: Tensor,
    alpha_s: Tensor,
    alpha_t: Tensor,
    generator: torch.Generator | None,
    temperature: float = 1.0,
) -> Tensor:
    """One ancestral step: x_s ~ q(x_s | x_t, x0_hat), x0_hat = softmax(``logp``) (B, L, V)."""
    q = uniform_posterior(logp.double().softmax(-1), x_t, alpha_s, alpha_t)
    return sample_categorical(q.log(), generator, temperature)


@register("duo_ancestral", processes=("uniform",))
@torch.no_grad()
def sample_duo_ancestral(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
) -> SampleOutput:
    """x: (B, L) ids (the uniform prior); timesteps: (T+1,) from 1 to 0. One call per
    interval; ``temperature`` of the posterior draws (0: argmax). stats: ``revisions``, the
    mean positions per sequence that changed, summed over the steps. Tokens the denoiser holds
    (``held_tokens``: infilling) are put in place first and never resampled."""
    held = denoiser.held_tokens()
    if held is not None:
        x = torch.where(held[1], held[0], x)
    nfe, pred, revisions = 0, None, 0.0
    for i in range(len(timesteps) - 1):
        t, s = float(timesteps[i]), float(timesteps[i + 1])
        tt = torch.full((x.shape[0],), t, device=x.device)
        pred, nfe = denoiser(x, tt), nfe + 1
        if i == len(timesteps) - 2:  # the greedy last step
            x_s = pred.logits.argmax(-1)
        else:
            a_t, a_s = process.keep(tt.double()), process.keep(torch.full_like(tt, s).double())
            x_s = step_posterior(x, pred.logits, a_s, a_t, generator, temperature)
        if held is not None:
            x_s = torch.where(held[1], held[0], x_s)
        revisions += float((x_s != x).sum(-1).double().mean())
        x = x_s
        if callback is not None:
            callback(StepInfo(i=i, t=t, s=s, x=x, prediction=pred))
    return SampleOutput(x=x, tokens=x, prediction=pred, nfe=nfe, stats={"revisions": revisions})
