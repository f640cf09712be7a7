"""The rounds of a ``Distillation`` as callbacks (STYLE rule 11: schedules over training read the
trainer's progress, the module's hooks change no state).

``Rounds`` moves the module from round to round, each an equal share of the budget; at the end of
every round it calls ``on_round_end`` on each ``RoundEnd`` callback of the trainer, in their
order, with that round's student in place: ``KeepRoundStudents`` writes it to a folder,
``EvaluateRounds`` scores and logs it. ``Distillation.configure_callbacks`` contributes the three
from its config, so ``cdlm-train module=distill_* teacher=PATH`` runs its rounds with the default
callbacks; more ``RoundEnd`` callbacks can come through ``callbacks.``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.utilities import rank_zero_info

from cdlm.model_file import Model, save_model
from cdlm.training.phases import budget_progress

if TYPE_CHECKING:
    from cdlm.distillation.module import Distillation


class RoundEnd(L.Callback):
    """A callback with one more hook, called by ``Rounds`` when a round ends: before the next
    round starts (the student not yet copied into the teacher) and at the end of training."""

    def on_round_end(self, trainer: L.Trainer, module: Distillation) -> None:
        """Acts on the student of ``module.round`` at ``module.steps``."""


class Rounds(L.Callback):
    """Before each training batch, the round its share of the budget falls in (steps or wall
    clock, ``budget_progress``): on entering a later round, ends the current one (with
    ``per_round``, first making the EMA weights the student's), calls every ``RoundEnd``, then,
    for halving methods with ``teacher_each_round=previous``, loads the student's weights into
    the teacher (the student of round k teaches round k + 1); with ``per_round`` the EMA and the
    optimizer state restart. The end of training ends the last round."""

    def on_train_batch_start(self, trainer, pl_module: Distillation, batch, batch_idx) -> None:
        progress = budget_progress(trainer)
        if progress is None:
            raise ValueError("distillation rounds are shares of the budget: set trainer.max_steps")
        counts = pl_module.counts
        wanted = min(len(counts) - 1, int(progress * len(counts)))
        if wanted == pl_module.round and batch_idx + trainer.global_step > 0:
            return
        if wanted != pl_module.round:
            ema = averaging(trainer)
            if pl_module.per_round and ema is not None:
                copy_average(ema, pl_module)
            self.end_round(trainer, pl_module)
            if pl_module.method.halves and pl_module.teacher_each_round == "previous":
                pl_module.teacher.load_state_dict(pl_module.network.state_dict())
            if pl_module.per_round:
                if ema is not None:
                    ema._average_model.n_averaged.zero_()  # restarts from the current weights
                for optimizer in trainer.optimizers:
                    optimizer.state.clear()
            pl_module.round = wanted
        method = pl_module.method
        teacher_steps = (
            pl_module.steps * method.teacher_steps_per_step
            if method.halves
            else method.solver_steps
        )
        rank_zero_info(
            f"distillation round {pl_module.round + 1}/{len(counts)} ({method.name}): "
            f"teacher {teacher_steps} steps -> student {pl_module.steps} steps"
        )

    def on_train_end(self, trainer: L.Trainer, pl_module: Distillation) -> None:
        self.end_round(trainer, pl_module)

    @staticmethod
    def end_round(trainer: L.Trainer, module: Distillation) -> None:
        for callback in trainer.callbacks:
            if isinstance(callback, RoundEnd):
                callback.on_round_end(trainer, module)


def averaging(trainer: L.Trainer) -> WeightAveraging | None:
    """The trainer's weight-averaging (EMA) callback, once it holds an average."""
    found = next((c for c in trainer.callbacks if isinstance(c, WeightAveraging)), None)
    return found if found is not None and found._average_model is not None else None


def copy_average(ema: WeightAveraging, module: L.LightningModule) -> None:
    """Loads the EMA's averaged parameters and buffers into ``module`` (Lightning keeps no public
    accessor; ``WeightAveraging`` averages the whole module)."""
    average = ema._average_model.module
    pairs = zip(
        itertools.chain(average.parameters(), average.buffers()),
        itertools.chain(module.parameters(), module.buffers()),
        strict=True,
    )
    with torch.no_grad():
        for avg, current in pairs:
            current.copy_(avg)


class KeepRoundStudents(RoundEnd):
    """Writes each round's student to ``folder/round<k>_<steps>steps.safetensors`` (rank 0): the
    students of every step count, for tables (``module.round_dir``)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def on_round_end(self, trainer: L.Trainer, module: Distillation) -> None:
        if trainer.global_rank != 0:
            return
        name = f"round{module.round + 1}_{module.steps}steps.safetensors"
        tokenizer = trainer.datamodule.tokenizer
        save_model(
            self.folder / name,
            Model(module.process, module.network, tokenizer, module.model_config),
        )


class EvaluateRounds(RoundEnd):
    """Scores each round's student with ``evaluate(module, steps) -> metrics``
    (``cdlm.distillation.report.RoundEval``, ``module.round_eval``) and logs the metrics as
    ``round/<name>`` beside the round number, to every logger and to the console."""

    def __init__(self, evaluate: Callable[[L.LightningModule, int], dict[str, float]]) -> None:
        self.evaluate = evaluate

    def on_round_end(self, trainer: L.Trainer, module: Distillation) -> None:
        metrics = self.evaluate(module, module.steps)
        metrics = {f"round/{k}": v for k, v in metrics.items()} | {"round": module.round + 1}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        rank_zero_info(
            f"round {module.round + 1} ({module.steps} steps): "
            + ", ".join(f"{k}={v:.3f}" for k, v in metrics.items() if k != "round")
        )
