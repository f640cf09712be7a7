"""A training progress bar that counts the budget, not epochs.

Lightning's bars say "Epoch 1/-2" when a run is bounded by steps or by wall clock
(``max_epochs=-1``), and fill once per epoch. This one fills against the budget the run has:
``step 412/2000``, or with ``trainer.max_time`` the time used of the time budget
(``step 412 · 3:12 of 10:00``); validation keeps Lightning's own bar.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar, Timer, TQDMProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from cdlm.progress import duration


def budget(trainer: L.Trainer) -> tuple[float, float | None, str]:
    """(done, total, description) of the run's budget: steps when ``max_steps`` bounds it, else
    seconds of the ``max_time`` timer, else steps without a total."""
    step = trainer.global_step
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return step, trainer.max_steps, f"step {step}/{trainer.max_steps}"
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    if timer is not None and timer.time_remaining("train") is not None:
        used = timer.time_elapsed("train")
        total = used + timer.time_remaining("train")
        return used, total, f"step {step} · {duration(used)} of {duration(total)}"
    return step, None, f"step {step}"


class _Budget:
    """What both bars share: the description and fill from ``budget``."""

    def _get_train_description(self, current_epoch: int) -> str:
        return budget(self.trainer)[2]


class RichBudgetBar(_Budget, RichProgressBar):
    """Rich's bar, filled against the run's budget."""

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        super().on_train_batch_end(trainer, *args, **kwargs)
        if self.progress is None or self.train_progress_bar_id is None or not self.is_enabled:
            return
        done, total, text = budget(trainer)
        extent = {} if total is None else {"total": total}  # no budget: keep the epoch's total
        self.progress.update(self.train_progress_bar_id, completed=done, description=text, **extent)
        self.refresh()


class TQDMBudgetBar(_Budget, TQDMProgressBar):
    """tqdm's bar, filled against the run's budget (when rich is not installed)."""

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_epoch_start(trainer, *args)
        self.train_progress_bar.set_description(budget(trainer)[2])

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        super().on_train_batch_end(trainer, *args, **kwargs)
        done, total, text = budget(trainer)
        bar = self.train_progress_bar
        bar.total, bar.n = total, round(done, 1)
        bar.set_description(text, refresh=True)


def BudgetProgressBar(enabled: bool = True) -> L.Callback:  # noqa: N802 (picks a class)
    """The rich bar where rich is installed (Lightning's own default then), else tqdm's;
    ``enabled`` false (``trainer.enable_progress_bar=false``): a callback that does nothing,
    since Lightning refuses a progress bar callback beside that flag."""
    if not enabled:
        return L.Callback()
    return RichBudgetBar() if _RICH_AVAILABLE else TQDMBudgetBar()
