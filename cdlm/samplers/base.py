"""The sampler contract (k-diffusion style).

A sampler is a ``@torch.no_grad()`` function
``sample(denoiser, x, timesteps, *, process, generator=None, callback=None, **options)`` that walks
the decreasing time grid ``timesteps`` (T+1 points from 1 to 0), calls a pure ``step_*`` function
per interval, counts network evaluations (NFE) and reports every intermediate state through
``callback``. Samplers register the process kinds they accept; an incompatible pair is refused
with the list of samplers that do fit.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from cdlm import rng
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
    """x: final state; tokens: (B, L) the sampled token ids; prediction: the last denoiser output
    (None if the network was never called); nfe: network evaluations per sequence; positions:
    sequence positions the network processed per sequence (a KV-cached step processes one);
    stats: figures only one sampler has (speculative decoding's accepted lengths)."""

    x: Tensor
    tokens: Tensor
    prediction: Prediction | None
    nfe: int
    positions: int | None = None  # positions the network processed per sequence; None: nfe * L
    stats: dict[str, float] = field(default_factory=dict)  # a sampler's own figures


Callback = Callable[[StepInfo], None]
SAMPLERS: dict[str, tuple[str, ...]] = {}


def register(name: str, processes: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """Records which process kinds the decorated sampler accepts (or step rule: a rule of the
    one masked sampler is registered under the name of the sampler it makes)."""

    def wrap(fn: Callable) -> Callable:
        SAMPLERS[name] = processes
        fn.sampler_name, fn.processes = name, processes
        return fn

    return wrap


def named_by_rule(fn: Callable) -> Callable:
    """Marks a sampler that is named, and fits the process kinds, of its ``rule`` option (a
    registered step rule object): ``sampler=threshold`` is the masked loop with the threshold
    rule, and reports, records and refusals name it so."""
    fn.named_by_rule = True
    return fn


def unwrapped(sampler: Callable) -> Callable:
    """The sampler function behind a Hydra partial (``_partial_: true``) or the function itself:
    the one place that looks inside a partial."""
    return getattr(sampler, "func", sampler)


def registered(sampler: Callable) -> Callable | type:
    """What ``register`` stamped for ``sampler``: its function, or the class of its step rule
    (given, else the function's default) for a sampler ``named_by_rule``."""
    fn = unwrapped(sampler)
    if not getattr(fn, "named_by_rule", False):
        return fn
    rule = getattr(sampler, "keywords", {}).get("rule")
    return type(rule if rule is not None else inspect.signature(fn).parameters["rule"].default)


def sampler_name(sampler: Callable) -> str:
    """The registered name of ``sampler`` (a function or a partial of one)."""
    fn = registered(sampler)
    return getattr(fn, "sampler_name", getattr(fn, "__name__", str(fn)))


def check_compatible(sampler: Callable, process_kind: str) -> None:
    """Raises ValueError naming the samplers that fit ``process_kind`` if ``sampler`` does not."""
    if process_kind not in getattr(registered(sampler), "processes", ()):
        fits = sorted(n for n, kinds in SAMPLERS.items() if process_kind in kinds)
        name = sampler_name(sampler)
        hint = f"use one of: {', '.join(fits)}" if fits else "no registered sampler fits it"
        raise ValueError(f"sampler {name!r} does not fit a {process_kind!r} model; {hint}")


def sample_categorical(
    logp: Tensor, generator: rng.Draws = None, temperature: float = 1.0
) -> Tensor:
    """Draws one id per row of log-probabilities (..., V) by Gumbel-max in float64.

    Float64 matters: in fp32 the Gumbel noise of rare tokens underflows, which truncates the tail
    and flatters generative perplexity (Zheng et al. 2024, "Masked diffusion models are secretly
    time-agnostic masked models and exploit inaccurate categorical sampling"). ``temperature`` 0
    is argmax.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logp.argmax(-1)
    canvas = logp.dim() > 2  # (B, V) is one draw per row, not per canvas position
    u = rng.rand(logp.shape, generator, canvas, dtype=torch.float64, device=logp.device)
    gumbel = -torch.log(-torch.log(u.clamp_min(1e-300)))
    return (logp.double() / temperature + gumbel).argmax(-1)


def categorical_at(
    logp: Tensor, chosen: Tensor, generator: rng.Draws, temperature: float = 1.0
) -> Tensor:
    """``sample_categorical(logp[chosen])``: draws (N,) at the ``chosen`` positions (B, L) of
    ``logp`` (B, L, V) only (float64 where it is decided, not over the whole canvas); with
    ``rng.Rows`` each row draws its own positions from its own generator."""
    if not isinstance(generator, rng.Rows):
        return sample_categorical(logp[chosen], generator, temperature)
    draws = [
        sample_categorical(logp[b][chosen[b]], g, temperature)
        for b, g in enumerate(generator.generators)
    ]
    return torch.cat(draws)
