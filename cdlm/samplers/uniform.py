"""Ancestral sampling of uniform-state diffusion (UDLM, Schiff et al. 2025; Duo, Sahoo et al.
2025, with its greedy last step).

Each interval t -> s draws x_s from q(x_s | x_t, x0_hat), the exact uniform-state posterior
with the denoiser's x0 distribution in place of x0 (``step_posterior``); the last interval
(s = 0) draws from q(x_0 | x_t, x0_hat) by default (``last_step="draw"``). That is exact per
token when x0_hat is the leave-one-out posterior p(x0^i | x_t^{-i}) that the ELBO trains
(``cdlm.worlds.uniform``). ``last_step="greedy"`` takes the argmax of x0_hat instead (the
reference's ``noise_removal=greedy``, which spends one extra call at t = eps where this spends
none): it ignores x_t's own evidence, so its samples leave the truth (on the character
world's oracle a KL rate 360x the floor, and a higher NLL under the world); with a network that
leans on its own input token it seeks the mode, which lowers gen-PPL without fitting the data
better (docs/duo.md). Unlike masking, every position stays open: any token may change at any
step, which ``stats`` counts.

``duo_psi`` draws from a kappa-mixture of that posterior and a corrector that predicts x0 and
renoises it to s (the Psi-samplers of Deschenaux, Gulcehre & Sahoo 2026, ``psi_posterior``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, register, sample_categorical


def noise_of(p_x0: Tensor, support: Tensor | None) -> tuple[Tensor | float, Tensor | float]:
    """(the noise's law over the V ids, 1 / K): uniform on the ``support`` ((V,) bool; None:
    all V), in float64."""
    if support is None:
        return 1.0 / p_x0.shape[-1], 1.0 / p_x0.shape[-1]
    states = support.double().sum()
    return support.double() / states, 1.0 / states


def uniform_posterior(
    p_x0: Tensor, x_t: Tensor, alpha_s: Tensor, alpha_t: Tensor, support: Tensor | None = None
) -> Tensor:
    """(B, L, V) q(x_s | x_t, x0) with x0 ~ ``p_x0`` (B, L, V) probabilities, in float64.

    With a = alpha_t / alpha_s the s -> t transition keeps a token with probability a, so
    q(x_s = v) is proportional to q(x_t | x_s = v) q(x_s = v | x0):
    (a [v = x_t] + (1 - a) / K) (alpha_s p_v + (1 - alpha_s) [v in support] / K); alpha_s,
    alpha_t: (B,); ``support``: (V,) bool, the K ids the noise draws from (None: all V), which
    hold x_t and p_x0's mass, so no other id gets any."""
    p, (noise, per_state) = p_x0.double(), noise_of(p_x0, support)
    a_s, a_t = (v.double().view(-1, 1, 1) for v in (alpha_s, alpha_t))
    a, at = a_t / a_s, x_t[..., None]
    forward = a_s * p + (1 - a_s) * noise  # q(x_s | x0)
    joint = forward * ((1 - a) * per_state)  # times q(x_t | x_s) off x_t; at x_t add a q(x_s | x0)
    joint.scatter_add_(-1, at, a * forward.gather(-1, at))
    return joint / joint.sum(-1, keepdim=True)


def step_posterior(
    x_t: Tensor,
    logp: Tensor,
    alpha_s: Tensor,
    alpha_t: Tensor,
    generator: torch.Generator | None,
    temperature: float = 1.0,
    support: Tensor | None = None,
) -> Tensor:
    """One ancestral step: x_s ~ q(x_s | x_t, x0_hat), x0_hat = softmax(``logp``) (B, L, V),
    on the noise's ``support`` (``uniform_posterior``)."""
    q = uniform_posterior(logp.double().softmax(-1), x_t, alpha_s, alpha_t, support)
    return sample_categorical(q.log(), generator, temperature)


def psi_posterior(
    p_x0: Tensor,
    x_t: Tensor,
    alpha_s: Tensor,
    alpha_t: Tensor,
    kappa: Tensor,
    support: Tensor | None = None,
) -> Tensor:
    """(B, L, V) the Psi-sampler's draw distribution (Deschenaux, Gulcehre & Sahoo 2026,
    "The Diffusion Duality, Chapter II"), in float64.

    kappa (B,) mixes the predictor, the posterior q(x_s | x_t, x0_hat), with the corrector:
    the posterior all the way to t = 0, q(x_0 | x_t, x0_hat), carried forward to level s by the
    exact kernel alpha_s p + (1 - alpha_s) / K on the noise's ``support`` (None: all V).
    kappa = 1 is ``duo_ancestral``; kappa = 0 is a full predict-x0-then-renoise step, which lets
    committed tokens change again."""
    noise, a_s = noise_of(p_x0, support)[0], alpha_s.double().view(-1, 1, 1)
    predictor = uniform_posterior(p_x0, x_t, alpha_s, alpha_t, support)
    to_clean = uniform_posterior(p_x0, x_t, torch.ones_like(alpha_s), alpha_t, support)
    corrector = a_s * to_clean + (1 - a_s) * noise
    k = kappa.double().view(-1, 1, 1)
    return k * predictor + (1 - k) * corrector


PSI_MODES = ("posterior", "pc", "constant", "remdm", "remdm_rescale")


def psi_kappa(alpha_t: Tensor, alpha_s: Tensor, mode: str, eta: float) -> Tensor:
    """kappa per interval (alpha_t, alpha_s: (N,)) for one of ``PSI_MODES``.

    ``constant`` takes kappa = eta; the ``remdm*`` modes take a ReMDM remasking rate sigma
    (Wang et al. 2025) and give the corrector the share of the move it would renoise:
    kappa = clip(1 - sigma / (1 - alpha_s), 0, 1). ``remdm``: sigma = eta. The reference's
    ``max-capped`` sigma = min(eta, (1 - alpha_s) / alpha_t) gives the same kappas (where the cap
    binds, sigma >= 1 - alpha_s and both clip to 0), so it is not a mode of its own.
    ``remdm_rescale``: sigma = eta min(eta, (1 - alpha_s) / alpha_t), eta where alpha_t = 0, as
    the reference writes it (ReMDM's own rescale has min(1, .))."""
    if mode not in PSI_MODES:
        raise ValueError(f"unknown Psi mode {mode!r}; choose one of {PSI_MODES}")
    a_t, a_s = alpha_t.double(), alpha_s.double()
    if mode in ("posterior", "pc", "constant"):
        value = {"posterior": 1.0, "pc": 0.0, "constant": eta}[mode]
        return torch.full_like(a_t, value)
    sigma = torch.full_like(a_t, eta)
    if mode == "remdm_rescale":
        cap = (1 - a_s) / a_t.clamp_min(torch.finfo(torch.float64).tiny)
        sigma = torch.where(a_t > 0, eta * torch.minimum(sigma, cap), sigma)
    # 0 / 0 only where alpha_s = 1 and sigma = 0: no renoising asked for, so the predictor
    return (1 - sigma / (1 - a_s)).clamp(0, 1).nan_to_num(1.0)


Step = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
LAST_STEPS = ("draw", "greedy")


def check_last_step(last_step: str) -> None:
    """Refuses an unknown ``last_step`` before any network call."""
    if last_step not in LAST_STEPS:
        raise ValueError(f"unknown last_step {last_step!r}; choose one of {LAST_STEPS}")


def _decode(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    process,
    step: Step,
    callback: Callback | None,
    last_step: str,
) -> SampleOutput:
    """The loop both samplers share: one call per interval, ``step(x_t, logits, alpha_s,
    alpha_t)`` draws x_s; the last interval draws x_0 (alpha_s = 1) or, ``last_step="greedy"``,
    takes the argmax; held tokens stay in place."""
    held = denoiser.held_tokens()
    if held is not None:
        x = torch.where(held[1], held[0], x)
    nfe, pred, revisions = 0, None, 0.0
    for i in range(len(timesteps) - 1):
        t, s = float(timesteps[i]), float(timesteps[i + 1])
        tt = torch.full((x.shape[0],), t, device=x.device)
        pred, nfe = denoiser(x, tt), nfe + 1
        last = i == len(timesteps) - 2
        if last and last_step == "greedy":
            x_s = pred.logits.argmax(-1)
        else:
            a_t, a_s = process.keep(tt.double()), process.keep(torch.full_like(tt, s).double())
            x_s = step(x, pred.logits, torch.ones_like(a_s) if last else a_s, a_t)
        if held is not None:
            x_s = torch.where(held[1], held[0], x_s)
        revisions += float((x_s != x).sum(-1).double().mean())
        x = x_s
        if callback is not None:
            callback(StepInfo(i=i, t=t, s=s, x=x, prediction=pred))
    return SampleOutput(x=x, tokens=x, prediction=pred, nfe=nfe, stats={"revisions": revisions})


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
    last_step: str = "draw",
) -> SampleOutput:
    """x: (B, L) ids (the uniform prior); timesteps: (T+1,) from 1 to 0. One call per
    interval; ``temperature`` of the posterior draws (0: argmax); ``last_step``: ``draw``
    (from q(x_0 | x_t, x0_hat)) or ``greedy`` (the argmax of x0_hat; module docstring). stats:
    ``revisions``, the mean positions per sequence that changed, summed over the steps. Tokens
    the denoiser holds (``held_tokens``: infilling) are put in place first and never
    resampled."""
    check_last_step(last_step)
    support = process.uniform_noise.support.mask

    def step(x_t: Tensor, logits: Tensor, a_s: Tensor, a_t: Tensor) -> Tensor:
        return step_posterior(x_t, logits, a_s, a_t, generator, temperature, support)

    return _decode(denoiser, x, timesteps, process, step, callback, last_step)


@register("duo_psi", processes=("uniform",))
@torch.no_grad()
def sample_duo_psi(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    mode: str = "remdm",
    eta: float = 0.01,
    temperature: float = 1.0,
    last_step: str = "draw",
) -> SampleOutput:
    """The Psi predictor-corrector sampler (Chapter II; ``psi_posterior``) with one kappa
    ``mode`` over the whole grid. x, timesteps, ``last_step`` and stats as ``duo_ancestral``
    (at alpha_s = 1 predictor and corrector are both q(x_0 | x_t, x0_hat)). The corrector
    reuses the predictor's x0 estimate, so it is one call per interval, like ancestral."""
    psi_kappa(torch.ones(1), torch.ones(1), mode, eta)  # an unknown mode fails before any call
    check_last_step(last_step)
    support = process.uniform_noise.support.mask

    def step(x_t: Tensor, logits: Tensor, a_s: Tensor, a_t: Tensor) -> Tensor:
        kappa = psi_kappa(a_t, a_s, mode, eta)
        q = psi_posterior(logits.double().softmax(-1), x_t, a_s, a_t, kappa, support)
        return sample_categorical(q.log(), generator, temperature)

    return _decode(denoiser, x, timesteps, process, step, callback, last_step)
