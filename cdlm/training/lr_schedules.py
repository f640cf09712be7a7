"""Learning-rate schedules over the budget of a run: warmup then cosine decay, measured in
optimizer steps (``warmup_cosine``) or in seconds of wall clock (``wallclock_cosine``), chosen in
``conf/lr_scheduler/`` and stepped every optimizer step."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch


def _cosine(progress: float, min_ratio: float) -> float:
    """Cosine decay from 1 at progress 0 to ``min_ratio`` at progress >= 1."""
    progress = min(1.0, progress)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_cosine_factor(progress: float, warmup: float, min_ratio: float) -> float:
    """The LR factor at ``progress`` (a share in [0, 1]) of a schedule that warms up linearly
    over the first ``warmup`` share, then decays by a cosine to ``min_ratio``."""
    if progress < warmup:
        return max(progress, 1e-3) / warmup
    return _cosine((progress - warmup) / (1.0 - warmup), min_ratio)


def warmup_cosine(
    optimizer: torch.optim.Optimizer,
    warmup_steps: float,
    total_steps: int,
    min_ratio: float = 0.1,
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over ``warmup_steps``, then cosine decay to ``min_ratio`` of the peak at
    ``total_steps``. Both are in optimizer steps, so a short budget gets a short schedule;
    ``warmup_steps`` < 1 is a fraction of ``total_steps``."""
    if total_steps is None or total_steps < 1:
        raise ValueError(
            f"warmup_cosine needs a step budget (trainer.max_steps >= 1), got {total_steps}; "
            "for a time budget use lr_scheduler=wallclock_cosine"
        )
    warmup = max(1, round(warmup_steps * total_steps if warmup_steps < 1 else warmup_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return _cosine((step - warmup) / max(1, total_steps - warmup), min_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def parse_duration(budget: str | float) -> float:
    """Seconds from a number or Lightning's ``max_time`` string "DD:HH:MM:SS"."""
    if budget is None:
        raise ValueError("wallclock_cosine needs a time budget: set trainer.max_time")
    if isinstance(budget, int | float):
        return float(budget)
    try:
        days, hours, minutes, seconds = (float(p) for p in str(budget).split(":"))
    except ValueError:
        raise ValueError(f"budget must be seconds or 'DD:HH:MM:SS', got {budget!r}") from None
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


class WallclockLR(torch.optim.lr_scheduler.LambdaLR):
    """A ``LambdaLR`` whose factor is a function of the wall clock spent, which it keeps in its
    ``state_dict``: a resumed run continues the schedule where the checkpoint left it instead
    of restarting its clock (Lightning saves and restores scheduler states)."""

    def __init__(self, optimizer, factor: Callable[[float], float], clock: Callable[[], float]):
        self.clock, self.start, self.offset = clock, clock(), 0.0
        super().__init__(optimizer, lambda step: factor(self.elapsed()))

    def elapsed(self) -> float:
        """Seconds of training so far, over every run this schedule was resumed through."""
        return self.offset + self.clock() - self.start

    def state_dict(self) -> dict:
        # this process's clock readings mean nothing to the next one: only the time spent is kept
        skip = ("clock", "start", "offset")
        state = {k: v for k, v in super().state_dict().items() if k not in skip}
        return state | {"elapsed": self.elapsed()}

    def load_state_dict(self, state_dict: dict) -> None:
        state = dict(state_dict)
        elapsed = state.pop("elapsed", 0.0)
        super().load_state_dict(state)
        self.offset, self.start = elapsed, self.clock()


def wallclock_cosine(
    optimizer: torch.optim.Optimizer,
    budget: str | float,
    warmup: float = 0.1,
    min_ratio: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
) -> WallclockLR:
    """Warmup then cosine decay over a wall-clock ``budget`` (usually ``trainer.max_time``)
    instead of a step count: under a fixed time budget every process, whatever its speed, gets a
    complete schedule that ends when training is stopped. ``warmup`` is a share of the budget.
    The clock starts when the optimizer is configured (the start of fit) and, on resume,
    continues from the time the checkpoint recorded."""
    if not 0.0 <= warmup < 1.0:
        raise ValueError(f"warmup is a share of the budget in [0, 1), got {warmup}")
    seconds = parse_duration(budget)
    if seconds <= 0:
        raise ValueError(f"budget must be > 0 seconds, got {budget!r}")

    def factor(elapsed: float) -> float:
        return warmup_cosine_factor(elapsed / seconds, warmup, min_ratio)

    return WallclockLR(optimizer, factor, clock)
