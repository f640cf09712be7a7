"""The continuous-time diffusion ELBO of Gaussian embedding diffusion (VDM, Kingma et al. 2021).

For a block of L tokens w with embeddings e = E[w] (L, D), the variational bound (VDM eq. 11 with
the continuous-time diffusion loss of eq. 17) is

    -log p(w) <= KL(q(x_1 | e) || N(0, I))                          prior
               + E_{q(x_0 | e)} [-log p(w | x_0)]                    reconstruction (rounding)
               - 1/2 E_{t ~ U(0,1), eps} [SNR'(t) |e - x0_hat(x_t, t)|^2]     diffusion

with SNR = alpha^2 / sigma^2 = exp(logsnr); t = 0 and t = 1 are the ends of the schedule (finite
log-SNR). Equivalently -1/2 E[logsnr'(t) |eps - eps_hat|^2]: the log-SNR derivative weights the
noise error, the SNR derivative the x0 error. We sample logsnr uniformly on [logsnr(1), logsnr(0)]
instead of t: the diffusion term is 1/2 * integral of exp(logsnr) |e - x0_hat|^2 dlogsnr whatever
the schedule (VDM Sec. 5.1), so this is the same expectation without the factor logsnr'(t) that
reaches ~470 at both ends of the cosine schedule. All terms are per sequence, divided by L and
ln 2: bits per token of the joint probability of the whole block of L tokens under the model's
reverse-SDE (ancestral) generative model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser
from cdlm.likelihood.terms import bits_per_token, rounding_nll
from cdlm.processes.gaussian import GaussianProcess
from cdlm.time_samplers import stratified_times


@dataclass
class Elbo:
    """Per-sequence terms, (B,) bits/token; total = prior + diffusion + reconstruction is an upper
    bound on -log2 p(w) / L. nfe: network evaluations per sequence."""

    prior: Tensor
    diffusion: Tensor
    reconstruction: Tensor
    total: Tensor
    nfe: int


def prior_kl(process: GaussianProcess, e: Tensor, scored: Tensor | None = None) -> Tensor:
    """KL(N(alpha_1 e, sigma_1^2 I) || N(0, I)) summed over dims and the ``scored`` positions
    (B, L) (all by default), (B,) nats."""
    one = torch.ones(1, dtype=torch.float64, device=e.device)
    a1, s1 = process.schedule.alpha(one), process.schedule.sigma(one)
    per_dim = 0.5 * (a1**2 * e.double() ** 2 + s1**2 - 1 - torch.log(s1**2))
    return (per_dim if scored is None else per_dim * scored[..., None]).sum((-1, -2))


@torch.no_grad()
def elbo(
    denoiser: Denoiser,
    process: GaussianProcess,
    tokens: Tensor,
    *,
    generator: torch.Generator | None = None,
    t_samples: int = 1,
    decoder: str = "embedding",
    held: Tensor | None = None,
) -> Elbo:
    """Monte Carlo VDM bound for tokens (B, L), ``t_samples`` stratified log-SNR levels per
    sequence; ``decoder`` chooses p(w | x_0) (see ``rounding_nll``). ``denoiser`` must be a pure
    function of (x_t, t), e.g. ``likelihood_denoiser``.

    ``held`` (B, L) bool: a context the bound conditions on (lm-eval's loglikelihood), shown at
    level 0 at every t (per-token levels) and left out of every term, so the terms are bits per
    scored token of -log p(the rest | the held tokens) under the reverse process that keeps
    them there. Every row needs a scored token."""
    if t_samples < 1:
        raise ValueError(f"t_samples must be >= 1, got {t_samples}")
    batch, length = tokens.shape
    held = torch.zeros_like(tokens, dtype=torch.bool) if held is None else held
    scored = ~held
    if not bool(scored.any(-1).all()):
        raise ValueError("every row needs a token that is not held for the ELBO to score")
    e = process.embedding(tokens).detach()
    ends = torch.tensor([1.0, 0.0], dtype=torch.float64, device=tokens.device)
    lo, hi = process.schedule.logsnr(ends)
    diffusion = torch.zeros(batch, dtype=torch.float64, device=tokens.device)
    u = stratified_times(batch * t_samples, tokens.device, generator).view(t_samples, batch)
    for k in range(t_samples):
        logsnr = lo + u[k].double() * (hi - lo)
        t = process.schedule.t_from_logsnr(logsnr).to(e.dtype)
        t = torch.where(held, 0.0, t[:, None]) if bool(held.any()) else t
        noise = torch.randn(e.shape, device=e.device, generator=generator, dtype=e.dtype)
        x0_hat = denoiser(process.noised(e, t, noise), t).x0
        error = ((e.double() - x0_hat.double()).pow(2) * scored[..., None]).sum((-1, -2))
        diffusion += 0.5 * (hi - lo) * logsnr.exp() * error
    diffusion /= t_samples
    zero = torch.zeros(batch, device=e.device, dtype=e.dtype)
    noise = torch.randn(e.shape, device=e.device, generator=generator, dtype=e.dtype)
    reconstruction = rounding_nll(
        process, denoiser, process.noised(e, zero, noise), tokens, decoder, scored
    )
    counted = scored.sum(-1).double()  # float64: an int tensor times ln 2 would be float32
    terms = [
        bits_per_token(v, counted)
        for v in (prior_kl(process, e, scored), diffusion, reconstruction)
    ]
    nfe = t_samples + (decoder == "model")
    return Elbo(*terms, total=sum(terms), nfe=nfe)


elbo.processes = ("gaussian",)  # the process kinds it scores (cdlm-eval checks)
# what it is a bound of: every token noised, so for a hybrid (CANDI) model, whose anchors stay
# clean, not the process it trained on or samples with (sampler=hybrid has no bound here)
elbo.scores = "the reverse SDE of pure Gaussian noise on every token"
