"""The rounds of a ``Distillation`` in one place: which round a share of the budget falls in, the
learning rate within a round, and what changes from one round to the next.

``Distillation`` holds a ``RoundPlan`` and starts a round through it; ``callbacks.Rounds`` says
when, from the trainer's progress (STYLE rule 11). This module imports neither: the import-linter
contract ``distillation modules only point down`` keeps the three free of cycles.

Only Lightning's public API: the per-round EMA goes through ``WeightAveraging``'s documented
hooks (``on_train_end`` makes the average the weights, ``on_load_checkpoint`` sets the average
and its count), never its private average model, which an upgrade may rename.
"""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch import nn

from cdlm.training.lr_schedules import warmup_cosine_factor


class RoundEnd(L.Callback):
    """A callback with one more hook, called when a round ends: before the next round starts
    (the student not yet copied into the teacher) and at the end of training."""

    def on_round_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        """Acts on the student of ``module.round`` (a ``Distillation``) at ``module.steps``."""


@dataclass
class RoundPlan:
    """The student's step count in each round (``counts``, each round an equal share of the
    budget), the round in progress (``current``, 0-based) and what a new round changes.

    teacher_each_round: ``previous`` (round k's student teaches round k + 1, Salimans & Ho 2022)
        or ``original`` (the given teacher teaches every round, as in ELF).
    per_round: each round starts from the previous round's EMA weights, with a fresh EMA and
        optimizer state and its own warmup-cosine LR factor (``warmup`` share, ``min_lr`` end).
    """

    counts: list[int]
    teacher_each_round: str = "previous"
    per_round: bool = False
    warmup: float = 0.1
    min_lr: float = 0.1
    current: int = 0

    def __post_init__(self) -> None:
        if self.teacher_each_round not in ("previous", "original"):
            raise ValueError(
                f"teacher_each_round must be previous or original, got {self.teacher_each_round!r}"
            )
        if not 0.0 <= self.warmup < 1.0:
            raise ValueError(f"round_warmup is a share of a round in [0, 1), got {self.warmup}")

    @property
    def steps(self) -> int:
        """The student's step count in the current round."""
        return self.counts[self.current]

    def due(self, progress: float) -> int:
        """The round that ``progress`` (the share of the budget spent, in [0, 1]) falls in."""
        return min(len(self.counts) - 1, int(progress * len(self.counts)))

    def lr_factor(self, progress: float) -> float:
        """The per-round LR factor: warmup then cosine over the current round's budget share."""
        within = min(1.0, max(0.0, progress * len(self.counts) - self.current))
        return warmup_cosine_factor(within, self.warmup, self.min_lr)

    def advance(
        self,
        trainer: L.Trainer,
        module: L.LightningModule,
        teacher: nn.Module,
        student: nn.Module,
        to: int,
    ) -> None:
        """Ends the current round of ``module`` and starts round ``to``: with ``per_round`` the
        EMA weights first become the student (module and EMA average the whole module); every
        ``RoundEnd`` callback acts on that student; with ``teacher_each_round=previous`` its
        weights go into ``teacher``; with ``per_round`` the EMA restarts from them and the
        optimizer state is cleared (the LR factor restarts by itself, ``lr_factor``)."""
        ema = weight_averaging(trainer) if self.per_round else None
        if ema is not None:
            ema.on_train_end(trainer, module)  # documented: copies the average into the module
        end_round(trainer, module)
        if self.teacher_each_round == "previous":
            teacher.load_state_dict(student.state_dict())
        if self.per_round:
            if ema is not None:
                restart_average(ema, trainer, module)
            for optimizer in trainer.optimizers:
                optimizer.state.clear()
        self.current = to


def end_round(trainer: L.Trainer, module: L.LightningModule) -> None:
    """Calls ``on_round_end`` on each ``RoundEnd`` callback of the trainer, in their order."""
    for callback in trainer.callbacks:
        if isinstance(callback, RoundEnd):
            callback.on_round_end(trainer, module)


def weight_averaging(trainer: L.Trainer) -> WeightAveraging | None:
    """The trainer's weight-averaging (EMA) callback, if any."""
    return next((c for c in trainer.callbacks if isinstance(c, WeightAveraging)), None)


def restart_average(ema: WeightAveraging, trainer: L.Trainer, module: L.LightningModule) -> None:
    """Restarts ``ema`` at ``module``'s weights: its average becomes them and its count of
    averaged steps 0, so the next update copies the weights and the EMA's warmup
    (``cdlm.training.ema``) begins again, as at the start of training. The checkpoint hook is
    Lightning's one public way to set the average (it logs that it found
    ``current_model_state``); the module loads its own state back, which changes nothing."""
    state = module.state_dict()
    ema.on_load_checkpoint(
        trainer,
        module,
        {
            "state_dict": state,
            "current_model_state": state,
            "averaging_state": {"n_averaged": torch.zeros((), dtype=torch.long)},
        },
    )
