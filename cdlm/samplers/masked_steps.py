"""The pure step functions of masked diffusion sampling, and what the one masked decoding loop
(``cdlm.samplers.masked``) needs besides its KV caches (``cdlm.samplers.blockwise``): the
reveal probability (``Interval.between``), the blocks and their time grid (``blocks_of``,
``block_grid``) and stop-at-EOS (``ended_at_eos``). The step rules of ``cdlm.samplers.rules``
wrap these functions as objects with their options as fields.

A state is a (B, L) tensor of token ids with [MASK] where nothing is decided yet. Each step here
decides which still-masked ``open_`` positions to commit and to what, and never changes a
committed token (a revising rule, ``cdlm.samplers.remdm``, is written apart). Categorical
draws are float64 and made only at the positions being decided.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from cdlm import rng
from cdlm.samplers.base import categorical_at, sample_categorical


@dataclass(frozen=True)  # shared between the blocks of a run (``interval_memo``)
class Interval:
    """One step of a block: from time t to s, with ``steps_left`` steps (this one included)."""

    t: float
    s: float
    steps_left: int
    p_reveal: float  # MDLM: (keep(s) - keep(t)) / (1 - keep(t))
    keep_t: float  # alpha_t: the schedule's share of clean tokens at t
    keep_s: float

    @classmethod
    def between(
        cls, keep: Callable[[Tensor], Tensor], t: float, s: float, steps_left: int
    ) -> Interval:
        """The step t -> s under the mask schedule's ``keep``, with MDLM's reveal probability
        (Sahoo et al. 2024, eq. 7): a position still masked at t is unmasked by s with
        probability (keep(s) - keep(t)) / (1 - keep(t)), and surely at s <= 0. ``keep_t`` and
        ``keep_s`` are in float64 (ReMDM's exact update); ``p_reveal`` stays as it was
        computed, from float32, so that the samples of the unmasking rules do not move."""
        k_t, k_s = keep(torch.tensor(t)).item(), keep(torch.tensor(s)).item()
        p_reveal = 1.0 if s <= 0 else (k_s - k_t) / (1.0 - k_t)
        keep_t, keep_s = (keep(torch.tensor(v, dtype=torch.float64)).item() for v in (t, s))
        return cls(t=t, s=s, steps_left=steps_left, p_reveal=p_reveal, keep_t=keep_t, keep_s=keep_s)


def _commit(x: Tensor, logp: Tensor, chosen: Tensor, generator, temperature: float) -> Tensor:
    """Fills the ``chosen`` positions (B, L) with draws from ``logp``; the rest stays."""
    x = x.clone()
    x[chosen] = categorical_at(logp, chosen, generator, temperature)
    return x


def step_ancestral(
    x: Tensor, logp: Tensor, open_: Tensor, iv: Interval, generator, temperature: float = 1.0
) -> Tensor:
    """MDLM's reverse step (Sahoo et al. 2024, eq. 7): each open masked position is revealed
    with probability (keep(s) - keep(t)) / (1 - keep(t)), with a token drawn from p_theta."""
    u = rng.rand(x.shape, generator, device=x.device, dtype=torch.float64)
    return _commit(x, logp, open_ & (u < iv.p_reveal), generator, temperature)


def _confidence(
    x: Tensor, logp: Tensor, open_: Tensor, generator, temperature: float
) -> tuple[Tensor, Tensor]:
    """Proposed tokens at every position and their probability (-inf where not open)."""
    proposal = sample_categorical(logp, generator, temperature)
    conf = logp.gather(-1, proposal[..., None]).squeeze(-1).double()
    return proposal, conf.masked_fill(~open_, -torch.inf)


def step_topk(
    x: Tensor, logp: Tensor, open_: Tensor, iv: Interval, generator, temperature: float = 0.0
) -> Tensor:
    """Low-confidence remasking (LLaDA, Nie et al. 2025, Alg. 5): propose a token at every open
    position and keep the ceil(open / steps_left) most confident ones; the rest stay masked."""
    proposal, conf = _confidence(x, logp, open_, generator, temperature)
    k = torch.ceil(open_.sum(-1) / iv.steps_left).long()
    rank = conf.argsort(-1, descending=True).argsort(-1)
    chosen = open_ & (rank < k[:, None])
    return torch.where(chosen, proposal, x)


def check_threshold(threshold: float) -> None:
    """A clear error for a confidence threshold outside (0, 1] (log 0 has no value)."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(
            f"threshold must be in (0, 1] (the probability a proposal must exceed), got {threshold}"
        )


def check_gamma(gamma: float) -> None:
    """A clear error for a negative (or NaN) entropy budget."""
    if not gamma >= 0.0:
        raise ValueError(f"gamma must be >= 0 (nats of summed entropy per step), got {gamma}")


def step_threshold(
    x: Tensor,
    logp: Tensor,
    open_: Tensor,
    iv: Interval,
    generator,
    temperature: float = 0.0,
    threshold: float = 0.9,
) -> Tensor:
    """Confidence-threshold parallel decoding (Fast-dLLM, Wu et al. 2025): commit every open
    position whose proposal has probability above ``threshold``, and at least the most confident
    one per row; the last step of a block commits everything left."""
    check_threshold(threshold)
    proposal, conf = _confidence(x, logp, open_, generator, temperature)
    best = torch.zeros_like(open_).scatter_(-1, conf.argmax(-1, keepdim=True), True)
    chosen = open_ & ((conf > math.log(threshold)) | best | (iv.steps_left == 1))
    return torch.where(chosen, proposal, x)


def step_entropy_bounded(
    x: Tensor,
    logp: Tensor,
    open_: Tensor,
    iv: Interval,
    generator,
    temperature: float = 0.0,
    gamma: float = 1.0,
) -> Tensor:
    """Entropy-bounded unmasking (EB-sampler, Ben-Hamu et al. 2025): order the open positions by
    the entropy of their prediction, lowest first, and commit the longest prefix whose summed
    entropy minus its largest stays within ``gamma`` nats. Drawing several tokens at once from
    their marginals errs by at most their mutual dependence, which that sum bounds, so the step
    commits many tokens where the model is sure and one where it is not (always at least one;
    the last step of a block commits everything left). Entropies in float64."""
    check_gamma(gamma)
    proposal = sample_categorical(logp, generator, temperature)
    entropy = torch.special.entr(logp.double().exp()).sum(-1).masked_fill(~open_, torch.inf)
    ascending, order = entropy.sort(-1)
    within = (ascending.cumsum(-1) - ascending) <= gamma  # the first open one: 0 <= gamma
    chosen = open_ & (torch.zeros_like(open_).scatter_(-1, order, within) | (iv.steps_left == 1))
    return torch.where(chosen, proposal, x)


def check_k(k: int) -> None:
    """A clear error for a per-step commit count that is not a positive integer."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1 (tokens committed per step), got {k!r}")


def step_exact_k(
    x: Tensor, logp: Tensor, open_: Tensor, iv: Interval, generator, k: int, temperature: float
) -> Tensor:
    """Commits exactly k open positions per row (all of them once fewer are left), chosen
    uniformly at random, each drawn from its own marginal given the state. k-subsets drawn
    uniformly step after step are the chunks of one uniformly random order, so at k = 1 with an
    exact denoiser this is ancestral sampling in a random order: exact in distribution. Refuses
    a grid too short to finish: committing the rest at once would break both promises."""
    check_k(k)
    left = open_.sum(-1)
    if bool((left > k * iv.steps_left).any()):
        raise ValueError(
            f"exact_k commits k={k} tokens per step: {int(left.max())} masked positions do not "
            f"fit in {iv.steps_left} steps; raise steps (or steps_per_block) or k"
        )
    u = rng.rand(x.shape, generator, device=x.device, dtype=torch.float64)
    rank = u.masked_fill(~open_, 2.0).argsort(-1).argsort(-1)
    return _commit(x, logp, open_ & (rank < k), generator, temperature)


def network_length(denoiser, length: int) -> int:
    """Positions a call over a ``length`` canvas runs in the network: one more for a shifted
    masked model's BOS (``MaskedDenoiser.network_length``), else ``length``."""
    return denoiser.network_length(length)


def blocks_of(length: int, block_length: int | None) -> list[tuple[int, int]]:
    """The [a, b) spans of semi-autoregressive blocks over a canvas of ``length`` (one block
    without ``block_length``)."""
    if block_length is None or block_length >= length:
        return [(0, length)]
    if block_length < 1:
        raise ValueError(f"block_length must be >= 1, got {block_length}")
    return [(a, min(a + block_length, length)) for a in range(0, length, block_length)]


def block_grid(timesteps: Tensor, n_blocks: int, steps_per_block: int | None = None) -> Tensor:
    """The (steps + 1,) float64 time grid that each of ``n_blocks`` blocks walks: the span of
    the whole grid (t < 1 when editing) in ``steps_per_block`` even steps, by default the grid's
    steps shared out (at least one per block)."""
    per_block = steps_per_block or max(1, (len(timesteps) - 1) // n_blocks)
    return torch.linspace(float(timesteps[0]), 0.0, per_block + 1, dtype=torch.float64)


def ended_at_eos(x: Tensor, upto: int, eos: int | None, mask_id: int) -> Tensor | None:
    """Stop-at-EOS after a block ending at ``upto``: ``x`` with every [MASK] turned EOS once
    every row has an EOS in [0, upto) with no mask before it; None while decoding goes on. Only
    if nothing after ``upto`` is decided: a fixed region there must still get its blanks
    sampled, not filled with EOS. x: (B, L)."""
    if eos is None or upto >= x.shape[1] or not bool((x[:, upto:] == mask_id).all()):
        return None
    head = x[:, :upto]
    has_eos = head == eos
    first = torch.where(has_eos.any(-1), has_eos.float().argmax(-1), upto)
    before = torch.arange(upto, device=x.device)[None] < first[:, None]
    if not (has_eos.any(-1).all() and not ((head == mask_id) & before).any()):
        return None
    return x.masked_fill(x == mask_id, eos)


def ended_rows(x: Tensor, upto: int, eos: int | None, mask_id: int, lengths: list[int]) -> Tensor:
    """``ended_at_eos`` row by row, for rows of their own canvas ``lengths`` (right padding
    after): a row whose own canvas after ``upto`` is all [MASK] and whose [0, upto) has an EOS
    with no mask before it gets its masks turned EOS, as it would alone; the others go on."""
    if eos is None:
        return x
    x = x.clone()
    for b, n in enumerate(lengths):
        ended = ended_at_eos(x[b : b + 1, :n], upto, eos, mask_id)
        if ended is not None:
            x[b, :n] = ended[0]
    return x


def row_grids(
    timesteps: Tensor,
    length: int,
    block_length: int | None,
    steps_per_block: int | None,
    generator: rng.Draws,
    whole: bool = False,
) -> Tensor | list[Tensor]:
    """The ``block_grid`` of a canvas of ``length`` in blocks of ``block_length`` (``whole``:
    one block walks ``timesteps`` itself); with per-row generators (``rng.Rows``) of shorter
    rows, each row's own grid, from its own block count, as it would walk alone."""

    def grid(n: int) -> Tensor:
        blocks = len(blocks_of(n, block_length))
        if whole and blocks == 1:
            return timesteps
        return block_grid(timesteps, blocks, None if whole else steps_per_block)

    if not isinstance(generator, rng.Rows) or min(generator.lengths) == length:
        return grid(length)
    return [grid(n) for n in generator.lengths]


def steps_of(grid: Tensor | list[Tensor]) -> int:
    """Steps per block: the grid's, or the most of any row's."""
    return len(grid) - 1 if isinstance(grid, Tensor) else max(len(g) for g in grid) - 1


def times_at(grid: Tensor | list[Tensor], j: int) -> tuple[float, float]:
    """(t, s) of step j: the grid's, or the latest of the rows still walking theirs (what a
    call and its callback report; the token networks do not read it)."""
    if isinstance(grid, Tensor):
        return float(grid[j]), float(grid[j + 1])
    return max((float(g[j]), float(g[j + 1])) for g in grid if j < len(g) - 1)


def interval_memo(keep: Callable) -> Callable[[float, float, int], Interval]:
    """``Interval.between`` under ``keep`` for one decoding run, each (t, s, steps_left) worked
    out once: every block walks the same grid, and each interval costs four schedule calls."""
    return functools.cache(functools.partial(Interval.between, keep))


def intervals(
    grid: Tensor | list[Tensor],
    j: int,
    rows: Tensor | slice,
    between: Callable[[float, float, int], Interval],
) -> Iterator[tuple[Tensor | slice, Interval]]:
    """The ``rows`` that step j decides with each ``Interval`` (from ``between``, e.g.
    ``interval_memo``): all of them with the grid's, or per-row grids grouped by their values
    (rows whose grid has ended take no step)."""
    if isinstance(grid, Tensor):
        yield rows, between(float(grid[j]), float(grid[j + 1]), len(grid) - 1 - j)
        return
    groups: dict[tuple[float, ...], list[int]] = {}
    for b, g in enumerate(grid):
        groups.setdefault(tuple(g.tolist()), []).append(b)
    for values, members in groups.items():
        if j >= len(values) - 1:
            continue
        chosen = torch.zeros_like(rows)
        chosen[members] = True
        if (chosen := chosen & rows).any():
            steps_left = len(values) - 1 - j
            yield chosen, between(values[j], values[j + 1], steps_left)
