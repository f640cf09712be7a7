"""A curriculum on the noise level over the training budget."""

from __future__ import annotations

import torch
from torch import Tensor

from cdlm.time_samplers.base import TimeSampler


class Curriculum(TimeSampler):
    """A curriculum on the noise level: t ~ U(0, hi) with hi rising linearly from ``start`` to 1
    over the first ``ramp`` share of the training budget (stratified within the range).

    For masked diffusion t is the mask rate, so training starts BERT-like (``start`` = 0.15: at
    most 15% masked, Devlin et al. 2019), where every masked token has most of its context, and
    ends on the full MDLM objective. A masked model trained on t ~ U(0, 1) from scratch sits on the
    unigram plateau for hundreds of steps; a low mask rate gets it using context in ~150 (see
    docs/results/historical/budget.md). ``cdlm.training.phases.Phases`` sets the budget share before every training
    batch (so a resumed run continues the ramp); it is not part of the model file.

    ``base``: a fixed proposal shaped inside the range, t = hi * base's draw (e.g. ``Bell``:
    a bell over the mask rates reached so far), instead of uniform. Its density is exact at
    every point of the ramp; importance weights restore the uniform-t objective only once the
    range is all of [0, 1] (before that no level above hi is drawn).
    """

    def __init__(
        self, start: float = 0.15, ramp: float = 0.3, base: TimeSampler | None = None
    ) -> None:
        super().__init__()
        if not 0.0 < start <= 1.0:
            raise ValueError(f"curriculum start must be in (0, 1], got {start}")
        if not 0.0 <= ramp <= 1.0:
            raise ValueError(f"curriculum ramp is a share of the budget in [0, 1], got {ramp}")
        self.start, self.ramp = start, ramp
        self.base = base if base is not None else TimeSampler()
        self.covers_all_levels = self.base.covers_all_levels
        # Set before every batch by the Phases callback; not part of the model file.
        self.register_buffer("progress", torch.zeros(()), persistent=False)

    def set_progress(self, progress: float) -> None:
        self.progress.fill_(progress)
        self.base.set_progress(progress)

    def attach(self, schedule) -> None:
        self.base.attach(schedule)

    def high(self) -> float:
        """The current upper end of the range."""
        if self.ramp == 0:
            return 1.0
        done = min(1.0, float(self.progress) / self.ramp)
        return self.start + (1.0 - self.start) * done

    def forward(
        self, n: int, device: torch.device, generator: torch.Generator | None = None
    ) -> Tensor:
        return self.high() * self.base(n, device, generator)

    def density(self, t: Tensor) -> Tensor:
        """base density(t / hi) / hi on [0, hi], 0 above: the range now, not the final one."""
        high = self.high()
        inside = t <= high
        scaled = self.base.density((t / high).clamp(0.0, 1.0)) / high
        return torch.where(inside, scaled, torch.zeros_like(scaled))
