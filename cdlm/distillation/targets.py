"""What a distilled student learns to match: pure functions of a teacher denoiser and a draw of
the forward process, so that the closed-form tests and the training modules share them.

* ``progressive_target``: the x0 whose single DDIM step from t to t'' lands where the teacher's
  k DDIM sub-steps from t to t'' land (Salimans & Ho 2022, Alg. 2, k = 2; ELF uses k = 4).
* ``consistency_pair``: the teacher's one ODE (DDIM) step from t_{n+1} to t_n, the point whose
  EMA-student output the student's output at t_{n+1} must equal (Song et al. 2023, Alg. 2).
* ``sdtt_target``: per masked position, the log-probabilities the teacher used when it revealed
  that position during two ancestral steps (or its last ones, if still masked): what the student
  must predict in one step (Deschenaux & Gulcehre 2024, "Self-Distillation Through Time"); on a
  block-diffusion teacher the steps run within every block at once, each given its clean past.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import replace

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser, per_position
from cdlm.processes.base import Corrupted
from cdlm.samplers.gaussian import step_ddim
from cdlm.samplers.masked_steps import Interval, step_ancestral


def ddim_to(process, x: Tensor, x0: Tensor, t: Tensor, s: Tensor) -> Tensor:
    """The deterministic DDIM step from t to s (B,) with the estimate ``x0``; s = 0 returns the
    estimate itself, as the samplers' last interval does."""
    schedule = process.schedule
    coefficients = [per_position(f(v)) for v in (t, s) for f in (schedule.alpha, schedule.sigma)]
    stepped = step_ddim(x, x0, *coefficients, torch.zeros_like(x))
    return torch.where(per_position(s <= 0), x0, stepped)


@torch.no_grad()
def progressive_target(
    teacher: Denoiser, process, z_t: Tensor, t: Tensor, t_end: Tensor, substeps: int = 2
) -> Tensor:
    """x0 target (B, L, D) for the student's step t -> t_end from ``substeps`` teacher DDIM steps
    on an even grid between them: solve z_end = alpha_end x + (sigma_end / sigma_t)(z_t -
    alpha_t x) for x. Where t_end = 0 the student's step returns its estimate, so the target
    is the teacher's z_end."""
    if substeps < 1:
        raise ValueError(f"teacher sub-steps must be >= 1, got {substeps}")
    z = z_t
    for k in range(substeps):
        here = t + (t_end - t) * (k / substeps)
        there = t + (t_end - t) * ((k + 1) / substeps)
        z = ddim_to(process, z, teacher(z, here).x0, here, there)
    a_t, s_t = process.schedule.alpha(t), process.schedule.sigma(t)
    a_e, s_e = process.schedule.alpha(t_end), process.schedule.sigma(t_end)
    ratio = s_e / s_t
    x = (z - per_position(ratio) * z_t) / per_position(a_e - ratio * a_t)
    return torch.where(per_position(t_end <= 0), z, x)


@torch.no_grad()
def consistency_pair(
    teacher: Denoiser, process, z_next: Tensor, t_next: Tensor, t_now: Tensor
) -> Tensor:
    """z at t_now (B, L, D): one teacher DDIM (probability-flow ODE) step from z_next at t_next."""
    return ddim_to(process, z_next, teacher(z_next, t_next).x0, t_next, t_now)


@torch.no_grad()
def sdtt_target(
    teacher: Denoiser,
    process,
    c: Corrupted,
    t: float,
    dt: float,
    steps: int = 2,
    generator: torch.Generator | None = None,
) -> Tensor:
    """(B, L, V) teacher log-probabilities for the masked positions of ``c.x_t`` (B, L), every
    row at the one level t: the teacher takes ``steps`` MDLM ancestral steps of size ``dt`` from
    t (``step_ancestral``, float64 draws); a position revealed at a step gets that step's
    log-probabilities, one still masked gets the last step's. Unmasked positions are left at 0
    (the student is not scored there).

    Each call goes through ``process.predict`` on the corruption advanced to the current canvas,
    so the process supplies what else its denoiser reads: nothing for masked diffusion; for
    block diffusion the clean stream ``c.tokens``, so that every block takes its two steps
    given the true clean blocks before it (the within-block two-step distribution), not the
    noisy canvas."""
    keep = process.schedule.keep
    z = c.x_t
    target = torch.zeros((*z.shape, process.vocab_size), device=z.device)
    decided = torch.zeros_like(z, dtype=torch.bool)
    x, logp = z, None
    for k in range(steps):
        t_k, s_k = max(t - k * dt, 0.0), max(t - (k + 1) * dt, 0.0)
        tt = torch.full((z.shape[0],), t_k, device=z.device)
        open_ = x == process.mask_id
        logp = process.predict(teacher, replace(c, x_t=x, t=tt, noisy=open_)).logits
        iv = Interval.between(keep, t_k, s_k, steps - k)
        new = step_ancestral(x, logp, open_, iv, generator)
        revealed = open_ & (new != process.mask_id)
        target = torch.where(revealed[..., None], logp, target)
        decided |= revealed
        x = new
    still = (z == process.mask_id) & ~decided
    return torch.where(still[..., None], logp, target)


class Divergence(ABC):
    """A per-row divergence (N,) between a student's and a teacher's log-probabilities (N, V),
    summed over the vocabulary in float64. -inf entries (SUBS' [MASK]) contribute nothing.
    Subclasses give the per-entry ``terms``; SDTT takes one by ``_target_``."""

    @abstractmethod
    def terms(self, s: Tensor, q: Tensor) -> Tensor:
        """Per-entry terms (N, V) of finite log-probabilities (-inf entries already zeroed)."""

    def __call__(self, student_logp: Tensor, teacher_logp: Tensor) -> Tensor:
        s, q = student_logp.double(), teacher_logp.double()
        finite = torch.isfinite(s) & torch.isfinite(q)
        # zero the -inf entries first: a where() after the arithmetic would still send NaN gradients
        s, q = torch.where(finite, s, 0.0), torch.where(finite, q, 0.0)
        return torch.where(finite, self.terms(s, q), 0.0).sum(-1)


class ReverseKL(Divergence):
    """KL(student || teacher), mode-seeking: SDTT's default."""

    def terms(self, s: Tensor, q: Tensor) -> Tensor:
        return s.exp() * (s - q)


class ForwardKL(Divergence):
    """KL(teacher || student), mass-covering."""

    def terms(self, s: Tensor, q: Tensor) -> Tensor:
        return q.exp() * (q - s)


class LogProbMSE(Divergence):
    """The squared error of the log-probabilities."""

    def terms(self, s: Tensor, q: Tensor) -> Tensor:
        return (s - q) ** 2


def divergence_or_default(divergence: Divergence | None) -> Divergence:
    """``divergence``, or ``ReverseKL`` (SDTT's and Duo's default) when None; anything else is
    refused in one line (a Hydra config can hand over any object)."""
    if divergence is None:
        return ReverseKL()
    if not isinstance(divergence, Divergence):
        raise ValueError(
            f"unknown divergence {divergence!r}; valid: a cdlm.distillation.targets.Divergence "
            "(ReverseKL, ForwardKL, LogProbMSE)"
        )
    return divergence


def halvings(start: int, end: int) -> list[int]:
    """Student step counts of progressive rounds: start/2, start/4, ... down to ``end``."""
    if start < 2 or end < 1 or end >= start:
        raise ValueError(
            f"progressive rounds need start_steps >= 2 > end_steps >= 1, got {start}, {end}"
        )
    if 2 ** round(math.log2(start)) != start or 2 ** round(math.log2(end)) != end:
        raise ValueError(f"start_steps and end_steps must be powers of two, got {start}, {end}")
    counts, n = [], start
    while n > end:
        n //= 2
        counts.append(n)
    return counts
