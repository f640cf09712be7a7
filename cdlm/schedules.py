"""Noise schedules in continuous time t in [0, 1]: variance-preserving Gaussian schedules
(``Schedule``) and masking schedules for absorbing-state diffusion (``MaskSchedule``, at the end).

Each schedule is defined by its log signal-to-noise ratio ``logsnr(t)`` (decreasing in t) and its
analytic derivative. Everything else follows from it, so alpha^2 + sigma^2 = 1 holds by
construction:

    alpha^2 = sigmoid(logsnr),  sigma^2 = sigmoid(-logsnr),
    d alpha / dt =  0.5 * alpha * sigma^2 * dlogsnr/dt,
    d sigma / dt = -0.5 * sigma * alpha^2 * dlogsnr/dt.

Schedules are small stateless ``nn.Module``s so that they move with the model and serialise as
part of its config (never pickled).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class Schedule(nn.Module):
    """Base class: subclasses implement ``logsnr`` and ``dlogsnr``."""

    def logsnr(self, t: Tensor) -> Tensor:
        raise NotImplementedError

    def dlogsnr(self, t: Tensor) -> Tensor:
        raise NotImplementedError

    def alpha(self, t: Tensor) -> Tensor:
        return torch.sigmoid(self.logsnr(t)).sqrt()

    def sigma(self, t: Tensor) -> Tensor:
        return torch.sigmoid(-self.logsnr(t)).sqrt()

    def dalpha(self, t: Tensor) -> Tensor:
        return 0.5 * self.alpha(t) * self.sigma(t) ** 2 * self.dlogsnr(t)

    def dsigma(self, t: Tensor) -> Tensor:
        return -0.5 * self.sigma(t) * self.alpha(t) ** 2 * self.dlogsnr(t)

    def t_from_logsnr(self, logsnr: Tensor, iters: int = 60) -> Tensor:
        """Inverse of ``logsnr`` by bisection (valid for any monotone schedule)."""
        lo = torch.zeros_like(logsnr, dtype=torch.float64)
        hi = torch.ones_like(logsnr, dtype=torch.float64)
        target = logsnr.to(torch.float64)
        for _ in range(iters):
            mid = (lo + hi) / 2
            above = self.logsnr(mid) > target  # still too clean: move right
            lo = torch.where(above, mid, lo)
            hi = torch.where(above, hi, mid)
        return ((lo + hi) / 2).to(logsnr.dtype)


class CosineSchedule(Schedule):
    """Cosine schedule (Nichol & Dhariwal 2021), alpha = cos(pi t / 2), with its log-SNR clipped
    to [logsnr_min, logsnr_max] by an affine map of t (Kingma et al. 2021, "VDM"; Hoogeboom et al.
    2023, "simple diffusion"): logsnr(t) = -2 log tan(a t + b). Finite endpoints keep the network's
    noise conditioning and the ELBO finite."""

    def __init__(self, logsnr_min: float = -10.0, logsnr_max: float = 10.0) -> None:
        super().__init__()
        if not logsnr_min < logsnr_max:
            raise ValueError(f"need logsnr_min < logsnr_max, got {logsnr_min}, {logsnr_max}")
        self.logsnr_min, self.logsnr_max = logsnr_min, logsnr_max
        self.b = math.atan(math.exp(-0.5 * logsnr_max))
        self.a = math.atan(math.exp(-0.5 * logsnr_min)) - self.b

    def logsnr(self, t: Tensor) -> Tensor:
        return -2.0 * torch.log(torch.tan(self.a * t + self.b))

    def dlogsnr(self, t: Tensor) -> Tensor:
        u = self.a * t + self.b
        return -2.0 * self.a / (torch.sin(u) * torch.cos(u))


class LinearSchedule(Schedule):
    """The DDPM linear-beta schedule in continuous time (Song et al. 2021, VP-SDE):
    alpha^2 = exp(-B(t)), B(t) = eps + beta_min t + (beta_max - beta_min) t^2 / 2.
    ``eps`` keeps logsnr(0) finite."""

    def __init__(self, beta_min: float = 0.1, beta_max: float = 20.0, eps: float = 1e-4) -> None:
        super().__init__()
        self.beta_min, self.beta_max, self.eps = beta_min, beta_max, eps

    def _b(self, t: Tensor) -> Tensor:
        return self.eps + self.beta_min * t + 0.5 * (self.beta_max - self.beta_min) * t**2

    def logsnr(self, t: Tensor) -> Tensor:
        return -torch.log(torch.expm1(self._b(t)))

    def dlogsnr(self, t: Tensor) -> Tensor:
        db = self.beta_min + (self.beta_max - self.beta_min) * t
        return -db / (-torch.expm1(-self._b(t)))


class SqrtSchedule(Schedule):
    """Diffusion-LM's sqrt schedule (Li et al. 2022): alpha^2 = 1 - sqrt(u), u = s + (1 - 2s) t.
    It adds noise fast at small t, where embedding diffusion otherwise wastes steps."""

    def __init__(self, s: float = 1e-4) -> None:
        super().__init__()
        self.s = s

    def _u(self, t: Tensor) -> Tensor:
        return self.s + (1.0 - 2.0 * self.s) * t

    def logsnr(self, t: Tensor) -> Tensor:
        r = self._u(t).sqrt()
        return torch.log1p(-r) - torch.log(r)

    def dlogsnr(self, t: Tensor) -> Tensor:
        u = self._u(t)
        r = u.sqrt()
        return (-1.0 / (2.0 * r * (1.0 - r)) - 1.0 / (2.0 * u)) * (1.0 - 2.0 * self.s)


class MaskSchedule(nn.Module):
    """Absorbing-state (masking) schedule: ``keep(t)`` is the probability that a token is still
    unmasked at time t (MDLM's alpha_t), decreasing from ~1 at t = 0 to ~0 at t = 1."""

    def keep(self, t: Tensor) -> Tensor:
        raise NotImplementedError

    def dkeep(self, t: Tensor) -> Tensor:
        raise NotImplementedError

    def time_of(self, keep: Tensor) -> Tensor:
        """The time at which ``keep(t)`` equals ``keep`` (clamped to [0, 1]): the level of a
        complementary mask (Fast-dLLM v2), which keeps what the first one masked."""
        raise NotImplementedError


class LogLinearMaskSchedule(MaskSchedule):
    """MDLM's log-linear schedule (Sahoo et al. 2024): keep(t) = 1 - (1 - eps) t, so the ELBO
    weight -keep'/(1 - keep) is 1/t and the expected fraction of masks grows linearly."""

    def __init__(self, eps: float = 1e-3) -> None:
        super().__init__()
        self.eps = eps

    def keep(self, t: Tensor) -> Tensor:
        return 1.0 - (1.0 - self.eps) * t

    def dkeep(self, t: Tensor) -> Tensor:
        return torch.full_like(t, -(1.0 - self.eps))

    def time_of(self, keep: Tensor) -> Tensor:
        return ((1.0 - keep) / (1.0 - self.eps)).clamp(0.0, 1.0)


class CosineMaskSchedule(MaskSchedule):
    """Cosine masking schedule (MaskGIT, Chang et al. 2022; MD4, Shi et al. 2024):
    keep(t) = eps + (1 - eps) cos(pi t / 2); it masks slowly at first and fast at the end."""

    def __init__(self, eps: float = 1e-3) -> None:
        super().__init__()
        self.eps = eps

    def keep(self, t: Tensor) -> Tensor:
        return self.eps + (1.0 - self.eps) * torch.cos(0.5 * math.pi * t)

    def dkeep(self, t: Tensor) -> Tensor:
        return -(1.0 - self.eps) * 0.5 * math.pi * torch.sin(0.5 * math.pi * t)

    def time_of(self, keep: Tensor) -> Tensor:
        cos = ((keep - self.eps) / (1.0 - self.eps)).clamp(0.0, 1.0)
        return torch.arccos(cos) * (2.0 / math.pi)
