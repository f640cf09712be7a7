"""The one masked decoding loop, and the two samplers over it: ``sample_masked`` (masked
diffusion, and block diffusion at its process's blocks) and ``sample_block`` (block diffusion
with its exact KV cache by default).

The loop walks semi-autoregressive blocks left to right (LLaDA Sec. 2.4; one block without
``block_length``), each over the whole span of time, and asks a step rule
(``cdlm.samplers.rules``: ancestral, confidence, threshold, entropy-bounded; ReMDM in
``cdlm.samplers.remdm``) what each step commits. A block ends once nothing in it is masked,
unless the rule revises (then it runs all its steps). Predictions come from the whole canvas
(``Whole``) or from the block's window through the KV caches of ``cdlm.samplers.blockwise``
(``Windowed``); both count NFE and the positions the network ran.

Options of both samplers:

- ``rule``: the step rule object (``sampler.rule`` in the configs, chosen by ``_target_``).
- ``stop_at_eos``: with blocks, stop early once every row has finished at the process's EOS
  (later masks become EOS); False fills the whole canvas (EOS then separates paragraphs).
- ``cache``: Fast-dLLM's approximate KV caches on a masked model (Wu et al. 2025) or block
  diffusion's exact one, ``PrefixCache()`` or ``DualCache()``; None runs without one.
- ``steps_per_block``: with a cache or on a block model, the steps each block walks (default:
  the grid's steps shared out).

And of ``sample_masked`` on a masked model only: ``block_length`` and ``repeat_penalty`` (nats
taken off each decided neighbour's token, ``penalise_repeats``). ``sample_masked`` is named by
its rule (``sampler=threshold`` is it with ``rules.Threshold``), ``sample_block`` is ``block``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cdlm import rng
from cdlm.denoiser import Denoiser, Prediction
from cdlm.samplers import blockwise
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, named_by_rule, register
from cdlm.samplers.blockwise import BlockCache, Calls, DualCache, PrefixCache, check_cache
from cdlm.samplers.masked_steps import (
    blocks_of,
    ended_at_eos,
    ended_rows,
    interval_memo,
    intervals,
    row_grids,
    steps_of,
    times_at,
)
from cdlm.samplers.rules import Ancestral, Rule, Window, check_rule

ANCESTRAL = Ancestral()  # the samplers' default rule (frozen, so one object serves every call)
EXACT_PREFIX = PrefixCache()  # block diffusion's default: its exact KV cache of finished blocks


class Whole:
    """Predictions over the whole canvas, one network call per step (none while the canvas is
    unchanged, when the rule ``reuses`` predictions)."""

    def __init__(self, denoiser: Denoiser, length: int, reuse: bool) -> None:
        self.denoiser, self.reuse = denoiser, reuse
        self.net_len = denoiser.network_length(length)
        self.nfe, self.pred, self.seen = 0, None, None

    @property
    def positions(self) -> int:
        return self.nfe * self.net_len

    def __call__(self, x: Tensor, a: int, b: int, j: int, t: float) -> tuple[slice, Prediction]:
        """The canvas span the prediction covers (all of it) and the prediction."""
        if not (self.reuse and self.seen is not None and torch.equal(x, self.seen)):
            tt = torch.full((x.shape[0],), t, device=x.device)
            self.pred, self.seen, self.nfe = self.denoiser(x, tt), x, self.nfe + 1
        return slice(None), self.pred


class Windowed:
    """Predictions for the block [a, b) alone: block diffusion's against its exact past
    (``exact``), else a masked model's through the approximate ``cache``."""

    def __init__(self, calls: Calls, cache: BlockCache | None, exact: bool) -> None:
        self.calls, self.cache, self.exact = calls, cache, exact

    @property
    def nfe(self) -> int:
        return self.calls.nfe

    @property
    def positions(self) -> int:
        return self.calls.positions

    def __call__(self, x: Tensor, a: int, b: int, j: int, t: float) -> tuple[slice, Prediction]:
        """The block's span and its prediction at its step j."""
        if self.exact:
            logp = self.calls.block(x, a, b, t)
        else:
            logp = self.cache.block_logits(self.calls, x, a, b, j, t)
        return slice(a, b), Prediction(logits=logp)


def penalise_repeats(x: Tensor, logp: Tensor, mask_id: int, penalty: float) -> Tensor:
    """Lowers by ``penalty`` nats the log-probability of each position's decided left and right
    neighbour tokens, then renormalises: a guard against the runs of one token (", , ,", "the
    the") that parallel decoding produces when neighbours are filled from marginals that each
    favour the same frequent token. x: (B, L) state; logp: (B, L, V)."""
    if penalty <= 0:
        return logp
    pad = torch.full_like(x[:, :1], mask_id)
    hit = torch.zeros_like(logp, dtype=torch.bool)
    for neighbour in (torch.cat([pad, x[:, :-1]], 1), torch.cat([x[:, 1:], pad], 1)):
        hit.scatter_(-1, neighbour[..., None], True)
    hit[..., mask_id] = False  # an undecided neighbour says nothing
    return (logp - penalty * hit.to(logp.dtype)).log_softmax(-1)


def decode(
    rule: Rule,
    source: Whole | Windowed,
    x: Tensor,
    grid: Tensor | list[Tensor],
    blocks: list[tuple[int, int]],
    process,
    generator: torch.Generator | None,
    callback: Callback | None,
    repeat_penalty: float = 0.0,
    stop_at_eos: bool = True,
) -> SampleOutput:
    """Decodes ``blocks`` left to right, each walking ``grid`` (or each row its own, from
    ``row_grids``); see the module docstring. x: (B, L) with [MASK] where undecided (everything
    else, a prompt, is never changed)."""
    mask_id, length = process.mask_id, x.shape[1]
    free_at_start, memo = x == mask_id, rule.memo(x)
    between = interval_memo(process.schedule.keep)
    i, pred = 0, None
    for a, b in blocks:
        in_block = torch.zeros(length, dtype=torch.bool, device=x.device)
        in_block[a:b] = True
        free = free_at_start & in_block
        for j in range(steps_of(grid)):
            if not ((x == mask_id) & in_block).any() and not (rule.revises and free.any()):
                break  # the block is decided: no call is needed for the steps left
            t, s = times_at(grid, j)
            view, pred = source(x, a, b, j, t)
            seen = x[:, view]
            logp = penalise_repeats(seen, pred.logits, mask_id, repeat_penalty)
            x = x.clone()
            undecided = _undecided(x, mask_id, in_block, free, rule.revises, generator)
            span = range(length)[view]
            for rows, iv in intervals(grid, j, undecided, between):
                kept = None if memo is None else memo[rows][:, view]
                window = Window(seen[rows], logp[rows], free[rows][:, view], mask_id, kept)
                draws = rng.select(rng.window(generator, span.start, span.stop), rows)
                x[rows, view] = rule.step(window, iv, draws)
                if memo is not None:
                    memo[rows, view] = window.memo
            if callback is not None:
                callback(StepInfo(i=i, t=t, s=s, x=x, prediction=pred))
            i += 1
        if stop_at_eos and isinstance(generator, rng.Rows):
            x = ended_rows(x, b, process.eos_id, mask_id, generator.lengths)
        elif stop_at_eos and (ended := ended_at_eos(x, b, process.eos_id, mask_id)) is not None:
            x = ended
            break
    return SampleOutput(x=x, tokens=x, prediction=pred, nfe=source.nfe, positions=source.positions)


def _undecided(
    x: Tensor, mask_id: int, in_block: Tensor, free: Tensor, revises: bool, generator: rng.Draws
) -> Tensor | slice:
    """The rows a step decides: every row, or with per-row generators (``rng.Rows``) those
    whose block is not yet decided, so that a row finished early draws nothing more, as alone
    (where the block's loop ends there)."""
    if not isinstance(generator, rng.Rows):
        return slice(None)
    return ((x == mask_id) & in_block).any(-1) | (free.any(-1) & revises)


def _blockwise(
    rule: Rule,
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    process,
    generator: torch.Generator | None,
    callback: Callback | None,
    block_length: int,
    cache: BlockCache | None,
    steps_per_block: int | None,
    stop_at_eos: bool,
) -> SampleOutput:
    """Blocks of ``block_length`` predicted through their window: exact on a block model."""
    kv = None if cache is None else denoiser.new_cache()
    calls = Calls(denoiser, kv, x.shape[1], x.device)
    if exact := process.block_size is not None:  # a block model sees only earlier blocks
        lengths = generator.lengths if isinstance(generator, rng.Rows) else None  # padding
        blockwise.warn_unseen_fixed(x, process.mask_id, block_length, lengths)
    source = Windowed(calls, cache, exact)
    blocks = blocks_of(x.shape[1], block_length)
    grid = row_grids(timesteps, x.shape[1], block_length, steps_per_block, generator)
    return decode(rule, source, x, grid, blocks, process, generator, callback, 0.0, stop_at_eos)


def check_block_cache(cache: BlockCache | None) -> None:
    """Block diffusion's cache must be its exact prefix cache, or none."""
    check_cache(cache)
    if isinstance(cache, DualCache):
        raise ValueError(
            "cache=dual does not fit block diffusion: its blocks see only the past, so there is "
            "no suffix to cache; use cache=prefix (exact) or cache=none"
        )
    if cache is not None and cache.refresh is not None:
        raise ValueError(
            "cache.refresh rewrites a masked model's approximate cache; block diffusion's "
            "prefix cache is exact and never needs it"
        )


@named_by_rule
@torch.no_grad()
def sample_masked(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    rule: Rule = ANCESTRAL,
    block_length: int | None = None,
    steps_per_block: int | None = None,
    repeat_penalty: float = 0.0,
    stop_at_eos: bool = True,
    cache: BlockCache | None = None,
) -> SampleOutput:
    """Masked diffusion decoding by the step ``rule`` (MDLM ancestral by default); on a block
    diffusion model, its blocks (``process.block_size``) against their exact past. Options: see
    the module docstring. It is named, and fits the process kinds, of its rule
    (``named_by_rule``). x: (B, L) canvas with [MASK]; timesteps: (T+1,) from 1 to 0."""
    check_rule(rule)
    check_cache(cache)
    if repeat_penalty < 0:
        raise ValueError(f"repeat_penalty must be >= 0, got {repeat_penalty}")
    if process.block_size is not None:
        if block_length is not None or repeat_penalty or rule.reuses:
            raise ValueError(
                "a block diffusion model decodes its own blocks: sampler.block_length, "
                f"repeat_penalty and the {type(rule).__name__} rule apply to masked models only"
            )
        check_block_cache(cache)
        return _blockwise(
            rule, denoiser, x, timesteps, process, generator, callback, process.block_size,
            cache, steps_per_block, stop_at_eos,
        )  # fmt: skip
    if cache is None:
        blocks = blocks_of(x.shape[1], block_length)
        grid = row_grids(timesteps, x.shape[1], block_length, None, generator, whole=True)
        source = Whole(denoiser, x.shape[1], rule.reuses)
        return decode(
            rule, source, x, grid, blocks, process, generator, callback, repeat_penalty,
            stop_at_eos,
        )  # fmt: skip
    if block_length is None or repeat_penalty or rule.reuses:
        raise ValueError(
            f"cache={cache.name} caches around semi-autoregressive blocks: set "
            f"sampler.block_length (and no repeat_penalty; not with the {type(rule).__name__} "
            "rule, which skips calls instead)"
        )
    return _blockwise(
        rule, denoiser, x, timesteps, process, generator, callback, block_length, cache,
        steps_per_block, stop_at_eos,
    )  # fmt: skip


@register("block", processes=("block",))
@torch.no_grad()
def sample_block(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    rule: Rule = ANCESTRAL,
    steps_per_block: int | None = None,
    cache: PrefixCache | None = EXACT_PREFIX,
    stop_at_eos: bool = True,
) -> SampleOutput:
    """Block diffusion decoding (BD3-LM, Arriola et al. 2025): blocks of the process's
    ``block_size`` left to right, each denoised by the step ``rule`` (ancestral by default) in
    ``steps_per_block`` steps (default: the grid's steps shared out). The finished blocks are
    read from the KV cache (``PrefixCache()``, exact) or recomputed (None). ``stop_at_eos``:
    stop once every row has produced EOS (the rest becomes EOS); False fills the whole canvas.
    x: (B, L) canvas with [MASK]; timesteps: (T+1,) from 1 to 0."""
    check_rule(rule)
    check_block_cache(cache)
    return _blockwise(
        rule, denoiser, x, timesteps, process, generator, callback, process.block_size, cache,
        steps_per_block, stop_at_eos,
    )  # fmt: skip
