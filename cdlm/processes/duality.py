"""The Diffusion Duality (Sahoo et al., ICML 2025, Sec. 3): Gaussian diffusion over one-hot
tokens, read through an argmax, is uniform-state discrete diffusion.

With z = a e_x + s eps over V one-hot dimensions (a^2 = sigmoid(logsnr), s^2 = sigmoid(-logsnr)),
argmax(z) is x with probability

    T(mu) = int phi(u) Phi(u + mu)^(V - 1) du,   mu = a / s = exp(logsnr / 2),

and otherwise uniform over the other tokens, i.e. uniform-state diffusion with

    alpha = (V T(mu) - 1) / (V - 1).

T has no closed form; like the reference (which tabulates it with scipy's ``quad``), we integrate
numerically: a trapezoid rule in u, in float64 and log space (Phi^(V-1) underflows for a
realistic V), which converges geometrically for this smooth, Gaussian-tailed integrand.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from cdlm.schedules import MaskSchedule, Schedule

_U = torch.linspace(-14.0, 14.0, 8001, dtype=torch.float64)  # phi(14) ~ 1e-43: the tails vanish


def _integrals(mu: Tensor, vocab_size: int) -> tuple[Tensor, Tensor]:
    """(T(mu), dT/dmu), each shaped like ``mu``, by the trapezoid rule over ``_U``."""
    u = _U.to(mu.device)
    x = mu.double()[..., None] + u  # the one-hot coordinate of the true token
    log_w = -0.5 * u**2 - 0.5 * math.log(2 * math.pi) + (vocab_size - 1) * torch.special.log_ndtr(x)
    w = log_w.exp()
    # dT/dmu = int phi(u) (V - 1) Phi^(V-2)(u + mu) phi(u + mu) du = int u phi(u) Phi^(V-1)(u+mu) du
    return torch.trapezoid(w, u, dim=-1), torch.trapezoid(w * u, u, dim=-1)


def uniform_alpha(logsnr: Tensor, vocab_size: int) -> Tensor:
    """alpha of the uniform-state process that a Gaussian over one-hots at ``logsnr`` maps to
    (float64, shaped like ``logsnr``)."""
    if vocab_size < 2:
        raise ValueError(f"the duality needs a vocabulary of at least 2, got {vocab_size}")
    t, _ = _integrals(torch.exp(0.5 * logsnr.double()), vocab_size)
    return (vocab_size * t - 1.0) / (vocab_size - 1.0)


def uniform_dalpha_dlogsnr(logsnr: Tensor, vocab_size: int) -> Tensor:
    """d alpha / d logsnr of ``uniform_alpha`` (float64): V / (V - 1) dT/dmu * mu / 2."""
    mu = torch.exp(0.5 * logsnr.double())
    _, dt = _integrals(mu, vocab_size)
    return vocab_size / (vocab_size - 1.0) * dt * 0.5 * mu


class DualSchedule(MaskSchedule):
    """The uniform-state schedule a Gaussian ``schedule`` (``cdlm.schedules.Schedule``) induces
    through the argmax: keep(t) = uniform_alpha(logsnr(t)). What Duo's curriculum trains the
    uniform model with while it still feeds Gaussian-relaxed inputs."""

    def __init__(self, gaussian: Schedule, vocab_size: int) -> None:
        super().__init__()
        self.gaussian, self.vocab_size = gaussian, vocab_size

    def keep(self, t: Tensor) -> Tensor:
        return uniform_alpha(self.gaussian.logsnr(t), self.vocab_size).to(t.dtype)

    def dkeep(self, t: Tensor) -> Tensor:
        slope = uniform_dalpha_dlogsnr(self.gaussian.logsnr(t), self.vocab_size)
        return (slope * self.gaussian.dlogsnr(t).double()).to(t.dtype)

    def time_of(self, keep: Tensor) -> Tensor:
        """By bisection: keep(t) decreases in t."""
        lo, hi = (
            torch.zeros_like(keep, dtype=torch.float64),
            torch.ones_like(keep, dtype=torch.float64),
        )
        for _ in range(60):
            mid = (lo + hi) / 2
            above = self.keep(mid) > keep.double()
            lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
        return ((lo + hi) / 2).to(keep.dtype)
