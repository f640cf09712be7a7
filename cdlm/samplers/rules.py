"""Step rules of masked decoding: what one step of the one loop (``cdlm.samplers.masked``)
commits, remasks or leaves, as objects chosen by ``_target_`` (``sampler.rule``) with their
options as fields. A new rule is one class here (or in its own module), registered under the
sampler name it makes (``register``), one config in ``conf/sampler/`` and one row in
``tests/test_rules.py``.

A rule sees a ``Window`` of the canvas (the block being decoded, or the whole canvas) and
returns its new tokens. Rules that only unmask leave every committed token as it is; a rule
with ``revises = True`` (ReMDM) may remask tokens this run committed, so the loop runs its every
step instead of stopping once nothing is masked. Categorical draws are float64, made only at
the positions being decided (``cdlm.samplers.base.sample_categorical``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from cdlm.samplers.base import register
from cdlm.samplers.masked_steps import (
    Interval,
    check_gamma,
    check_k,
    check_threshold,
    step_ancestral,
    step_entropy_bounded,
    step_exact_k,
    step_threshold,
    step_topk,
)


@dataclass
class Window:
    """What a rule decides over. x: (B, W) tokens in view; logp: (B, W, V) the prediction's
    log-probabilities there; free: (B, W) the positions this run decides (masked at its start
    and in the current block; a prompt is never free); mask_id: the [MASK] id; memo: (B, W)
    float64 per-position memory of a rule that keeps one (``Rule.memo``), else None. Updating
    ``memo`` in place is how a rule remembers across steps: the loop owns it."""

    x: Tensor
    logp: Tensor
    free: Tensor
    mask_id: int
    memo: Tensor | None = None

    @property
    def open_(self) -> Tensor:
        """Free positions still [MASK]."""
        return self.free & (self.x == self.mask_id)

    @property
    def done(self) -> Tensor:
        """Free positions this run has committed (a revising rule may remask them)."""
        return self.free & (self.x != self.mask_id)


@dataclass(frozen=True)
class Rule(ABC):
    """A step rule: ``step`` maps a window and the step's interval to the window's new tokens.
    ``revises``: the rule may remask committed tokens, so the loop runs all its steps.
    ``reuses``: a step that changed nothing lets the next reuse the prediction (exact for a
    time-free denoiser; whole-canvas decoding only)."""

    revises: ClassVar[bool] = False
    reuses: ClassVar[bool] = False

    def memo(self, x: Tensor) -> Tensor | None:
        """The per-position memory (B, L) this rule keeps across steps; None: it keeps none."""
        return None

    @abstractmethod
    def step(self, w: Window, iv: Interval, generator: torch.Generator | None) -> Tensor:
        """The window's tokens (B, W) after the step t -> s."""


@register("ancestral", processes=("masked", "block"))
@dataclass(frozen=True)
class Ancestral(Rule):
    """MDLM ancestral sampling (Sahoo et al. 2024, eq. 7; ``step_ancestral``): each masked
    position is revealed with the schedule's reveal probability, its token drawn from the
    prediction at ``temperature``."""

    temperature: float = 1.0

    def step(self, w: Window, iv: Interval, generator: torch.Generator | None) -> Tensor:
        return step_ancestral(w.x, w.logp, w.open_, iv, generator, self.temperature)


@register("cached_ancestral", processes=("masked",))
@dataclass(frozen=True)
class CachedAncestral(Ancestral):
    """MDLM's cached ancestral sampler (Sahoo et al. 2024, Sec. 3.4): ancestral sampling that
    skips the network while no token has changed, since a time-free denoiser would repeat its
    prediction (the same samples, fewer NFE). Whole-canvas decoding: it has no KV cache."""

    reuses: ClassVar[bool] = True


@register("confidence", processes=("masked", "block"))
@dataclass(frozen=True)
class Confidence(Rule):
    """Low-confidence remasking (LLaDA, Nie et al. 2025, Alg. 5; ``step_topk``): each step
    commits the ceil(open / steps left) most confident proposals."""

    temperature: float = 0.0

    def step(self, w: Window, iv: Interval, generator: torch.Generator | None) -> Tensor:
        return step_topk(w.x, w.logp, w.open_, iv, generator, self.temperature)


@register("threshold", processes=("masked", "block"))
@dataclass(frozen=True)
class Threshold(Rule):
    """Confidence-threshold parallel decoding (Fast-dLLM, Wu et al. 2025; ``step_threshold``):
    each step commits every proposal whose probability exceeds ``threshold``, and at least the
    most confident one."""

    temperature: float = 0.0
    threshold: float = 0.9

    def __post_init__(self) -> None:
        check_threshold(self.threshold)

    def step(self, w: Window, iv: Interval, generator: torch.Generator | None) -> Tensor:
        return step_threshold(w.x, w.logp, w.open_, iv, generator, self.temperature, self.threshold)


@register("entropy_bounded", processes=("masked", "block"))
@dataclass(frozen=True)
class EntropyBounded(Rule):
    """Entropy-bounded unmasking (EB-sampler, Ben-Hamu et al. 2025; ``step_entropy_bounded``):
    each step commits the lowest-entropy proposals while their summed entropy, less the largest,
    stays within ``gamma`` nats. That sum bounds the step's total correlation (the joint's
    entropy is at least the largest marginal's), so with an exact denoiser at temperature 1,
    KL(truth || samples) <= gamma per step that commits several, the last step of a block
    aside (docs/samplers.md; tests/test_exact_k.py checks it exactly)."""

    temperature: float = 0.0
    gamma: float = 1.0

    def __post_init__(self) -> None:
        check_gamma(self.gamma)

    def step(self, w: Window, iv: Interval, generator: torch.Generator | None) -> Tensor:
        return step_entropy_bounded(
            w.x, w.logp, w.open_, iv, generator, self.temperature, self.gamma
        )


@register("exact_k", processes=("masked", "block"))
@dataclass(frozen=True)
class ExactK(Rule):
    """Exactly ``k`` tokens per step, at still-masked positions of the window chosen uniformly
    at random, each drawn from its marginal given the state (``step_exact_k``). At k = 1 with an
    exact denoiser it samples the joint exactly (ancestral sampling in a random order); k > 1
    errs by the dependence among the k tokens it draws apart. A block of n masked positions
    needs ceil(n / k) steps; fewer is refused."""

    k: int = 1
    temperature: float = 1.0

    def __post_init__(self) -> None:
        check_k(self.k)

    def step(self, w: Window, iv: Interval, generator: torch.Generator | None) -> Tensor:
        return step_exact_k(w.x, w.logp, w.open_, iv, generator, self.k, self.temperature)


def check_rule(rule: object) -> None:
    """A clear error for a ``rule`` that is not a ``Rule`` (e.g. a name or a step function)."""
    if not isinstance(rule, Rule):
        raise TypeError(
            f"rule must be a step rule object (a cdlm.samplers.rules.Rule, e.g. "
            f"{{_target_: cdlm.samplers.rules.Threshold}}), got {rule!r}"
        )
