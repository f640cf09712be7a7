"""The time-sampler contract, stratified uniform times (the draw of the unbiased bound) and
the bounded draw the discrete processes share."""

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
    """Base class: uniform stratified times, the unbiased low-variance default.

    ``covers_all_levels``: whether every level in [0, 1] can be drawn (at the end of any
    curriculum). Only then can 1 / density weights restore the uniform-t objective: a proposal
    that never draws a level cannot be reweighted into one that does."""

    covers_all_levels = True

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


def check_reweightable(sampler: TimeSampler, key: str) -> None:
    """Refuses ``key`` (an importance-weighting switch) for a proposal that leaves out levels."""
    if not sampler.covers_all_levels:
        raise ValueError(
            f"{key}=true needs a time sampler that draws every level in [0, 1]; "
            f"{type(sampler).__name__} leaves some out, so no weight restores the bound"
        )


def stratified_normal(
    n: int, device: torch.device, generator: torch.Generator | None = None
) -> Tensor:
    """n standard normal draws, one per stratum of the CDF (inverse-CDF of stratified times)."""
    u = stratified_times(n, device, generator).clamp(1e-6, 1 - 1e-6)
    return math.sqrt(2.0) * torch.erfinv(2 * u - 1)
