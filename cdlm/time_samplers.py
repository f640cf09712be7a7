"""Where training spends its noise levels: distributions over the training time t in [0, 1].

Every process's loss is an expectation over t, and on a short budget the draw of t decides what
the network learns first. Low noise is easy for embedding diffusion (a token's own noisy
embedding gives it away) and high mask rates teach a masked model little beyond unigram
frequencies, so the levers here move training towards the levels where context matters.
Validation always uses the uniform stratified draw, so the reported bound does not depend on the
sampler chosen for training.

A time sampler is a small ``nn.Module`` (its state is in buffers, so it is saved with the model
and resumes with it): ``sampler(n, device, generator) -> (n,)`` draws times in training and
changes nothing; ``observe(t, loss)`` lets learned samplers see the per-sequence losses of those
times, and ``set_progress(p)`` tells schedules over training how far the budget has gone (both
called explicitly, by the training module and ``cdlm.training.phases.Phases``).
Samplers with a known ``density(t)`` let a process importance-weight its loss by 1 / density,
which keeps the uniform-t objective (and, for a bound, its value) unbiased under the proposal.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn


def stratified_times(
    n: int, device: torch.device, generator: torch.Generator | None = None
) -> Tensor:
    """n times in [0, 1), one in each of n equal strata with a shared random offset
    (antithetic/stratified sampling, Kingma et al. 2021): same mean, lower variance than U(0,1)."""
    u = torch.rand((), device=device, generator=generator)
    return (u + torch.arange(n, device=device) / n) % 1.0


def bounded_times(
    sampler: Callable, training: bool, n: int, device, generator, t_min: float
) -> Tensor:
    """n times in [t_min, 1): ``sampler``'s draw in training, stratified uniform (the draw of
    the unbiased bound) in evaluation; the discrete processes' ``sample_t``. ``device``: the
    generator's when None."""
    device = device if device is not None else getattr(generator, "device", None)
    u = sampler(n, device, generator) if training else stratified_times(n, device, generator)
    return t_min + (1.0 - t_min) * u


class TimeSampler(nn.Module):
    """Base class: uniform stratified times, the unbiased low-variance default."""

    def forward(
        self, n: int, device: torch.device, generator: torch.Generator | None = None
    ) -> Tensor:
        return stratified_times(n, device, generator)

    def observe(self, t: Tensor, loss: Tensor) -> None:
        """Per-sequence training losses (n,) at times t (n,); learned samplers use them."""

    def set_progress(self, progress: float) -> None:
        """The share of the training budget spent, in [0, 1]; schedules over training use it."""

    def attach(self, schedule: nn.Module) -> None:
        """The process's noise schedule, for samplers defined over log-SNR (not a child module:
        the schedule belongs to the process)."""

    def density(self, t: Tensor) -> Tensor:
        """The probability density of a draw at t (uniform: 1), for importance weights."""
        return torch.ones_like(t)


class Stratified(TimeSampler):
    """Uniform stratified times (Kingma et al. 2021, "VDM", App. I.1): one draw per stratum."""


class Curriculum(TimeSampler):
    """A curriculum on the noise level: t ~ U(0, hi) with hi rising linearly from ``start`` to 1
    over the first ``ramp`` share of the training budget (stratified within the range).

    For masked diffusion t is the mask rate, so training starts BERT-like (``start`` = 0.15: at
    most 15% masked, Devlin et al. 2019), where every masked token has most of its context, and
    ends on the full MDLM objective. A masked model trained on t ~ U(0, 1) from scratch sits on the
    unigram plateau for hundreds of steps; a low mask rate gets it using context in ~150 (see
    docs/results/historical/budget.md). ``cdlm.training.phases.Phases`` sets the budget share before every training
    batch (so a resumed run continues the ramp); it is not part of the model file.
    """

    def __init__(self, start: float = 0.15, ramp: float = 0.3) -> None:
        super().__init__()
        if not 0.0 < start <= 1.0:
            raise ValueError(f"curriculum start must be in (0, 1], got {start}")
        if not 0.0 <= ramp <= 1.0:
            raise ValueError(f"curriculum ramp is a share of the budget in [0, 1], got {ramp}")
        self.start, self.ramp = start, ramp
        # Set before every batch by the Phases callback; not part of the model file.
        self.register_buffer("progress", torch.zeros(()), persistent=False)

    def set_progress(self, progress: float) -> None:
        self.progress.fill_(progress)

    def high(self) -> float:
        """The current upper end of the range."""
        if self.ramp == 0:
            return 1.0
        done = min(1.0, float(self.progress) / self.ramp)
        return self.start + (1.0 - self.start) * done

    def forward(
        self, n: int, device: torch.device, generator: torch.Generator | None = None
    ) -> Tensor:
        return self.high() * stratified_times(n, device, generator)


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


def _stratified_normal(
    n: int, device: torch.device, generator: torch.Generator | None = None
) -> Tensor:
    """n standard normal draws, one per stratum of the CDF (inverse-CDF of stratified times)."""
    u = stratified_times(n, device, generator).clamp(1e-6, 1 - 1e-6)
    return math.sqrt(2.0) * torch.erfinv(2 * u - 1)


class LogitNormal(TimeSampler):
    """t = shift * s / (1 + (shift - 1) s), s = sigmoid(mean + std * z), z ~ N(0, 1): the
    logit-normal times of rectified flow (Esser et al. 2024, "SD3", Sec. 3.1 and the resolution
    shift of Sec. 5.3.2) that ELF (Hu et al. 2026) trains with. ``shift`` > 1 moves training
    towards high noise, where a token's own noisy embedding no longer gives it away."""

    def __init__(self, mean: float = 0.0, std: float = 1.0, shift: float = 1.0) -> None:
        super().__init__()
        if std <= 0 or shift <= 0:
            raise ValueError(f"logit-normal std and shift must be > 0, got {std}, {shift}")
        self.mean, self.std, self.shift = mean, std, shift

    def forward(
        self, n: int, device: torch.device, generator: torch.Generator | None = None
    ) -> Tensor:
        s = torch.sigmoid(self.mean + self.std * _stratified_normal(n, device, generator))
        return self.shift * s / (1 + (self.shift - 1) * s)

    def density(self, t: Tensor) -> Tensor:
        t = t.double().clamp(1e-12, 1 - 1e-12)
        s = t / (self.shift - (self.shift - 1) * t)  # the unshifted time
        z = (torch.log(s) - torch.log1p(-s) - self.mean) / self.std
        p_s = torch.exp(-0.5 * z**2) / (self.std * math.sqrt(2 * math.pi) * s * (1 - s))
        dt_ds = self.shift / (1 + (self.shift - 1) * s) ** 2
        return p_s / dt_ds


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
