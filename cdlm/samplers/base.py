"""The sampler contract (k-diffusion style).

A sampler is a ``@torch.no_grad()`` function
``sample(denoiser, x, timesteps, *, process, generator=None, callback=None, **options)`` that walks
the decreasing time grid ``timesteps`` (T+1 points from 1 to 0), calls a pure ``step_*`` function
per interval, counts network evaluations (NFE) and reports every intermediate state through
``callback``. Samplers register the process kinds they accept; an incompatible pair is refused
with the list of samplers that do fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from cdlm.denoiser import Prediction


@dataclass
class StepInfo:
    """What a sampler reports after each step: step index i, interval t -> s, new state x."""

    i: int
    t: float
    s: float
    x: Tensor
    prediction: Prediction


@dataclass
class SampleOutput:
    """x: final state; prediction: the last denoiser output (its logits give the tokens);
    nfe: network evaluations per sequence."""

    x: Tensor
    prediction: Prediction
    nfe: int


Callback = Callable[[StepInfo], None]
SAMPLERS: dict[str, tuple[str, ...]] = {}


def register(name: str, processes: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """Records which process kinds the decorated sampler accepts."""

    def wrap(fn: Callable) -> Callable:
        SAMPLERS[name] = processes
        fn.sampler_name, fn.processes = name, processes
        return fn

    return wrap


def check_compatible(sampler: Callable, process_kind: str) -> None:
    """Raises ValueError naming the samplers that fit ``process_kind`` if ``sampler`` does not."""
    fn = getattr(sampler, "func", sampler)  # unwrap functools.partial from Hydra
    if process_kind not in getattr(fn, "processes", ()):
        fits = sorted(n for n, kinds in SAMPLERS.items() if process_kind in kinds)
        name = getattr(fn, "sampler_name", getattr(fn, "__name__", str(fn)))
        hint = f"use one of: {', '.join(fits)}" if fits else "no registered sampler fits it"
        raise ValueError(f"sampler {name!r} does not fit a {process_kind!r} model; {hint}")


def uniform_grid(steps: int, device: torch.device | str = "cpu") -> Tensor:
    """``steps + 1`` times evenly spaced from 1 down to 0 (float64, so steps are exact)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    return torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64, device=device)
