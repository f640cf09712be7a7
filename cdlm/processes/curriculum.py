"""Duo's Gaussian curriculum (Sahoo et al., ICML 2025, "The Diffusion Duality", Sec. 4):
train a uniform-state model on a low-temperature relaxation of its own corruption.

By the duality (``cdlm.processes.duality``) the argmax of the Gaussian latent over one-hots

    w = a e_x + s eps,   a^2 = sigmoid(logsnr), s^2 = sigmoid(-logsnr),   eps ~ N(0, I_V),

is a uniform-state draw x_t at alpha = uniform_alpha(logsnr). For a share of training the network
reads softmax(w / tau) instead of the one-hot of x_t: nearly the same input at small tau, but
differentiable in the noise and with the runners-up still visible, which the paper reports cuts the
variance of the gradient and speeds training. The loss stays the uniform-state NELBO at x_t =
argmax(w) and the mapped alpha(t), alpha'(t). The Gaussian's logSNR is linear in t over
[-gamma_max, -gamma_min] (the reference's gamma = -logSNR range), a ``cdlm.schedules.Schedule``,
so its mapped schedule is the exact ``DualSchedule``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from cdlm.processes.duality import DualSchedule
from cdlm.schedules import Schedule


class LinearLogSNR(Schedule):
    """logsnr(t) = hi + t (lo - hi): Duo's gamma_t = gamma_min + t (gamma_max - gamma_min) with
    gamma = -logsnr."""

    def __init__(self, hi: float, lo: float) -> None:
        super().__init__()
        self.hi, self.lo = hi, lo

    def logsnr(self, t: Tensor) -> Tensor:
        return self.hi + t * (self.lo - self.hi)

    def dlogsnr(self, t: Tensor) -> Tensor:
        return torch.full_like(t, self.lo - self.hi)


def gaussian_latent(tokens: Tensor, logsnr: Tensor, noise: Tensor) -> Tensor:
    """(B, L, V) w = a e_x + s eps; tokens (B, L) ids, logsnr (B,), noise (B, L, V)."""
    a = torch.sigmoid(logsnr).sqrt()[:, None, None].to(noise.dtype)
    s = torch.sigmoid(-logsnr).sqrt()[:, None, None].to(noise.dtype)
    return a * nn.functional.one_hot(tokens, noise.shape[-1]).to(noise.dtype) + s * noise


@dataclass
class Relaxed:
    """One relaxed corruption. soft: (B, L, V) softmax(w / tau), the network's input; x_t:
    (B, L) argmax(w), the exact uniform-state draw; keep, dkeep: (B,) alpha(t), alpha'(t) of the
    mapped schedule."""

    soft: Tensor
    x_t: Tensor
    keep: Tensor
    dkeep: Tensor


class GaussianCurriculum(nn.Module):
    """When and how a uniform-state process trains on relaxed inputs.

    Args:
        share: share of the training budget that trains on relaxed inputs (0: never; Duo's
            recipe trains 500K of 1M steps so, 0.5).
        tau_start, tau_end: softmax temperature at the start and at the end of the share,
            interpolated in log10 (Duo's scripts: 1e-3 throughout).
        gamma_min, gamma_max: the Gaussian's gamma = -logSNR range over t in [0, 1] (Duo's
            LM1B recipe: -3.5, -1.75).
    """

    def __init__(
        self,
        share: float = 0.0,
        tau_start: float = 1e-3,
        tau_end: float = 1e-3,
        gamma_min: float = -3.5,
        gamma_max: float = -1.75,
    ) -> None:
        super().__init__()
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"curriculum.share is a share of the budget in [0, 1], got {share}")
        if not (tau_start > 0 and tau_end > 0):
            raise ValueError(f"curriculum temperatures must be > 0, got {tau_start}, {tau_end}")
        if not gamma_min < gamma_max:
            raise ValueError(
                f"curriculum needs gamma_min < gamma_max, got {gamma_min}, {gamma_max}"
            )
        self.share, self.tau_start, self.tau_end = share, tau_start, tau_end
        self.gaussian = LinearLogSNR(hi=-gamma_min, lo=-gamma_max)
        # Set before every batch through the process's set_progress; not part of the model file.
        self.register_buffer("progress", torch.zeros(()), persistent=False)

    def set_progress(self, progress: float) -> None:
        self.progress.fill_(progress)

    def active(self) -> bool:
        """Whether training is still inside the curriculum's share."""
        return float(self.progress) < self.share

    def temperature(self) -> float:
        """tau at the current progress, log-linear from tau_start to tau_end over the share."""
        done = min(1.0, float(self.progress) / self.share) if self.share > 0 else 1.0
        log_tau = math.log10(self.tau_start) + done * (
            math.log10(self.tau_end) - math.log10(self.tau_start)
        )
        return 10.0**log_tau

    def relax(
        self, tokens: Tensor, t: Tensor, noise: Tensor, support: Tensor | None = None
    ) -> Relaxed:
        """The relaxed corruption of ``tokens`` (B, L) at curriculum times t (B,) with the
        Gaussian draw ``noise`` (B, L, V); on a noise ``support`` ((V,) bool, None: all V) the
        latent lives on its K one-hots, so the argmax and the softmax never leave it."""
        w = gaussian_latent(tokens, self.gaussian.logsnr(t), noise)
        states = noise.shape[-1]
        if support is not None:
            w, states = w.masked_fill(~support, -math.inf), int(support.sum())
        dual = DualSchedule(self.gaussian, states)
        return Relaxed(
            soft=(w / self.temperature()).softmax(-1),
            x_t=w.argmax(-1),
            keep=dual.keep(t),
            dkeep=dual.dkeep(t),
        )
