"""Block-by-block decoding with the network's KV cache: each step runs only the positions that
change, attending to cached keys and values of the rest.

* Block diffusion (``process=block``, BD3-LM, Arriola et al. 2025): finished blocks are written
  into the cache once, exactly (they are clean and a block sees only its past); each denoising
  step runs the current block alone. ``cache=none`` recomputes the clean past in every call.
* A full-attention masked model (Fast-dLLM, Wu et al. 2025): an approximation, refreshed at
  the start of each block (and every ``refresh`` steps): ``prefix`` caches the decided prefix
  and recomputes block + suffix each step; ``dual`` also caches the still-masked suffix and
  recomputes the block alone. The refresh pass's own predictions serve the block's first step.

Windows are in the network's own coordinates (a shifted model's input is one longer); the
denoiser takes the whole canvas and ``positions`` and predicts those positions only.
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser, Prediction
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, register
from cdlm.samplers.masked_steps import (
    Interval,
    blocks_of,
    finished_at_eos,
    network_length,
    step_ancestral,
)

CACHES = ("none", "prefix", "dual")


def _grid(timesteps: Tensor, n_blocks: int, steps_per_block: int | None) -> Tensor:
    """Each block walks the span of the whole grid in ``steps_per_block`` (default: the grid's
    steps shared out, at least one) even steps."""
    per_block = steps_per_block or max(1, (len(timesteps) - 1) // n_blocks)
    return torch.linspace(float(timesteps[0]), 0.0, per_block + 1, dtype=torch.float64)


def cached_loop(
    step,
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    process,
    generator,
    callback: Callback | None,
    block_length: int,
    cache: str,
    refresh: int | None = None,
    steps_per_block: int | None = None,
    stop_at_eos: bool = True,
    **options,
) -> SampleOutput:
    """Semi-autoregressive decoding of blocks of ``block_length`` with a KV cache (see the module
    docstring); ``step`` is a ``masked_steps`` step function. With ``stop_at_eos`` it stops once
    every row has finished at the process's EOS (later masks become EOS); without, it fills the
    whole canvas."""
    if refresh is not None and refresh < 1:
        raise ValueError(f"refresh must be >= 1 steps, got {refresh}")
    length, mask_id, keep = x.shape[1], process.mask_id, process.schedule.keep
    exact = getattr(process, "block_size", None) is not None
    net_len = network_length(denoiser, length)
    blocks = blocks_of(length, block_length)
    grid = _grid(timesteps, len(blocks), steps_per_block)
    kv = denoiser.network.new_cache() if cache != "none" else None
    nfe, positions, i, pred, cached_upto = 0, 0, 0, None, 0
    device = x.device

    def call(at: Tensor, t: float, write: bool) -> Tensor:
        nonlocal nfe, positions
        tt = torch.full((x.shape[0],), t, device=device)
        nfe += 1
        if kv is None:
            positions += (int(at[0]) if exact else 0) + len(at)
            return denoiser(x, tt, positions=at).logits
        positions += len(at)
        if write:
            return denoiser(x, tt, positions=at, cache=kv).logits
        with kv.read_only():
            return denoiser(x, tt, positions=at, cache=kv).logits

    for a, b in blocks:
        block = torch.arange(a, b, device=device)
        fresh = None  # the block's predictions from a refresh pass, if one just ran
        if exact and kv is not None:
            for c in range(cached_upto, a, block_length):  # finished blocks, written once each
                call(torch.arange(c, min(c + block_length, a), device=device), 0.0, write=True)
            cached_upto = a
        for j in range(len(grid) - 1):
            if not (x[:, a:b] == mask_id).any():
                break  # the block is decided: no call is needed for the steps left
            t, s = float(grid[j]), float(grid[j + 1])
            if not exact and kv is not None and (j == 0 or (refresh and j % refresh == 0)):
                fresh = _refresh(call, kv, cache, a, b, net_len, t, device)
            if fresh is not None:
                logp, fresh = fresh, None
            elif exact or cache == "dual":
                logp = call(block, t, write=False)
            else:  # prefix: the block and the suffix, against the cached prefix
                logp = call(torch.arange(a, net_len, device=device), t, write=False)[:, : b - a]
            k_t, k_s = keep(torch.tensor(t)).item(), keep(torch.tensor(s)).item()
            p_reveal = 1.0 if s <= 0 else (k_s - k_t) / (1.0 - k_t)
            iv = Interval(t=t, s=s, steps_left=len(grid) - 1 - j, p_reveal=p_reveal)
            window = x[:, a:b]
            x = x.clone()
            x[:, a:b] = step(window, logp, window == mask_id, iv, generator, **options)
            pred = Prediction(logits=logp)
            if callback is not None:
                callback(StepInfo(i=i, t=t, s=s, x=x, prediction=pred))
            i += 1
        if (
            stop_at_eos
            and b < length
            and (x[:, b:] == mask_id).all()
            and finished_at_eos(x, b, process.eos_id, mask_id)
        ):
            x = x.masked_fill(x == mask_id, process.eos_id)
            break
    return SampleOutput(x=x, tokens=x, prediction=pred, nfe=nfe, positions=positions)


def _refresh(call, kv, cache: str, a: int, b: int, net_len: int, t: float, device) -> Tensor:
    """Rewrites the cache from the current canvas; returns the block's predictions (B, W, V)."""
    kv.truncate(0)
    prefix, block = torch.arange(0, a, device=device), torch.arange(a, b, device=device)
    if cache == "prefix":
        logp = call(torch.arange(0, net_len, device=device), t, write=True)
        kv.truncate(a)
        return logp[:, a:b]
    suffix = torch.arange(b, net_len, device=device)
    logp = call(torch.cat([prefix, suffix, block]), t, write=True)
    kv.truncate(a + len(suffix))
    return logp[:, -len(block) :]


def with_cache(sampler, cache: str | None):
    """``sampler`` (a Hydra partial) with the KV-cache choice ``cache`` (None: its default);
    a clean error where the sampler has no such choice."""
    if cache is None:
        return sampler
    if cache not in CACHES:
        raise ValueError(f"unknown cache {cache!r}; valid: {', '.join(CACHES)}")
    fn = getattr(sampler, "func", sampler)
    if "cache" not in inspect.signature(fn).parameters:
        name = getattr(fn, "sampler_name", fn.__name__)
        raise ValueError(
            f"cache={cache} applies to block diffusion (sampler=block) and to masked samplers "
            f"with sampler.block_length; sampler {name!r} has no such choice (the AR sampler "
            "always keeps its exact KV cache: sampler.use_cache)"
        )
    keywords = dict(getattr(sampler, "keywords", {})) | {"cache": cache}
    return functools.partial(fn, *getattr(sampler, "args", ()), **keywords)


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
    step=step_ancestral,
    cache: str = "prefix",
    steps_per_block: int | None = None,
    **options,
) -> SampleOutput:
    """Block diffusion decoding (BD3-LM): blocks of the process's ``block_size`` left to right,
    each denoised by ``step`` (a ``masked_steps`` function: ancestral by default, or
    ``step_threshold`` for confidence-threshold parallel decoding) in ``steps_per_block`` steps
    (default: the grid's steps shared out), the finished blocks read from the KV cache
    (``cache=prefix``, exact) or recomputed (``cache=none``). x: (B, L) canvas with [MASK]."""
    if cache not in ("none", "prefix"):
        raise ValueError(
            f"cache={cache!r} does not fit block diffusion: its blocks see only the past, so "
            "there is no suffix to cache; use cache=prefix (exact) or cache=none"
        )
    return cached_loop(
        step,
        denoiser,
        x,
        timesteps,
        process,
        generator,
        callback,
        process.block_size,
        cache,
        None,
        steps_per_block,
        **options,
    )
