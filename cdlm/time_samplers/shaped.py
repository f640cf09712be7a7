"""Fixed proposals with a closed-form density: logit-normal, bell-shaped and clipped times."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from cdlm.time_samplers.base import TimeSampler, stratified_normal, stratified_times


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
        s = torch.sigmoid(self.mean + self.std * stratified_normal(n, device, generator))
        return self.shift * s / (1 + (self.shift - 1) * s)

    def density(self, t: Tensor) -> Tensor:
        t = t.double().clamp(1e-12, 1 - 1e-12)
        s = t / (self.shift - (self.shift - 1) * t)  # the unshifted time
        z = (torch.log(s) - torch.log1p(-s) - self.mean) / self.std
        p_s = torch.exp(-0.5 * z**2) / (self.std * math.sqrt(2 * math.pi) * s * (1 - s))
        dt_ds = self.shift / (1 + (self.shift - 1) * s) ** 2
        return p_s / dt_ds


def _normal_cdf(x: Tensor) -> Tensor:
    return 0.5 * (1 + torch.erf(x / math.sqrt(2.0)))


class Bell(TimeSampler):
    """Bell-shaped training times: a normal N(mean, std^2) truncated to [0, 1], drawn by its
    inverse CDF from stratified uniforms (float64), with its exact density.

    Hong et al. 2026 ("Understanding and Accelerating the Training of Masked Diffusion Language
    Models", arXiv 2605.13026) trace slow masked-diffusion training to the locality bias of
    language: at high mask rates a token's neighbours are mostly hidden and the target teaches
    little beyond unigrams; at very low rates it is nearly free. Drawing mask rates from a bell
    around the middle reached MDLM's LM1B validation NLL up to ~4x sooner. The truncated normal
    is our choice of bell; the defaults (0.5, 0.2) are untuned.
    """

    def __init__(self, mean: float = 0.5, std: float = 0.2) -> None:
        super().__init__()
        if not std > 0:
            raise ValueError(f"bell std must be > 0, got {std}")
        if not 0.0 <= mean <= 1.0:  # a peak outside [0, 1] is no bell, and its mass vanishes
            raise ValueError(f"bell mean must be a level in [0, 1], got {mean}")
        self.mean, self.std = mean, std

    def _ends(self) -> tuple[Tensor, Tensor]:
        """The normal's CDF at t = 0 and t = 1 (float64)."""
        ends = (torch.tensor([0.0, 1.0], dtype=torch.float64) - self.mean) / self.std
        lo, hi = _normal_cdf(ends)
        return lo, hi

    def forward(
        self, n: int, device: torch.device, generator: torch.Generator | None = None
    ) -> Tensor:
        lo, hi = self._ends()
        u = stratified_times(n, device, generator).double()
        p = (lo + (hi - lo) * u).clamp(1e-300, 1 - 1e-16)
        t = self.mean + self.std * math.sqrt(2.0) * torch.erfinv(2 * p - 1)
        return t.clamp(0.0, 1.0).float()

    def density(self, t: Tensor) -> Tensor:
        lo, hi = self._ends()
        z = (t.double() - self.mean) / self.std
        p = torch.exp(-0.5 * z**2) / (self.std * math.sqrt(2 * math.pi) * (hi - lo))
        inside = (t >= 0) & (t <= 1)
        return torch.where(inside, p, 0.0).to(t.dtype)


class Clipped(TimeSampler):
    """Clipped training times t ~ U[low, high] (stratified): BD3-LM's clipped mask rates
    (Arriola et al. 2025, Sec. 4.2), chosen to minimise the variance of the training loss's
    gradient. Levels outside [low, high] are never trained on, so the training loss is no
    longer the bound (validation still integrates all of [0, 1]) and importance weighting is
    refused. In the processes' own units: the discrete processes map t to t_min + (1 - t_min) t.
    """

    def __init__(self, low: float = 0.3, high: float = 0.8) -> None:
        super().__init__()
        if not 0.0 <= low < high <= 1.0:
            raise ValueError(f"clipped times need 0 <= low < high <= 1, got [{low}, {high}]")
        self.low, self.high = low, high
        self.covers_all_levels = (low, high) == (0.0, 1.0)

    def forward(
        self, n: int, device: torch.device, generator: torch.Generator | None = None
    ) -> Tensor:
        return self.low + (self.high - self.low) * stratified_times(n, device, generator)

    def density(self, t: Tensor) -> Tensor:
        inside = (t >= self.low) & (t <= self.high)
        return torch.where(inside, 1.0 / (self.high - self.low), 0.0).to(t.dtype)
