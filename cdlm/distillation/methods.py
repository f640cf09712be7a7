"""Distillation methods: each turns (process, student, teacher, batch, step count) into a loss,
reusing the process's time draw and corruption so that teacher and student see the very same
noisy input. Chosen in ``conf/module/distill_*.yaml`` by ``_target_``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from cdlm.denoiser import Denoiser
from cdlm.distillation.targets import (
    Divergence,
    consistency_pair,
    divergence_or_default,
    progressive_target,
    sdtt_target,
)
from cdlm.processes.base import LossOutput
from cdlm.processes.losses import masked_mean, valid_mask


def _grid_draw(n: int, steps: int, device, generator) -> tuple[Tensor, Tensor]:
    """Per row, one interval of the uniform ``steps``-step grid: (t, s = t - 1/steps), (n,)."""
    i = torch.randint(1, steps + 1, (n,), device=device, generator=generator)
    return i / steps, (i - 1) / steps


def _ce(pred_logits: Tensor, tokens: Tensor, valid: Tensor) -> Tensor:
    nll = F.cross_entropy(pred_logits.float().flatten(0, 1), tokens.flatten(), reduction="none")
    return masked_mean(nll.view_as(tokens), valid)


class Progressive:
    """Progressive distillation (Salimans & Ho 2022) for gaussian processes: the student's one
    DDIM step matches ``teacher_steps_per_step`` teacher DDIM steps (2 in the paper; ELF takes
    4 from its original teacher) over the same interval of the uniform grid. Loss: the truncated-SNR
    weighted x0 error, w = clamp(SNR(t), 1, ``max_weight``) (their "max(SNR, 1)", capped
    because a VP schedule's SNR reaches e^10 near t = 0), plus ``ce_weight`` times the CE of the
    student's logits (keeps the readout sharp, as ELF does for text)."""

    name = "progressive"
    process_kinds = ("gaussian",)
    halves = True
    sampler = "ddim"  # the deterministic sampler the student was distilled for
    uses_ema_target = False

    def __init__(
        self, ce_weight: float = 0.1, max_weight: float = 100.0, teacher_steps_per_step: int = 2
    ) -> None:
        if teacher_steps_per_step < 1:
            raise ValueError(f"teacher_steps_per_step must be >= 1, got {teacher_steps_per_step}")
        self.ce_weight, self.max_weight = ce_weight, max_weight
        self.teacher_steps_per_step = teacher_steps_per_step

    def loss(
        self, process, student: Denoiser, teacher: Denoiser, batch, steps: int, generator=None
    ) -> LossOutput:
        tokens, valid = batch["tokens"], valid_mask(batch)
        t, t_end = _grid_draw(tokens.shape[0], steps, tokens.device, generator)
        c = process.corrupt(tokens, t, generator)
        target = progressive_target(teacher, process, c.x_t, t, t_end, self.teacher_steps_per_step)
        pred = student(c.x_t, t)
        snr = (process.schedule.alpha(t) / process.schedule.sigma(t)) ** 2
        weight = snr.clamp(1.0, self.max_weight)[:, None]
        error = (pred.x0.float() - target.float()).pow(2).sum(-1)
        mse = masked_mean(weight * error, valid)
        ce = _ce(pred.logits, tokens, valid)
        metrics = {"x0_mse": masked_mean(error, valid).detach(), "ce": ce.detach()}
        return LossOutput(mse + self.ce_weight * ce, metrics)


class Consistency:
    """Consistency distillation (Song et al. 2023, Alg. 2) over the probability-flow ODE, the
    teacher's DDIM step on a ``solver_steps`` grid as the solver: the student's x0 at
    (z_{t_{n+1}}, t_{n+1}) matches the EMA student's at the teacher's (z_{t_n}, t_n); at t_n = 0
    the target is z_0 itself (the boundary condition f(z, 0) = z). Squared L2 on x0 plus
    ``ce_weight`` times the CE of the student's logits. Not halving: one round."""

    name = "consistency"
    process_kinds = ("gaussian",)
    halves = False
    sampler = "consistency"  # multistep consistency sampling (Song et al. 2023, Alg. 1)
    uses_ema_target = True

    def __init__(self, solver_steps: int = 64, ce_weight: float = 0.1) -> None:
        if solver_steps < 1:
            raise ValueError(f"solver_steps must be >= 1, got {solver_steps}")
        self.solver_steps, self.ce_weight = solver_steps, ce_weight

    def loss(
        self,
        process,
        student: Denoiser,
        teacher: Denoiser,
        batch,
        steps: int,
        generator=None,
        target: Denoiser | None = None,
    ) -> LossOutput:
        tokens, valid = batch["tokens"], valid_mask(batch)
        t_next, t_now = _grid_draw(tokens.shape[0], self.solver_steps, tokens.device, generator)
        c = process.corrupt(tokens, t_next, generator)
        z_now = consistency_pair(teacher, process, c.x_t, t_next, t_now)
        with torch.no_grad():
            goal = (target or student)(z_now, t_now).x0
            goal = torch.where((t_now <= 0)[:, None, None], z_now, goal)
        pred = student(c.x_t, t_next)
        error = (pred.x0.float() - goal.float()).pow(2).sum(-1)
        mse = masked_mean(error, valid)
        ce = _ce(pred.logits, tokens, valid)
        return LossOutput(mse + self.ce_weight * ce, {"x0_mse": mse.detach(), "ce": ce.detach()})


class SDTT:
    """Self-Distillation Through Time (Deschenaux & Gulcehre 2024) for masked and block-
    diffusion processes: at every masked position the student's one-step prediction matches, by
    ``divergence`` (a ``cdlm.distillation.targets.Divergence``: ``ReverseKL``, the paper's
    default; ``ForwardKL``; ``LogProbMSE``), the distribution the teacher reaches in two
    ancestral steps of size 1/teacher_steps.

    Teacher and student are called through ``process.predict`` on the one corruption, which
    hands a denoiser what its process needs beside the canvas: a block model gets the true clean
    stream (``clean=tokens``; its default would be the noisy canvas), so with every block masked
    at the one level t the teacher's two steps run within every block at once, each given its
    clean past: the within-block two-step distribution. Its student's steps are then steps per block (``Distillation`` records
    ``steps_per_block`` for the block sampler)."""

    name = "sdtt"
    process_kinds = ("masked", "block")
    halves = True
    sampler = None  # the process's own: ancestral (masked), block (block diffusion)
    uses_ema_target = False

    def __init__(
        self, divergence: Divergence | None = None, teacher_steps_per_step: int = 2
    ) -> None:
        self.divergence = divergence_or_default(divergence)
        self.teacher_steps_per_step = teacher_steps_per_step

    def loss(
        self, process, student: Denoiser, teacher: Denoiser, batch, steps: int, generator=None
    ) -> LossOutput:
        tokens, valid = batch["tokens"], valid_mask(batch)
        # one shared t per batch: the teacher's steps are whole-batch calls at one level
        t = float(process.sample_t(1, generator, device=tokens.device))
        t_rows = torch.full((tokens.shape[0],), t, device=tokens.device)
        c = process.corrupt(tokens, t_rows, generator)
        dt = 1.0 / (steps * self.teacher_steps_per_step)
        target = sdtt_target(teacher, process, c, t, dt, self.teacher_steps_per_step, generator)
        scored = c.noisy & valid
        student_logp = process.predict(student, c).logits
        div = self.divergence(student_logp[scored], target[scored])
        loss = div.mean() if div.numel() else student_logp.sum() * 0.0
        return LossOutput(loss.float(), {"divergence": loss.detach().float()})


class DCD:
    """Discrete Consistency Distillation (Duo: Sahoo et al., ICML 2025, "The Diffusion
    Duality", Sec. 5) for uniform-state processes: the student at (x_t, t) matches, by
    ``divergence`` (``ReverseKL``, the reference's ``kl-bwd``, by default), the teacher at
    (x_s, s), s = t - 1/(2 steps), where x_t and x_s are the argmaxes of one Gaussian path over
    one-hots given the clean tokens (``UniformProcess.trajectory``): the deterministic DDIM
    trajectory of the dual Gaussian process, which uniform-state diffusion alone lacks. Rounds
    halve the steps with the previous student as teacher, like SDTT's."""

    name = "dcd"
    process_kinds = ("uniform",)
    halves = True
    sampler = None  # the process's own: duo_ancestral
    uses_ema_target = False
    teacher_steps_per_step = 2  # the teacher's one step is half the student's

    def __init__(self, divergence: Divergence | None = None) -> None:
        self.divergence = divergence_or_default(divergence)

    def loss(
        self, process, student: Denoiser, teacher: Denoiser, batch, steps: int, generator=None
    ) -> LossOutput:
        tokens, valid = batch["tokens"], valid_mask(batch)
        # the teacher's step when the student takes ``steps``; like the reference, t is shifted
        # up by dt so that s = t - dt stays inside the draw's range
        dt = 1.0 / (self.teacher_steps_per_step * steps)
        t = process.sample_t(tokens.shape[0], generator, device=tokens.device)
        t = (t + dt).clamp(max=1.0)
        s = t - dt
        x_t, x_s = process.trajectory(tokens, t, s, generator)
        with torch.no_grad():
            target = teacher(x_s, s).logits
        student_logp = student(x_t, t).logits
        # every valid position is scored: the trajectory may move any token
        div = self.divergence(student_logp[valid], target[valid])
        loss = div.mean() if div.numel() else student_logp.sum() * 0.0
        return LossOutput(loss.float(), {"divergence": loss.detach().float()})
