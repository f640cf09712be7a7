"""Timestep grids: decreasing times from 1 to 0 (T + 1 points, float64 so steps are exact).

A grid is a function ``grid(steps, schedule, device) -> (steps + 1,) tensor``; ``GRIDS`` maps the
names accepted by ``cdlm-sample grid=...`` to them. Grids other than ``uniform`` are spaced in a
function of the schedule's log-SNR and mapped back to t with ``schedule.t_from_logsnr``, so they
need the schedule; both endpoints are exactly 1 and 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from cdlm.schedules import Schedule


def _check(steps: int) -> None:
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")


def _from_logsnr(logsnr: Tensor, schedule: Schedule) -> Tensor:
    """Maps a decreasing log-SNR grid to t and pins the endpoints (bisection is only ~1e-16)."""
    t = schedule.t_from_logsnr(logsnr)
    t[0], t[-1] = 1.0, 0.0
    return t


def _endpoints(schedule: Schedule | None, name: str, device) -> tuple[Tensor, Tensor]:
    # by capability, not process kind: any schedule with a log-SNR and its inverse will do
    if not (hasattr(schedule, "logsnr") and hasattr(schedule, "t_from_logsnr")):
        found = (
            "this model has none"
            if schedule is None
            else f"this model's schedule is {type(schedule).__name__}"
        )
        raise ValueError(
            f"grid={name!r} needs the process's noise schedule with a log-SNR (a gaussian "
            f"model); {found}; use grid=uniform"
        )
    ends = torch.tensor([1.0, 0.0], dtype=torch.float64, device=device)
    lo, hi = schedule.logsnr(ends)
    return lo, hi


def uniform_grid(
    steps: int, schedule: Schedule | None = None, device: torch.device | str = "cpu"
) -> Tensor:
    """Evenly spaced in t."""
    _check(steps)
    return torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64, device=device)


def logsnr_grid(
    steps: int, schedule: Schedule | None = None, device: torch.device | str = "cpu"
) -> Tensor:
    """Evenly spaced in log-SNR, the natural time of the probability-flow ODE in which
    DPM-Solver is derived (Lu et al. 2022, Sec. 3.3 "time-uniform in lambda")."""
    _check(steps)
    lo, hi = _endpoints(schedule, "logsnr", device)
    logsnr = torch.linspace(0.0, 1.0, steps + 1, dtype=torch.float64, device=device)
    return _from_logsnr(lo + (hi - lo) * logsnr, schedule)


def karras_grid(
    steps: int,
    schedule: Schedule | None = None,
    device: torch.device | str = "cpu",
    rho: float = 7.0,
) -> Tensor:
    """Karras et al. 2022 (eq. 5): the VE noise level sigma/alpha = exp(-logsnr / 2) spaced
    evenly in sigma^(1/rho), which crowds steps at low noise (rho = 7 as in the paper). The
    schedule's own noise floor at t = 0 plays the paper's sigma_min."""
    _check(steps)
    lo, hi = _endpoints(schedule, "karras", device)
    s_max, s_min = (-lo / 2).exp() ** (1 / rho), (-hi / 2).exp() ** (1 / rho)
    u = torch.linspace(0.0, 1.0, steps + 1, dtype=torch.float64, device=device)
    sigma = (s_max + u * (s_min - s_max)) ** rho
    return _from_logsnr(-2 * sigma.log(), schedule)


def warped_grid(
    steps: int,
    schedule: Schedule | None = None,
    device: torch.device | str = "cpu",
    warp: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Evenly spaced in the model's learned CDCD time warping (``warp`` = the quantile of a
    ``Warped`` time sampler): each step covers an equal share of the training loss's rise, so the
    steps crowd where tokens get decided (CDCD, Dieleman et al. 2022, Sec. 4.1)."""
    _check(steps)
    if warp is None:
        raise ValueError(
            "grid='warped' needs a model trained with the CDCD time warping "
            "(time_sampler@process.time_sampler=warped); use grid=uniform"
        )
    t = warp(torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64, device=device))
    t[0], t[-1] = 1.0, 0.0
    return t


GRIDS: dict[str, Callable[..., Tensor]] = {
    "uniform": uniform_grid,
    "logsnr": logsnr_grid,
    "karras": karras_grid,
    "warped": warped_grid,
}


def make_grid(
    name: str,
    steps: int,
    schedule: Schedule | None = None,
    device: torch.device | str = "cpu",
    warp: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """The named grid; ``warp`` is the learned time warping, for ``warped`` only."""
    if name not in GRIDS:
        raise ValueError(f"unknown grid {name!r}; valid: {', '.join(GRIDS)}")
    if name == "warped":
        return warped_grid(steps, schedule, device, warp)
    return GRIDS[name](steps, schedule, device)
