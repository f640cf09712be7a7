"""Samplers for masked diffusion: ancestral (MDLM), cached ancestral, low-confidence remasking
(LLaDA) and confidence-threshold parallel decoding, each optionally semi-autoregressive in
blocks of ``block_length`` positions.

A state is a (B, L) tensor of token ids with [MASK] where nothing is decided yet. Each step
function is pure: it decides which still-masked positions of the current block to commit and to
what, and never changes a committed token (no remasking). Categorical draws are float64 and made
only at the positions being decided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser
from cdlm.processes.masked import MaskedProcess
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, register, sample_categorical


@dataclass
class Interval:
    """One step of a block: from time t to s, with ``steps_left`` steps (this one included)."""

    t: float
    s: float
    steps_left: int
    p_reveal: float  # MDLM: (keep(s) - keep(t)) / (1 - keep(t))


def _commit(x: Tensor, logp: Tensor, chosen: Tensor, generator, temperature: float) -> Tensor:
    """Fills the ``chosen`` positions (B, L) with draws from ``logp``; the rest stays."""
    x = x.clone()
    x[chosen] = sample_categorical(logp[chosen], generator, temperature)
    return x


def step_ancestral(
    x: Tensor, logp: Tensor, open_: Tensor, iv: Interval, generator, temperature: float = 1.0
) -> Tensor:
    """MDLM's reverse step (Sahoo et al. 2024, eq. 7): each open masked position is revealed
    with probability (keep(s) - keep(t)) / (1 - keep(t)), with a token drawn from p_theta."""
    u = torch.rand(x.shape, device=x.device, generator=generator, dtype=torch.float64)
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
    proposal, conf = _confidence(x, logp, open_, generator, temperature)
    best = torch.zeros_like(open_).scatter_(-1, conf.argmax(-1, keepdim=True), True)
    chosen = open_ & ((conf > math.log(threshold)) | best | (iv.steps_left == 1))
    return torch.where(chosen, proposal, x)


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


def _blocks(length: int, block_length: int | None) -> list[tuple[int, int]]:
    if block_length is None or block_length >= length:
        return [(0, length)]
    if block_length < 1:
        raise ValueError(f"block_length must be >= 1, got {block_length}")
    return [(a, min(a + block_length, length)) for a in range(0, length, block_length)]


def _finished(x: Tensor, upto: int, eos: int | None, mask_id: int) -> bool:
    """True when every row has an EOS in [0, upto) with no mask before it."""
    if eos is None:
        return False
    head = x[:, :upto]
    has_eos = head == eos
    first = torch.where(has_eos.any(-1), has_eos.float().argmax(-1), upto)
    before = torch.arange(upto, device=x.device)[None] < first[:, None]
    return bool(has_eos.any(-1).all() and not ((head == mask_id) & before).any())


def _loop(
    step,
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    process: MaskedProcess,
    generator,
    callback: Callback | None,
    block_length: int | None,
    cache: bool,
    repeat_penalty: float = 0.0,
    **options,
) -> SampleOutput:
    """Walks the blocks left to right, ``len(timesteps) - 1`` steps in all (at least one per
    block). Stops early once every row has finished at an EOS; later masks become EOS."""
    if repeat_penalty < 0:
        raise ValueError(f"repeat_penalty must be >= 0, got {repeat_penalty}")
    length, mask_id, eos_id, keep = (
        x.shape[1],
        process.mask_id,
        process.eos_id,
        process.schedule.keep,
    )
    blocks = _blocks(length, block_length)
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
            if not (cache and seen is not None and torch.equal(x, seen)):
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
        if b < length and rest_open and _finished(x, b, eos_id, mask_id):
            x = x.masked_fill(x == mask_id, eos_id)
            break
    return SampleOutput(x=x, tokens=x, prediction=pred, nfe=nfe, positions=nfe * length)


def _sampler(name: str, step, cache: bool = False):
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
        **options,
    ) -> SampleOutput:
        return _loop(
            step,
            denoiser,
            x,
            timesteps,
            process,
            generator,
            callback,
            block_length,
            cache,
            repeat_penalty,
            **options,
        )

    sample.__name__ = sample.__qualname__ = f"sample_{name}"
    sample.__doc__ = (
        f"Masked-diffusion sampler ``{name}`` over ``{step.__name__}`` "
        "(see its docstring). x: (B, L) ids with [MASK] where undecided; timesteps: (T+1,) "
        "from 1 to 0; block_length: semi-autoregressive blocks (LLaDA Sec. 2.4), which stop "
        "early once every row has finished at the process's EOS; repeat_penalty: nats taken "
        "off each decided neighbour's token (see ``penalise_repeats``)."
    )
    return sample


sample_ancestral = _sampler("ancestral", step_ancestral)
sample_cached_ancestral = _sampler("cached_ancestral", step_ancestral, cache=True)
sample_topk = _sampler("confidence", step_topk)
sample_threshold = _sampler("threshold", step_threshold)
