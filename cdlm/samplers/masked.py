"""Samplers for masked diffusion: ancestral (MDLM), cached ancestral, low-confidence remasking
(LLaDA) and confidence-threshold parallel decoding (``cdlm.samplers.masked_steps``), each
optionally semi-autoregressive in blocks of ``block_length`` positions, and then optionally with
Fast-dLLM's approximate KV cache (``cache=prefix|dual``, ``cdlm.samplers.blockwise``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser
from cdlm.processes.masked import MaskedProcess
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, register
from cdlm.samplers.blockwise import CACHES, cached_loop
from cdlm.samplers.masked_steps import (  # noqa: F401  (re-exported: the step functions)
    Interval,
    blocks_of,
    finished_at_eos,
    network_length,
    penalise_repeats,
    step_ancestral,
    step_entropy_bounded,
    step_threshold,
    step_topk,
)


def _loop(
    step,
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    process: MaskedProcess,
    generator,
    callback: Callback | None,
    block_length: int | None,
    skip_unchanged: bool,
    repeat_penalty: float = 0.0,
    stop_at_eos: bool = True,
    **options,
) -> SampleOutput:
    """Walks the blocks left to right, ``len(timesteps) - 1`` steps in all (at least one per
    block). With ``stop_at_eos`` it stops early once every row has finished at an EOS; later
    masks become EOS. Without, it fills the whole canvas (EOS then separates paragraphs)."""
    if repeat_penalty < 0:
        raise ValueError(f"repeat_penalty must be >= 0, got {repeat_penalty}")
    length, mask_id, eos_id, keep = (
        x.shape[1],
        process.mask_id,
        process.eos_id,
        process.schedule.keep,
    )
    blocks = blocks_of(length, block_length)
    per_block = max(1, (len(timesteps) - 1) // len(blocks))
    grid = (
        timesteps
        if len(blocks) == 1
        # each block walks the same span of time as the whole grid (t < 1 when editing)
        else torch.linspace(float(timesteps[0]), 0.0, per_block + 1, dtype=torch.float64)
    )
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
            k_t, k_s = keep(torch.tensor(t)).item(), keep(torch.tensor(s)).item()
            p_reveal = 1.0 if s <= 0 else (k_s - k_t) / (1.0 - k_t)
            iv = Interval(t=t, s=s, steps_left=len(grid) - 1 - j, p_reveal=p_reveal)
            logp = penalise_repeats(x, pred.logits, mask_id, repeat_penalty)
            x = step(x, logp, (x == mask_id) & in_block, iv, generator, **options)
            if callback is not None:
                callback(StepInfo(i=i, t=t, s=s, x=x, prediction=pred))
            i += 1
        # Stop early only if nothing after this block is decided (a fixed region there must
        # still get its blanks sampled, not filled with EOS).
        rest_open = bool((x[:, b:] == mask_id).all())
        if stop_at_eos and b < length and rest_open and finished_at_eos(x, b, eos_id, mask_id):
            x = x.masked_fill(x == mask_id, eos_id)
            break
    positions = nfe * network_length(denoiser, length)
    return SampleOutput(x=x, tokens=x, prediction=pred, nfe=nfe, positions=positions)


def _sampler(name: str, step, skip_unchanged: bool = False):
    """Builds a registered sampler from a step function."""

    @register(name, processes=("masked",))
    @torch.no_grad()
    def sample(
        denoiser: Denoiser,
        x: Tensor,
        timesteps: Tensor,
        *,
        process: MaskedProcess,
        generator: torch.Generator | None = None,
        callback: Callback | None = None,
        block_length: int | None = None,
        repeat_penalty: float = 0.0,
        cache: str = "none",
        refresh: int | None = None,
        **options,
    ) -> SampleOutput:
        if cache not in CACHES:
            raise ValueError(f"unknown cache {cache!r}; valid: {', '.join(CACHES)}")
        if cache != "none":
            if block_length is None or skip_unchanged or repeat_penalty:
                raise ValueError(
                    f"cache={cache} caches around semi-autoregressive blocks: set "
                    "sampler.block_length (and no repeat_penalty; not with cached_ancestral)"
                )
            return cached_loop(
                step,
                denoiser,
                x,
                timesteps,
                process,
                generator,
                callback,
                block_length,
                cache,
                refresh,
                **options,
            )
        return _loop(
            step,
            denoiser,
            x,
            timesteps,
            process,
            generator,
            callback,
            block_length,
            skip_unchanged,
            repeat_penalty,
            **options,
        )

    sample.__name__ = sample.__qualname__ = f"sample_{name}"
    sample.__doc__ = (
        f"Masked-diffusion sampler ``{name}`` over ``{step.__name__}`` "
        "(see its docstring). x: (B, L) ids with [MASK] where undecided; timesteps: (T+1,) "
        "from 1 to 0; block_length: semi-autoregressive blocks (LLaDA Sec. 2.4), which stop "
        "early once every row has finished at the process's EOS; repeat_penalty: nats taken "
        "off each decided neighbour's token (see ``penalise_repeats``); cache: ``prefix`` or "
        "``dual`` (Fast-dLLM, Wu et al. 2025) reuse keys and values refreshed once per block "
        "(every ``refresh`` steps if set), see ``cdlm.samplers.blockwise``."
    )
    return sample


sample_ancestral = _sampler("ancestral", step_ancestral)
sample_cached_ancestral = _sampler("cached_ancestral", step_ancestral, skip_unchanged=True)
sample_topk = _sampler("confidence", step_topk)
sample_threshold = _sampler("threshold", step_threshold)
sample_entropy_bounded = _sampler("entropy_bounded", step_entropy_bounded)
