"""A world conditioned on fixed text: the exact distribution of the free positions given it.

A hidden chain conditioned on the tokens of some positions is again a Markov chain, now
time-inhomogeneous. With the backward message h_i(s) = [s may emit position i's evidence] *
p(the fixed tokens after i | s_i = s) (Rabiner 1989), the conditional chain starts from
initial(s) h_0(s) and steps by K_i(s' | s) = P_i(s, s') h_i(s') / sum_s'' P_i(s, s'') h_i(s'').
So the exact conditional p(free | fixed) of a prompt's continuation or an infill's span is
sampled exactly, its likelihood and entropy are exact, and its expected pair table is the
reference of the conditional transition rates (``cdlm.evaluation.world_conditional``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from cdlm.worlds.base import ImpossibleObservation, World
from cdlm.worlds.transition import _entropy

CHUNK = 256  # states whose dense successor rows are held at once


@dataclass(frozen=True)
class Figures:
    """pairs: (V, V) sum over free positions i >= 1 of P(x_{i-1} = a, x_i = b | fixed);
    entropy: H(free | fixed) in nats."""

    pairs: Tensor
    entropy: float


@dataclass(frozen=True)
class Conditional:
    """The world's exact conditional given the tokens ``ids`` at the positions ``free`` marks
    False (build one with ``condition``).

    Fields:
        world: the world conditioned.
        ids: (L,) the canvas; only its fixed positions are read.
        free: (L,) bool, the positions the conditional ranges over.
        reach: (L, S) float64 h_i(s), each row scaled (only ratios within a row matter).
        log_evidence: log p(the fixed tokens) in nats.
    """

    world: World
    ids: Tensor
    free: Tensor
    reach: Tensor
    log_evidence: float

    @property
    def length(self) -> int:
        return self.ids.numel()

    def kernel(self, i: int, prev: Tensor) -> Tensor:
        """(N, S) K_i(. | prev): the conditional successor distributions of states ``prev``
        (N,) into position i >= 1."""
        rows = self.world.step(i).rows(prev) * self.reach[i]
        return rows / rows.sum(-1, keepdim=True).clamp_min(1e-300)

    def start(self) -> Tensor:
        """(S,) the conditional distribution of the first state."""
        first = self.world.initial * self.reach[0]
        return first / first.sum()

    def marginals(self) -> Tensor:
        """(L, S) each position's conditional state marginal (the posterior given the fixed
        text), by one forward sweep of messages."""
        out = [self.start()]
        for i in range(1, self.length):
            step, h = self.world.step(i), self.reach[i]
            norm = step.pull(h[None])[0]  # each state's row total before renormalising
            out.append(h * step.push((out[-1] / norm.clamp_min(1e-300))[None])[0])
        return torch.stack(out)

    def token_marginals(self) -> Tensor:
        """(L, V) float64 each position's conditional token marginal p(x_i | fixed)."""
        out = torch.zeros(self.length, self.world.vocab_size, dtype=torch.float64)
        return out.index_add_(1, self.world.emit, self.marginals())

    def collision(self) -> float:
        """sum_x p(x | fixed)^2: the chance that two independent exact draws agree at every free
        position (what an exact sampler's span exact-match averages). A forward sweep with
        squared start and kernel; over state paths, which for a unifilar world are the token
        sequences one to one. Rescaled each step, so a long span underflows only at the end."""
        a, log_c = self.start() ** 2, 0.0
        for i in range(1, self.length):
            nxt = torch.zeros_like(a)
            for states in torch.nonzero(a > 0)[:, 0].split(CHUNK):
                nxt += a[states] @ self.kernel(i, states) ** 2
            total = float(nxt.sum())
            a, log_c = nxt / total, log_c + math.log(total)
        return math.exp(log_c + math.log(float(a.sum())))

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """(n, L) exact draws of the whole canvas (its fixed positions as given), float64
        categorical draws, CPU."""
        state = torch.multinomial(self.start(), n, replacement=True, generator=generator)
        states = [state]
        for i in range(1, self.length):
            state = torch.multinomial(self.kernel(i, state), 1, generator=generator)[:, 0]
            states.append(state)
        return self.world.emit[torch.stack(states, 1)]

    @torch.no_grad()
    def log_prob(self, tokens: Tensor) -> Tensor:
        """(N,) log p(free tokens | fixed) in nats, float64 (-inf: the conditional rules the
        sample out). ``tokens`` (N, L) must hold the fixed tokens where they are fixed."""
        if tokens.shape[-1] != self.length:
            raise ValueError(
                f"samples of {tokens.shape[-1]} positions on a canvas of {self.length}"
            )
        fixed = ~self.free
        if (tokens.cpu()[:, fixed] != self.ids[fixed]).any():
            raise ValueError("a sample changed a fixed position of the canvas")
        return self.world.log_prob(tokens.cpu()) - self.log_evidence

    @cached_property
    def figures(self) -> Figures:
        """The conditional's pair table and entropy, in one sweep (computed once). Rows are made
        dense ``CHUNK`` states at a time, over the states the conditional can visit."""
        world, v = self.world, self.world.vocab_size
        marg = self.marginals()
        pairs = torch.zeros(v, v, dtype=torch.float64)
        entropy = float(_entropy(self.start()))
        for i in range(1, self.length):
            visited = torch.nonzero(marg[i - 1] > 0)[:, 0]
            for states in visited.split(CHUNK):
                k = self.kernel(i, states)
                weight = marg[i - 1, states]
                entropy += float(weight @ _entropy(k))
                if self.free[i]:
                    joint = weight[:, None] * k
                    by_prev = torch.zeros(v, k.shape[1], dtype=torch.float64)
                    by_prev.index_add_(0, world.emit[states], joint)
                    pairs.index_add_(1, world.emit, by_prev)
        return Figures(pairs, entropy)

    def entropy(self) -> float:
        """H(free | fixed) in nats (exact for a unifilar world, as ``World.entropy``)."""
        return self.figures.entropy

    def transition_reference(self) -> Tensor:
        """(V, V) q(b | a): the pair table into free positions normalised per row (rows never
        visited: 0), the conditional counterpart of ``World.transition_reference``."""
        pairs = self.figures.pairs
        return pairs / pairs.sum(-1, keepdim=True).clamp_min(1e-300)


def condition(world: World, ids: Tensor, free: Tensor) -> Conditional:
    """The exact conditional of ``world`` on a canvas of ``ids`` (L,) whose positions ``free``
    (L,) bool are to be generated; the others hold their ids. ``ImpossibleObservation`` when
    the world cannot make the fixed text."""
    ids, free = ids.detach().cpu().long(), free.detach().cpu().bool()
    if ids.ndim != 1 or free.shape != ids.shape:
        raise ValueError(f"condition needs ids and free of one shape (L,), got {ids.shape}")
    allowed = (free[:, None] | (world.emit[None, :] == ids[:, None])).double()
    for i in torch.nonzero(allowed.sum(-1) == 0)[:, 0].tolist():
        raise ImpossibleObservation(
            f"world {world.name}: the fixed token {int(ids[i])} at position {i} is one it never "
            "makes"
        )
    length = ids.numel()
    reach = torch.empty(length, allowed.shape[1], dtype=torch.float64)
    reach[-1] = allowed[-1]
    log_scale = 0.0
    for i in range(length - 2, -1, -1):
        h = allowed[i] * world.step(i + 1).pull(reach[i + 1][None])[0]
        top = float(h.max())
        if top == 0.0:
            raise ImpossibleObservation(
                f"world {world.name}: the fixed text is impossible (nothing at position {i} "
                "leads to the fixed tokens after it)"
            )
        reach[i], log_scale = h / top, log_scale + math.log(top)
    total = float(world.initial @ reach[0])
    if total == 0.0:
        raise ImpossibleObservation(f"world {world.name}: the fixed text cannot start a sequence")
    return Conditional(world, ids, free, reach, math.log(total) + log_scale)
