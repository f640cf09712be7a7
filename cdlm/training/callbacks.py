"""Training callbacks: model export and sample logging.

Both act at the start of validation, where Lightning's ``EMAWeightAveraging`` (listed before them)
has already swapped the averaged weights in, and at the end of training, after it has copied them
into the model: what they export and sample is always the EMA model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from cdlm.checkpoint import Model, save_checkpoint
from cdlm.generate import generate


class ExportModel(L.Callback):
    """Writes the self-contained ``.safetensors`` model (atomically) at each validation and at
    the end of training. ``config`` holds the process/network configs that rebuild the model."""

    def __init__(self, path: str, config: dict[str, Any], tokenizer: Any) -> None:
        self.path, self.config, self.tokenizer = Path(path), config, tokenizer

    @rank_zero_only
    def _export(self, pl_module: L.LightningModule) -> None:
        save_checkpoint(
            self.path, Model(pl_module.process, pl_module.network, self.tokenizer, self.config)
        )

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._export(pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._export(pl_module)
        rank_zero_info(f"model written to {self.path}")


class LogSamples(L.Callback):
    """At the first validation after every ``every_n_steps`` steps, and at the end of training,
    draws a few samples and logs them as a W&B table (and to the console), so a run's progress can
    be read, not just its loss. ``sampler`` is any sampler fitting the process."""

    def __init__(
        self,
        tokenizer: Any,
        seq_len: int,
        sampler: Callable,
        every_n_steps: int = 500,
        num_samples: int = 4,
        steps: int = 32,
    ) -> None:
        self.tokenizer, self.seq_len, self.sampler = tokenizer, seq_len, sampler
        self.every, self.num_samples, self.steps = every_n_steps, num_samples, steps
        self.last_step = 0

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.num_samples < 1 or trainer.global_step == self.last_step:
            return
        self.last_step = trainer.global_step
        gen = generate(
            pl_module.process,
            pl_module.network,
            self.tokenizer,
            self.sampler,
            steps=self.steps,
            num_samples=self.num_samples,
            seq_len=self.seq_len,
        )
        rows = [[trainer.global_step, s.text] for s in gen.samples]
        for _, text in rows:
            rank_zero_info(f"[step {trainer.global_step}] {text[:300]}")
        log_text = getattr(trainer.logger, "log_text", None)
        if log_text is not None:
            log_text(key="samples", columns=["step", "text"], data=rows)

    @rank_zero_only
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        due = self.every > 0 and trainer.global_step - self.last_step >= self.every
        if not trainer.sanity_checking and due:
            self._log(trainer, pl_module)

    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, pl_module)
