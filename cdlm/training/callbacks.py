"""Training callbacks: model export, sample logging and throughput (conf/callbacks/).

Export and sample logging act at the start of validation, where the EMA callback
(``cdlm.training.ema.EMA``, listed before them) has already swapped the averaged weights in, and
at the end of training, after it has copied them into the model: what they export and sample is
always the EMA model. They read the tokenizer from the datamodule and the model's configs from
the LightningModule (``model_config``), so they are built from config like any callback.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from cdlm.evaluation.speed import peak_memory_mb
from cdlm.generation import Plan, default_sampler, generate
from cdlm.model_file import Model, save_model
from cdlm.training.resume import AtEnd, stop_if_terminated, weights_finite
from cdlm.training.scaling import batch_report, whole_model


class ExportModel(AtEnd):
    """Writes the self-contained ``.safetensors`` model (atomically, once, from rank 0; gathered
    first when the weights are sharded) at each validation and at the end of training: the
    module's process and network, the datamodule's tokenizer, and ``pl_module.model_config``
    (the configs that rebuild the model). Weights that are not all finite are never written: the
    last good file stays."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def _export(self, trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
        process, network = whole_model(trainer, pl_module)  # every rank: a gather when sharded
        if process is None:
            return False
        if not (weights_finite(process) and weights_finite(network)):
            rank_zero_warn(f"non-finite weights: {self.path} not written, the previous one stays")
            return False
        tokenizer = trainer.datamodule.tokenizer
        save_model(self.path, Model(process, network, tokenizer, pl_module.model_config))
        return True

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._export(trainer, pl_module)

    def at_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._export(trainer, pl_module):
            rank_zero_info(f"model written to {self.path}")


class LogSamples(L.Callback):
    """At the first validation after every ``every_n_steps`` steps, and at the end of training,
    draws a few samples of the datamodule's sequence length and logs them as a W&B table (and to
    the console), so a run's progress can be read, not just its loss. ``sampler``: any sampler
    fitting the process (None: the process's default)."""

    def __init__(
        self,
        sampler: Callable | None = None,
        every_n_steps: int = 500,
        num_samples: int = 4,
        steps: int = 32,
    ) -> None:
        self.sampler = sampler
        self.every, self.num_samples, self.steps = every_n_steps, num_samples, steps
        self.last_step = 0

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.num_samples < 1 or trainer.global_step == self.last_step:
            return
        stop_if_terminated(trainer)
        self.last_step = trainer.global_step
        process, network = whole_model(trainer, pl_module)  # every rank: a gather when sharded
        if process is None:
            return
        data = trainer.datamodule
        model = Model(
            process.to(pl_module.device), network.to(pl_module.device), data.tokenizer, {}
        )
        plan = Plan(num_samples=self.num_samples, seq_len=data.seq_len, steps=self.steps)
        gen = generate(model, self.sampler or default_sampler(process), plan)
        rows = [[trainer.global_step, s.text] for s in gen.samples]
        for _, text in rows:
            rank_zero_info(f"[step {trainer.global_step}] {text[:300]}")
        log_text = getattr(trainer.logger, "log_text", None)
        if log_text is not None:
            log_text(key="samples", columns=["step", "text"], data=rows)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        due = self.every > 0 and trainer.global_step - self.last_step >= self.every
        if not trainer.sanity_checking and due:
            self._log(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, pl_module)


class Throughput(L.Callback):
    """Logs training tokens/s (steady state: the first ``warmup_steps`` steps and validation
    are excluded) and, at the end, peak memory: CUDA's allocator peak on GPU, else the process's
    peak resident set size."""

    def __init__(self, warmup_steps: int = 5) -> None:
        self.warmup_steps = warmup_steps
        self.tokens, self.seconds, self.start = 0, 0.0, 0.0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        data = trainer.datamodule
        report = batch_report(trainer, data.batch_size, data.seq_len)
        for logger in trainer.loggers:
            logger.log_hyperparams(report)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step <= self.warmup_steps:
            return
        self.tokens += batch["tokens"].numel() * trainer.world_size
        self.seconds += time.perf_counter() - self.start
        pl_module.log("train/tokens_per_sec", self.tokens / self.seconds)

    def on_train_end(self, trainer, pl_module) -> None:
        metrics = {"train/peak_memory_mb": peak_memory_mb(pl_module.device)}
        if self.seconds:
            metrics["train/tokens_per_sec"] = self.tokens / self.seconds
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        rank_zero_info(", ".join(f"{k}={v:.1f}" for k, v in metrics.items()))
