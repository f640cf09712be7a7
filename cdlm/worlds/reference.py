"""A world's next-token reference q(b | a) over token ids: the yardstick of the transition-level
KL and TV rates (``cdlm.evaluation.world_score.transition_rates``).

The rates read q only at the pairs a sample set shows and whether each of its rows is a
distribution, so a chain keeps its own sparse transition (top-K successors plus a teleport) and
answers those queries from it: the dense (V, V) table of the 8,192-token chain is 512 MB. Small
worlds whose states are not their tokens (the agreement world) keep the dense pair table.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from cdlm.worlds.transition import Transition


class TransitionReference(Protocol):
    """q(b | a) over ``vocab_size`` token ids."""

    vocab_size: int

    def prob(self, prev: Tensor, nxt: Tensor) -> Tensor:
        """q(nxt | prev) elementwise, float64 (0 where the world never makes the pair)."""
        ...

    def visited(self, prev: Tensor) -> Tensor:
        """bool, elementwise: whether q(. | prev) is a distribution (the world emits ``prev``);
        a row it never visits is all zeros."""
        ...


class DenseReference:
    """q from a (V, V) table (rows summing to 1, or all 0 where never visited)."""

    def __init__(self, table: Tensor) -> None:
        self.table = table.cpu().double()
        self.vocab_size = table.shape[0]
        self._visited = self.table.sum(-1) > 0

    def prob(self, prev: Tensor, nxt: Tensor) -> Tensor:
        return self.table[prev, nxt]

    def visited(self, prev: Tensor) -> Tensor:
        return self._visited[prev]


class ChainReference:
    """q of a first-order chain over token ids ``offset`` .. ``offset + step.size - 1``: the
    chain's own transition, dense or sparse; rows and columns outside its ids are 0."""

    def __init__(self, step: Transition, offset: int, vocab_size: int) -> None:
        self.step, self.offset, self.vocab_size = step, offset, vocab_size

    def state_of(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Each id's state and whether it has one."""
        state = ids.long() - self.offset
        return state, (state >= 0) & (state < self.step.size)

    def prob(self, prev: Tensor, nxt: Tensor) -> Tensor:
        (a, a_in), (b, b_in) = self.state_of(prev), self.state_of(nxt)
        inside = a_in & b_in
        out = torch.zeros(prev.shape, dtype=torch.float64)
        out[inside] = self.step.prob_of(a[inside], b[inside])
        return out

    def visited(self, prev: Tensor) -> Tensor:
        return self.state_of(prev)[1]


def as_reference(reference: TransitionReference | Tensor) -> TransitionReference:
    """A (V, V) tensor as a ``DenseReference``; a reference as itself."""
    return DenseReference(reference) if isinstance(reference, Tensor) else reference
