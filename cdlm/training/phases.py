"""Schedules over training, driven from the trainer's progress through the budget.

``Phases`` is the one place where training's schedules advance (STYLE rule 11: a method named
like a query, such as ``process.loss``, changes no state): AR pre-training inside a diffusion
run, then attention annealed from causal to full (DiffuLLaMA, Gong et al. 2025; Dream, Ye et al.
2025), and the time sampler's curriculum. Each is a share of the budget, steps
(``trainer.max_steps``) or wall clock (``trainer.max_time``), so one recipe fits a 30-step smoke
test and a 10-minute run alike.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Timer


def budget_progress(trainer: L.Trainer) -> float | None:
    """The share of the budget spent, in [0, 1]: the further along of steps (global_step /
    max_steps) and wall clock (Lightning's ``Timer``, whose state resumes with a checkpoint);
    None when the run has neither budget."""
    shares = []
    if trainer.max_steps is not None and trainer.max_steps > 0:
        shares.append(trainer.global_step / trainer.max_steps)
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    if timer is not None and timer.time_remaining() is not None:
        elapsed = timer.time_elapsed("train")
        total = elapsed + timer.time_remaining("train")
        shares.append(elapsed / total if total > 0 else 1.0)
    return min(1.0, max(shares)) if shares else None


def visibility(progress: float, ar: float, anneal: float) -> float:
    """Share of future keys visible at ``progress``: 0 in the AR phase, rising linearly to 1 over
    the annealing share, 1 after."""
    if progress < ar:
        return 0.0
    if anneal <= 0:
        return 1.0
    return min(1.0, (progress - ar) / anneal)


class Phases(L.Callback):
    """Before every training batch, sets the process's AR phase (the first ``ar`` share of the
    budget trains a shifted model as a next-token predictor on clean tokens), the network's
    share of visible future keys (opened from causal to full over the next ``anneal`` share)
    and the time sampler's progress (its curriculum, if any)."""

    def __init__(self, ar: float = 0.0, anneal: float = 0.0) -> None:
        if not (0.0 <= ar < 1.0 and 0.0 <= anneal and ar + anneal <= 1.0):
            raise ValueError(
                f"phases.ar and phases.anneal are shares of the budget with ar < 1 and "
                f"ar + anneal <= 1, got ar={ar}, anneal={anneal}"
            )
        self.ar, self.anneal = ar, anneal

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or not (self.ar or self.anneal):
            return
        if getattr(pl_module.network, "causal", False):
            raise ValueError(
                "phases apply to diffusion processes; the autoregressive baseline is causal "
                "throughout (use phases=none)"
            )
        if not hasattr(pl_module.network, "future_visibility"):
            raise ValueError(
                f"phases need a cdlm Transformer (attention annealing); got "
                f"{type(pl_module.network).__name__}"
            )
        if self.ar and not pl_module.process.next_token_layout:
            raise ValueError(
                "an AR phase needs the next-token layout: process.shift=true (masked) or "
                "input@process.input=posterior process.input.shift=true (gaussian); or phases.ar=0"
            )
        if budget_progress(trainer) is None:
            raise ValueError(
                "phases are shares of the budget: set trainer.max_steps or trainer.max_time"
            )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        progress = budget_progress(trainer)
        if progress is None:
            return
        pl_module.process.set_progress(progress)
        if not (self.ar or self.anneal):
            return  # nothing else to set: no host work on the common path
        pl_module.process.ar_phase = progress < self.ar
        pl_module.network.future_visibility = visibility(progress, self.ar, self.anneal)

    def on_train_end(self, trainer, pl_module) -> None:
        # The trained model is a diffusion model: leave it in its final phase.
        pl_module.process.ar_phase = False
        if hasattr(pl_module.network, "future_visibility"):
            pl_module.network.future_visibility = 1.0
