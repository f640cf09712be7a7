"""The rounds of a ``Distillation`` as callbacks (STYLE rule 11: schedules over training read the
trainer's progress, the module's hooks change no state); what a round changes is
``cdlm.distillation.rounds``.

``Rounds`` starts each round when its share of the budget comes, through the module's
``start_round``; a round's end calls ``on_round_end`` on each ``RoundEnd`` callback of the trainer,
in their order, with that round's student in place: ``KeepRoundStudents`` writes it to a folder,
``EvaluateRounds`` scores and logs it. ``Distillation.configure_callbacks`` contributes the three
from its config, so ``cdlm-train module=distill_* teacher=PATH`` runs its rounds with the default
callbacks; more ``RoundEnd`` callbacks can come through ``callbacks.``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from cdlm.distillation.rounds import RoundEnd
from cdlm.model_file import Model, save_model
from cdlm.training.phases import budget_progress


class Rounds(L.Callback):
    """Before each training batch, the round its share of the budget falls in (steps or wall
    clock, ``budget_progress``): on entering a later round, the module's ``start_round`` ends the
    current one and starts it (``rounds.RoundPlan.advance``). The end of training ends the last
    round. Each round's start is logged."""

    def on_train_batch_start(self, trainer, pl_module: L.LightningModule, batch, batch_idx) -> None:
        progress = budget_progress(trainer)
        if progress is None:
            raise ValueError("distillation rounds are shares of the budget: set trainer.max_steps")
        due = pl_module.rounds.due(progress)
        if due == pl_module.round and batch_idx + trainer.global_step > 0:
            return
        if due != pl_module.round:
            pl_module.start_round(due)
        method = pl_module.method
        teacher_steps = (
            pl_module.steps * method.teacher_steps_per_step
            if method.halves
            else method.solver_steps
        )
        rank_zero_info(
            f"distillation round {pl_module.round + 1}/{len(pl_module.counts)} ({method.name}): "
            f"teacher {teacher_steps} steps -> student {pl_module.steps} steps"
        )

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.end_round()


class KeepRoundStudents(RoundEnd):
    """Writes each round's student to ``folder/round<k>_<steps>steps.safetensors`` (rank 0): the
    students of every step count, for tables (``module.round_dir``)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def on_round_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
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

    def on_round_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        metrics = self.evaluate(module, module.steps)
        metrics = {f"round/{k}": v for k, v in metrics.items()} | {"round": module.round + 1}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        rank_zero_info(
            f"round {module.round + 1} ({module.steps} steps): "
            + ", ".join(f"{k}={v:.3f}" for k, v in metrics.items() if k != "round")
        )
