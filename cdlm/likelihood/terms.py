"""What both likelihoods share: a deterministic denoiser, the rounding decoder, unit conversion."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cdlm.denoiser import Denoiser, Prediction
from cdlm.processes.gaussian import GaussianProcess

DECODERS = ("embedding", "model")


class DeterministicSelfConditioned:
    """x0_hat(x_t, t) = D(x_t, t, D(x_t, t)): the two-pass self-conditioned prediction of training
    (Chen et al. 2022) as a pure function of (x_t, t), so that it defines one ODE and one ELBO
    (the sampling-time wrapper feeds the previous step's estimate instead, which depends on the
    path). Gradients flow through both passes, as a divergence of this field needs."""

    def __init__(self, denoiser: Denoiser) -> None:
        self.denoiser = denoiser

    def __call__(
        self, x_t: Tensor, t: Tensor, self_cond: Tensor | None = None, **kwargs
    ) -> Prediction:
        return self.denoiser(x_t, t, self.denoiser(x_t, t, **kwargs).x0, **kwargs)


def likelihood_denoiser(process: GaussianProcess, network: nn.Module) -> Denoiser:
    """The denoiser the likelihoods score: self-conditioned if the model was trained with it."""
    denoiser = process.make_denoiser(network)
    return DeterministicSelfConditioned(denoiser) if process.input.self_cond_prob > 0 else denoiser


def rounding_nll(
    process: GaussianProcess,
    denoiser: Denoiser,
    x: Tensor,
    tokens: Tensor,
    decoder: str,
    scored: Tensor | None = None,
) -> Tensor:
    """-log p(w | x_{t=0}) summed over the ``scored`` positions (B, L) (all by default), (B,)
    nats. x: (B, L, D) a draw of x_{t=0}.

    ``embedding``: the exact posterior of the token under q(x_0 | w) = N(alpha_0 E[w], sigma_0^2 I)
    with a uniform token prior (VDM, Kingma et al. 2021, eq. 16), i.e. the nearest-embedding
    readout at temperature sigma_0^2 / alpha_0 (rows share one norm, so |E[v]|^2 cancels).
    ``model``: the network's own logits at t = 0 (factorised over positions given x_0).
    """
    if decoder not in DECODERS:
        raise ValueError(f"unknown decoder {decoder!r}; valid: {', '.join(DECODERS)}")
    zero = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    if decoder == "embedding":
        a0, s0 = process.schedule.alpha(zero[:1]), process.schedule.sigma(zero[:1])
        logits = (a0 / s0**2) * (x.double() @ process.embedding.table().double().T)
    else:
        logits = denoiser(x, zero.to(x.dtype)).logits.double()
    nll = F.cross_entropy(logits.flatten(0, 1), tokens.flatten(), reduction="none")
    nll = nll.view(tokens.shape)
    return (nll if scored is None else nll * scored).sum(-1)


def bits_per_token(nats: Tensor, n_tokens: int | Tensor) -> Tensor:
    """Per-sequence nats -> bits per token (``n_tokens``: one count, or one per sequence)."""
    return nats / (n_tokens * math.log(2))
