"""Which committed tokens a decoding guard chose and which were forced, read from the step
callback without touching the samplers.

Threshold decoding (``masked_steps.step_threshold``, Fast-dLLM) commits every open position whose
proposal has probability above the threshold; entropy-bounded decoding
(``masked_steps.step_entropy_bounded``, EB-sampler) the lowest-entropy positions while their
summed entropy less the largest stays within ``gamma``. Both also commit by force: at least one
token per step (threshold: the most confident proposal; entropy-bounded: the lowest-entropy
position, which any budget admits) and everything left at a block's last step. A guard that only
ever commits one token per step, the block finishing at its last step, runs sequentially however
fast its calls are: the share the guard chose says how much of a row's parallelism is its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from cdlm.samplers.base import StepInfo


class Guard(Protocol):
    def passed(self, logp: Tensor, tokens: Tensor, open_: Tensor) -> Tensor:
        """(B, W) bool: the open positions of a block that the guard alone would commit, given
        the step's log-probabilities logp (B, W, V) and the tokens it committed (B, W)."""


@dataclass(frozen=True)
class ThresholdGuard:
    """``step_threshold``'s guard: the committed token's probability above ``threshold`` (the
    same float64 comparison as the step)."""

    threshold: float

    def passed(self, logp: Tensor, tokens: Tensor, open_: Tensor) -> Tensor:
        conf = logp.gather(-1, tokens[..., None]).squeeze(-1).double()
        return open_ & (conf > math.log(self.threshold))


@dataclass(frozen=True)
class EntropyGuard:
    """``step_entropy_bounded``'s guard: within the ``gamma``-nat budget (the step's float64
    entropies and order), less the lowest-entropy position, which the at-least-one rule
    commits whatever the budget."""

    gamma: float

    def passed(self, logp: Tensor, tokens: Tensor, open_: Tensor) -> Tensor:
        entropy = torch.special.entr(logp.double().exp()).sum(-1).masked_fill(~open_, torch.inf)
        ascending, order = entropy.sort(-1)
        within = (ascending.cumsum(-1) - ascending) <= self.gamma
        within[..., 0] = False
        return open_ & torch.zeros_like(open_).scatter_(-1, order, within)


@dataclass(frozen=True)
class GuardedBlocks:
    """A guarded row: its guard and the length of the blocks it decodes (blocks start at 0)."""

    guard: Guard
    block_length: int


@dataclass
class GuardShare:
    """Tokens committed by the guard and by force, all samples."""

    by_guard: int = 0
    by_force: int = 0

    @property
    def guard_fraction(self) -> float | None:
        total = self.by_guard + self.by_force
        return self.by_guard / total if total else None


class GuardCounter:
    """Step callback that sorts each step's newly committed tokens into ``share``: the positions
    that were [MASK] before the step and are not after, judged by the guard on the logits of the
    window the step decided (the whole canvas, or the block alone for a cached step). A run
    starts with every ``editable`` (L,) position [MASK]; a step with ``i == 0`` starts a batch."""

    def __init__(self, guarded: GuardedBlocks, mask_id: int, editable: Tensor) -> None:
        self.guarded, self.mask_id, self.editable = guarded, mask_id, editable
        self.share = GuardShare()
        self.open: Tensor | None = None

    def __call__(self, info: StepInfo) -> None:
        x = info.x
        was_open = self.editable.expand_as(x) if info.i == 0 else self.open
        self.open = x == self.mask_id
        committed = was_open & ~self.open
        if not committed.any():
            return
        length, size = x.shape[1], self.guarded.block_length
        a = int(committed.any(0).nonzero()[0]) // size * size
        b = min(a + size, length)
        logp = info.prediction.logits
        offset = 0 if logp.shape[1] == length else a
        if logp.shape[1] not in (length, b - a):
            raise ValueError(
                f"a step's logits cover {logp.shape[1]} positions: neither the canvas ({length}) "
                f"nor the block [{a}, {b}) of length {size} that it committed in"
            )
        window = logp[:, a - offset : b - offset]
        passed = self.guarded.guard.passed(window, x[:, a:b], was_open[:, a:b])
        chosen = committed[:, a:b]
        self.share.by_guard += int((chosen & passed).sum())
        self.share.by_force += int((chosen & ~passed).sum())
