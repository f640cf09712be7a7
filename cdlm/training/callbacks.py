"""Training callbacks: model export, sample logging and throughput.

Both act at the start of validation, where Lightning's ``EMAWeightAveraging`` (listed before them)
has already swapped the averaged weights in, and at the end of training, after it has copied them
into the model: what they export and sample is always the EMA model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from torch.optim.swa_utils import get_ema_avg_fn

from cdlm.checkpoint import Model, save_checkpoint
from cdlm.evaluation.speed import peak_memory_mb
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


class Throughput(L.Callback):
    """Logs training tokens/s (steady state: the first ``warmup_steps`` steps and validation
    are excluded) and, at the end, peak memory: CUDA's allocator peak on GPU, else the process's
    peak resident set size."""

    def __init__(self, warmup_steps: int = 5) -> None:
        self.warmup_steps = warmup_steps
        self.tokens, self.seconds, self.start = 0, 0.0, 0.0

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


class EMA(WeightAveraging):
    """Lightning's weight averaging with an EMA whose decay warms up (``ema_with_warmup``);
    ``warmup=False`` gives the plain fixed-decay EMA of ``EMAWeightAveraging``."""

    def __init__(self, decay: float = 0.999, warmup: bool = True, **kwargs) -> None:
        avg_fn = ema_with_warmup(decay) if warmup else get_ema_avg_fn(decay)
        super().__init__(avg_fn=avg_fn, **kwargs)


def ema_with_warmup(decay: float = 0.999) -> Callable:
    """An ``avg_fn`` for Lightning's ``WeightAveraging``: EMA whose decay ramps up as
    min(decay, (1 + n) / (10 + n)) over the n updates so far (the warmup of TensorFlow's
    ExponentialMovingAverage with num_updates). A fixed 0.999 would keep most of the random
    initialisation in a run of a few hundred steps; the ramp lets short runs have a useful EMA and
    long runs the full one."""
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"EMA decay must be in [0, 1), got {decay}")

    def avg_fn(averaged: torch.Tensor, current: torch.Tensor, num_averaged) -> torch.Tensor:
        n = float(num_averaged)
        d = min(decay, (1.0 + n) / (10.0 + n))
        return averaged * d + current * (1.0 - d)

    return avg_fn
