"""Proposals learned from the training loss: CDCD time warping and a log-SNR Gumbel."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from cdlm.time_samplers.base import TimeSampler, stratified_times


class Warped(TimeSampler):
    """CDCD time warping (Dieleman et al. 2022, Sec. 4.1 "time warping"): learn the training
    loss as a monotone function F(t) and draw t = F^{-1}(u), so that training times are spread
    uniformly in loss ("entropy") rather than in t. It concentrates training where the loss
    changes fastest, i.e. between "the own embedding gives the token away" and "pure noise".

    F is piecewise linear over ``bins`` equal bins of t: an exponential moving average of the
    per-bin loss, made monotone by a running maximum. A ``uniform`` share of the draws stays
    uniform so that no level is ever abandoned and its loss estimate stays current.
    """

    def __init__(self, bins: int = 50, momentum: float = 0.05, uniform: float = 0.1) -> None:
        super().__init__()
        if bins < 2:
            raise ValueError(f"bins must be >= 2, got {bins}")
        if not 0.0 < momentum <= 1.0:
            raise ValueError(f"momentum must be in (0, 1], got {momentum}")
        if not 0.0 <= uniform <= 1.0:
            raise ValueError(f"uniform must be in [0, 1], got {uniform}")
        self.bins, self.momentum, self.uniform = bins, momentum, uniform
        self.register_buffer("loss", torch.zeros(bins))
        self.register_buffer("seen", torch.zeros(bins, dtype=torch.bool))

    def bin_density(self) -> Tensor:
        """(bins,) probability of each bin: the increments of the monotone loss fit, mixed with
        uniform. Uniform until every bin has been seen."""
        flat = torch.full((self.bins,), 1.0 / self.bins, device=self.loss.device)
        if not bool(self.seen.all()):
            return flat
        fit = torch.cummax(self.loss, dim=0).values
        steps = torch.diff(fit, prepend=fit[:1] * 0 + fit[0])
        steps[0] = 0.0
        total = steps.sum()
        if total <= 0:
            return flat
        return self.uniform * flat + (1.0 - self.uniform) * steps / total

    def forward(
        self, n: int, device: torch.device, generator: torch.Generator | None = None
    ) -> Tensor:
        return self.quantile(stratified_times(n, device, generator))

    def quantile(self, u: Tensor) -> Tensor:
        """t = F^{-1}(u) for u in [0, 1]: the warped time of a uniform one. Also spaces the
        steps of a sampling grid (CDCD Sec. 4.1 uses the warping at sampling too)."""
        device = u.device
        cdf = torch.cumsum(self.bin_density(), 0).to(device, u.dtype)
        k = torch.searchsorted(cdf, u.clamp_max(cdf[-1] - 1e-7), right=True).clamp_max(
            self.bins - 1
        )
        lo = torch.where(k > 0, cdf[(k - 1).clamp_min(0)], torch.zeros_like(u))
        within = (u - lo) / (cdf[k] - lo).clamp_min(1e-12)
        return (k + within.clamp(0.0, 1.0)) / self.bins

    def density(self, t: Tensor) -> Tensor:
        """Piecewise constant: bins * (probability of t's bin)."""
        k = (t * self.bins).long().clamp(0, self.bins - 1)
        return self.bins * self.bin_density().to(t.device)[k]

    @torch.no_grad()
    def observe(self, t: Tensor, loss: Tensor) -> None:
        k = (t.detach().float() * self.bins).long().clamp(0, self.bins - 1)
        total = torch.zeros(self.bins, device=k.device).index_add_(0, k, loss.detach().float())
        count = torch.zeros(self.bins, device=k.device).index_add_(0, k, torch.ones_like(total[k]))
        hit = count > 0
        mean = total[hit] / count[hit]
        old = self.loss[hit]
        self.loss[hit] = torch.where(self.seen[hit], old + self.momentum * (mean - old), mean)
        self.seen |= hit


EULER_GAMMA = 0.5772156649015329


class LogSNRGumbel(Warped):
    """A learned noise-level proposal over log-SNR, lambda ~ Gumbel(loc, scale) truncated to the
    schedule's range, after LangFlow (Chen et al. 2026, "information-uniform" levels). Our
    reading of the principle: draw lambda where the training loss changes with the level, i.e.
    where the network has information to learn. The loss curve is fitted as ``Warped`` fits it
    (binned EMA, monotone); the Gumbel is moment-matched to the density of its increments after
    every observation: mean = loc + gamma scale, variance = pi^2 scale^2 / 6. Until every bin has
    been seen it draws from the initial (loc, scale).

    Unlike ``Warped``'s piecewise-linear quantile, the draw is a smooth two-parameter family
    with an exact density (``density``), so the loss can be importance-weighted back to uniform t.
    """

    def __init__(
        self, loc: float = 0.0, scale: float = 3.0, bins: int = 50, momentum: float = 0.05
    ) -> None:
        super().__init__(bins=bins, momentum=momentum, uniform=0.0)
        if scale <= 0:
            raise ValueError(f"Gumbel scale must be > 0, got {scale}")
        self.register_buffer("params", torch.tensor([loc, scale], dtype=torch.float64))
        object.__setattr__(self, "schedule", None)

    def attach(self, schedule: nn.Module) -> None:
        if not hasattr(schedule, "logsnr"):
            raise ValueError(
                "time_sampler=gumbel draws log-SNR levels: it applies to process=gaussian "
                f"(a VP schedule), not to a {type(schedule).__name__}"
            )
        object.__setattr__(self, "schedule", schedule)

    def _range(self) -> tuple[Tensor, Tensor]:
        """Gumbel CDF at the schedule's log-SNR ends: (F(lambda(1)), F(lambda(0)))."""
        if self.schedule is None:
            raise ValueError(
                "LogSNRGumbel needs the process's schedule (GaussianProcess attaches it)"
            )
        ends = self.schedule.logsnr(torch.tensor([1.0, 0.0], dtype=torch.float64))
        return tuple(self._cdf(ends.to(self.params.device)))

    def _cdf(self, lam: Tensor) -> Tensor:
        loc, scale = self.params
        return torch.exp(-torch.exp(-(lam - loc) / scale))

    def forward(
        self, n: int, device: torch.device, generator: torch.Generator | None = None
    ) -> Tensor:
        lo, hi = self._range()
        u = lo + (hi - lo) * stratified_times(n, device, generator).double().to(lo.device)
        loc, scale = self.params
        lam = loc - scale * torch.log(-torch.log(u.clamp(1e-300, 1 - 1e-16)))
        return self.schedule.t_from_logsnr(lam).clamp(0.0, 1.0).float().to(device)

    def density(self, t: Tensor) -> Tensor:
        lo, hi = self._range()
        tt = t.double().to(lo.device)
        lam = self.schedule.logsnr(tt)
        loc, scale = self.params
        z = (lam - loc) / scale
        p_lam = torch.exp(-(z + torch.exp(-z))) / scale / (hi - lo)
        return (p_lam * self.schedule.dlogsnr(tt).abs()).to(t.device)

    @torch.no_grad()
    def observe(self, t: Tensor, loss: Tensor) -> None:
        super().observe(t, loss)
        if not bool(self.seen.all()) or self.schedule is None:
            return
        mass = self.bin_density().double()
        centres = (torch.arange(self.bins, dtype=torch.float64) + 0.5) / self.bins
        lam = self.schedule.logsnr(centres).to(mass.device)
        mean = (mass * lam).sum()
        std = ((mass * (lam - mean) ** 2).sum()).sqrt().clamp_min(1e-3)
        scale = std * math.sqrt(6.0) / math.pi
        self.params.copy_(torch.stack([mean - EULER_GAMMA * scale, scale]))
