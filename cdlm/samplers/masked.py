"""Samplers for masked diffusion: ancestral (MDLM), cached ancestral, low-confidence remasking
(LLaDA), confidence-threshold parallel decoding (Fast-dLLM) and entropy-bounded unmasking
(EB-sampler), over the step functions of ``cdlm.samplers.masked_steps``.

Each takes the sampler contract's arguments (``cdlm.samplers.base``; x: (B, L) ids with
[MASK] where undecided, timesteps: (T+1,) from 1 to 0) and these options:

- ``temperature`` of the categorical draws (0: argmax).
- ``block_length``: semi-autoregressive blocks left to right (LLaDA Sec. 2.4), each walking
  the whole span of time; None decodes the whole canvas at once.
- ``repeat_penalty``: nats taken off each decided neighbour's token (``penalise_repeats``).
- ``stop_at_eos``: with blocks, stop early once every row has finished at the process's EOS
  (later masks become EOS); False fills the whole canvas (EOS then separates paragraphs).
- ``cache``: with blocks, Fast-dLLM's approximate KV caches (Wu et al. 2025),
  ``blockwise.PrefixCache()`` or ``blockwise.DualCache()``, rewritten once per block (every
  ``refresh`` steps if set); None runs the whole canvas every step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser
from cdlm.processes.masked import MaskedProcess
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, register
from cdlm.samplers.blockwise import BlockCache, cached_loop, check_cache
from cdlm.samplers.masked_steps import (
    Interval,
    block_grid,
    blocks_of,
    check_step,
    ended_at_eos,
    network_length,
    penalise_repeats,
    step_ancestral,
    step_entropy_bounded,
    step_threshold,
    step_topk,
)

Step = Callable[..., Tensor]


@dataclass(frozen=True)
class Blocks:
    """How a masked sampler walks the canvas: ``length`` of its blocks (None: one), the repeat
    penalty, whether it stops at EOS, and its KV cache (None: none)."""

    length: int | None
    repeat_penalty: float
    stop_at_eos: bool
    cache: BlockCache | None


def _loop(
    step: Step,
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    process: MaskedProcess,
    generator: torch.Generator | None,
    callback: Callback | None,
    block_length: int | None,
    repeat_penalty: float,
    stop_at_eos: bool,
    skip_unchanged: bool,
) -> SampleOutput:
    """Walks the blocks left to right over the whole canvas, ``len(timesteps) - 1`` steps in
    all (at least one per block); ``skip_unchanged`` reuses the last prediction while the
    canvas has not changed (exact for a time-free denoiser)."""
    if repeat_penalty < 0:
        raise ValueError(f"repeat_penalty must be >= 0, got {repeat_penalty}")
    length, mask_id = x.shape[1], process.mask_id
    blocks = blocks_of(length, block_length)
    grid = timesteps if len(blocks) == 1 else block_grid(timesteps, len(blocks))
    nfe, i, pred, seen = 0, 0, None, None
    for a, b in blocks:
        in_block = torch.zeros(length, dtype=torch.bool, device=x.device)
        in_block[a:b] = True
        for j in range(len(grid) - 1):
            if not ((x == mask_id) & in_block).any():
                break  # the block is decided: no call is needed for the steps left
            t, s = float(grid[j]), float(grid[j + 1])
            if not (skip_unchanged and seen is not None and torch.equal(x, seen)):
                tt = torch.full((x.shape[0],), t, device=x.device)
                pred, seen, nfe = denoiser(x, tt), x, nfe + 1
            iv = Interval.between(process.schedule.keep, t, s, len(grid) - 1 - j)
            logp = penalise_repeats(x, pred.logits, mask_id, repeat_penalty)
            x = step(x, logp, (x == mask_id) & in_block, iv, generator)
            if callback is not None:
                callback(StepInfo(i=i, t=t, s=s, x=x, prediction=pred))
            i += 1
        if stop_at_eos and (ended := ended_at_eos(x, b, process.eos_id, mask_id)) is not None:
            x = ended
            break
    positions = nfe * network_length(denoiser, length)
    return SampleOutput(x=x, tokens=x, prediction=pred, nfe=nfe, positions=positions)


def _sample(
    step: Step,
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    process: MaskedProcess,
    generator: torch.Generator | None,
    callback: Callback | None,
    blocks: Blocks,
    skip_unchanged: bool = False,
) -> SampleOutput:
    """The loop every masked sampler shares: over the whole canvas, or cached by blocks."""
    check_step(step)
    length, penalty, stop = blocks.length, blocks.repeat_penalty, blocks.stop_at_eos
    if blocks.cache is None:
        return _loop(
            step, denoiser, x, timesteps, process, generator, callback, length, penalty, stop,
            skip_unchanged,
        )  # fmt: skip
    check_cache(blocks.cache)
    if length is None or penalty:
        raise ValueError(
            f"cache={blocks.cache.name} caches around semi-autoregressive blocks: set "
            "sampler.block_length (and no repeat_penalty)"
        )
    return cached_loop(
        step, denoiser, x, timesteps, process, generator, callback, length, blocks.cache,
        stop_at_eos=stop,
    )  # fmt: skip


@register("ancestral", processes=("masked",))
@torch.no_grad()
def sample_ancestral(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: MaskedProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
    block_length: int | None = None,
    repeat_penalty: float = 0.0,
    stop_at_eos: bool = True,
    cache: BlockCache | None = None,
) -> SampleOutput:
    """MDLM ancestral sampling (Sahoo et al. 2024, eq. 7; ``step_ancestral``): each masked
    position is revealed with the schedule's reveal probability, its token drawn from the
    prediction. Options: see the module docstring."""
    blocks = Blocks(block_length, repeat_penalty, stop_at_eos, cache)
    step = functools.partial(step_ancestral, temperature=temperature)
    return _sample(step, denoiser, x, timesteps, process, generator, callback, blocks)


@register("cached_ancestral", processes=("masked",))
@torch.no_grad()
def sample_cached_ancestral(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: MaskedProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
    block_length: int | None = None,
    repeat_penalty: float = 0.0,
    stop_at_eos: bool = True,
) -> SampleOutput:
    """MDLM's cached ancestral sampler (Sahoo et al. 2024, Sec. 3.4): ancestral sampling that
    skips the network while no token has changed, since a time-free denoiser would repeat its
    prediction (the same samples, fewer NFE). It has no KV cache of its own. Options: see the
    module docstring."""
    blocks = Blocks(block_length, repeat_penalty, stop_at_eos, None)
    step = functools.partial(step_ancestral, temperature=temperature)
    return _sample(
        step, denoiser, x, timesteps, process, generator, callback, blocks, skip_unchanged=True
    )


@register("confidence", processes=("masked",))
@torch.no_grad()
def sample_topk(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: MaskedProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 0.0,
    block_length: int | None = None,
    repeat_penalty: float = 0.0,
    stop_at_eos: bool = True,
    cache: BlockCache | None = None,
) -> SampleOutput:
    """Low-confidence remasking (LLaDA, Nie et al. 2025, Alg. 5; ``step_topk``): each step
    commits the ceil(open / steps left) most confident proposals. Options: see the module
    docstring."""
    blocks = Blocks(block_length, repeat_penalty, stop_at_eos, cache)
    step = functools.partial(step_topk, temperature=temperature)
    return _sample(step, denoiser, x, timesteps, process, generator, callback, blocks)


@register("threshold", processes=("masked",))
@torch.no_grad()
def sample_threshold(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: MaskedProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 0.0,
    threshold: float = 0.9,
    block_length: int | None = None,
    repeat_penalty: float = 0.0,
    stop_at_eos: bool = True,
    cache: BlockCache | None = None,
) -> SampleOutput:
    """Confidence-threshold parallel decoding (Fast-dLLM, Wu et al. 2025; ``step_threshold``):
    each step commits every proposal whose probability exceeds ``threshold``, and at least the
    most confident one. Options: see the module docstring."""
    blocks = Blocks(block_length, repeat_penalty, stop_at_eos, cache)
    step = functools.partial(step_threshold, temperature=temperature, threshold=threshold)
    return _sample(step, denoiser, x, timesteps, process, generator, callback, blocks)


@register("entropy_bounded", processes=("masked",))
@torch.no_grad()
def sample_entropy_bounded(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: MaskedProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 0.0,
    gamma: float = 1.0,
    block_length: int | None = None,
    repeat_penalty: float = 0.0,
    stop_at_eos: bool = True,
    cache: BlockCache | None = None,
) -> SampleOutput:
    """Entropy-bounded unmasking (EB-sampler, Ben-Hamu et al. 2025; ``step_entropy_bounded``):
    each step commits the lowest-entropy proposals while their summed entropy, less the
    largest, stays within ``gamma`` nats. Options: see the module docstring."""
    blocks = Blocks(block_length, repeat_penalty, stop_at_eos, cache)
    step = functools.partial(step_entropy_bounded, temperature=temperature, gamma=gamma)
    return _sample(step, denoiser, x, timesteps, process, generator, callback, blocks)
