"""Complementary masking: every training sequence is scored twice, under its corruption and
under the complementary one, in which the positions the first kept are the corrupted ones.

Fast-dLLM v2 (Wu et al. 2025) and LLaDA's SFT recipe train masked diffusion this way so that
every token is a target once per step; for uniform-state noise it pairs each draw with an
antithetic one. The complement's level is the one whose keep rate is the first's mask rate,
keep(t') = 1 - keep(t), so each half is marginally a corruption of the process at its level.
The pair costs two passes of the network, which the FLOP count (``cdlm.training.flops``) measures.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cdlm.processes.base import Corrupted
from cdlm.processes.uniform_support import NoiseSupport
from cdlm.schedules import MaskSchedule


def complementary_level(schedule: MaskSchedule, t: Tensor, t_min: float) -> Tensor:
    """t' with keep(t') = 1 - keep(t), (B,) or (B, L) like t, kept in [t_min, 1]. Where the
    schedule cannot reach that rate (the complement of an almost clean row, below its floor
    keep(1) = eps) t' is clamped; the positions masked are the complement's all the same."""
    return schedule.time_of(1.0 - schedule.keep(t)).clamp(t_min, 1.0)


def stacked(c: Corrupted, x_other: Tensor, t_other: Tensor) -> Corrupted:
    """``c`` (B rows) with its complement stacked below it (2B rows)."""
    return Corrupted(
        tokens=c.tokens.repeat(2, 1),
        x0=c.x0.repeat(2, 1),
        x_t=torch.cat([c.x_t, x_other]),
        t=torch.cat([c.t, t_other]),
        noisy=torch.cat([c.noisy, ~c.noisy]),
    )


def with_masked_complement(
    c: Corrupted, schedule: MaskSchedule, mask_id: int, t_min: float
) -> Corrupted:
    """A masking ``c`` and below it its complement: the masked positions shown, the shown ones
    masked."""
    x_other = torch.where(c.noisy, c.tokens, mask_id)
    return stacked(c, x_other, complementary_level(schedule, c.t, t_min))


def with_uniform_complement(
    c: Corrupted,
    schedule: MaskSchedule,
    support: NoiseSupport,
    t_min: float,
    generator: torch.Generator | None = None,
) -> Corrupted:
    """A uniform-state corruption ``c`` and below it its complement: the resampled positions
    clean, the kept ones redrawn uniformly from the noise's ``support`` (a fresh draw)."""
    noise = support.draw(c.tokens.shape, generator, c.tokens.device)
    x_other = torch.where(c.noisy, c.tokens, noise)
    return stacked(c, x_other, complementary_level(schedule, c.t, t_min))
