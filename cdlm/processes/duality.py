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

import functools
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


_GRID = torch.linspace(-30.0, 30.0, 2049, dtype=torch.float64)  # logsnr: alpha from ~0 to ~1


@functools.lru_cache(maxsize=8)
def _alpha_table(vocab_size: int) -> Tensor:
    """``uniform_alpha`` on ``_GRID`` (CPU), made non-decreasing against quadrature noise in its
    flat ends: computed once per vocabulary."""
    return torch.cummax(uniform_alpha(_GRID, vocab_size), 0).values


def logsnr_of_alpha(alpha: Tensor, vocab_size: int) -> Tensor:
    """The inverse of ``uniform_alpha`` (float64, shaped like ``alpha``): the logsnr whose argmax
    keeps a token with probability ``alpha``, so that a uniform-state process at any alpha(t)
    can be read as a Gaussian over one-hots (Duo's consistency distillation). Interpolated in a
    table of ``uniform_alpha`` over logsnr in [-30, 30], then refined by Newton steps kept inside
    the table's bracket: a few quadratures per distinct value instead of a bisection's 64,
    which made this the cost of a DCD training step. alpha at 0 or 1 lands where the table
    first reaches it."""
    target, where = alpha.double().unique(return_inverse=True)
    table = _alpha_table(vocab_size).to(target.device)
    grid = _GRID.to(target.device)
    k = torch.searchsorted(table, target).clamp(1, len(grid) - 1)
    lo, hi, a_lo, a_hi = grid[k - 1], grid[k], table[k - 1], table[k]
    x = lo + (hi - lo) * ((target - a_lo) / (a_hi - a_lo).clamp_min(1e-300)).clamp(0.0, 1.0)
    for _ in range(4):
        mu = torch.exp(0.5 * x)
        t, dt = _integrals(mu, vocab_size)
        value = (vocab_size * t - 1.0) / (vocab_size - 1.0) - target
        slope = vocab_size / (vocab_size - 1.0) * dt * 0.5 * mu
        step = torch.where(slope > 0, value / slope.clamp_min(1e-300), torch.zeros_like(x))
        x = torch.minimum(torch.maximum(x - step, lo), hi)
    return x[where]


def argmax_pair(
    tokens: Tensor, mu_t: Tensor, mu_s: Tensor, own: Tensor, runner: Tensor, runner_id: Tensor
) -> tuple[Tensor, Tensor]:
    """(x_t, x_s), each (B, L): argmax(mu e_x + eps) over the V one-hot dims at two signal
    levels ``mu_t``, ``mu_s`` (broadcast to (B, L); mu = alpha / sigma = exp(logsnr / 2)) with
    ONE noise eps, given only what decides the argmax: the token's own coordinate ``own`` =
    eps_x, the largest other coordinate ``runner`` = max_{j != x} eps_j and its index
    ``runner_id``. The token wins where eps_x + mu > runner, else the runner does; so the pair
    never needs the (B, L, V) latent."""
    x_t = torch.where(own + mu_t > runner, tokens, runner_id)
    x_s = torch.where(own + mu_s > runner, tokens, runner_id)
    return x_t, x_s


def draw_runner(
    tokens: Tensor, vocab_size: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(own, runner, runner_id) of a standard Gaussian eps over V dims, each (B, L), drawn
    exactly in O(B L): eps_x ~ N(0, 1); the max of V - 1 iid normals has CDF Phi^(V-1), so
    runner = Phi^-1(U^(1 / (V - 1))) (float64, through expm1 so that U^(1/(V-1)) near 1 keeps
    its digits); its index is uniform over the other tokens and independent of its value."""
    shape, device = tokens.shape, tokens.device
    own = torch.randn(shape, device=device, dtype=torch.float64, generator=generator)
    u = torch.rand(shape, device=device, dtype=torch.float64, generator=generator)
    # Phi^-1(p) = -Phi^-1(1 - p), 1 - p = -expm1(log(u) / (V - 1))
    runner = -torch.special.ndtri(-torch.expm1(torch.log(u) / (vocab_size - 1)))
    other = torch.randint(0, vocab_size - 1, shape, device=device, generator=generator)
    return own, runner, other + (other >= tokens).long()


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
