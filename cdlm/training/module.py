"""The LightningModule: a thin loop around ``process.loss(denoiser, tokens)``."""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
import torch
from torch import nn

from cdlm import rng
from cdlm.data.order import global_batch_index
from cdlm.denoiser import Denoiser
from cdlm.evaluation.levels import level_metrics
from cdlm.processes.base import Process
from cdlm.processes.prompts import drop_prompts
from cdlm.training.optim import (
    OptimizerFactory,
    SchedulerFactory,
    check_label_dropout,
    clip_gradients,
    configure_optimization,
    training_labels,
    with_labels,
)


def validation_generator(trainer: L.Trainer, batch_idx: int, device) -> torch.Generator:
    """The noise of a validation batch, keyed on its index in the one-process batching
    (``cdlm.data.order.BatchShards`` deals batches to ranks), so that validation on several
    processes draws what one process draws."""
    index = global_batch_index(batch_idx, trainer.global_rank, trainer.world_size)
    return rng.generator(index, device)


class ValidationMeans:
    """Validation figures as means over every validation sequence of every rank.

    Each batch adds value x batch size; at the epoch's end the sums and the sequence count are
    summed over ranks in float (one all-reduce) and the ratios logged, so several processes log
    the one-process figures. Not Lightning's ``sync_dist`` mean: it keeps the batch counts as
    int64 and floors their average over ranks, which biases the figure whenever the ranks hold
    different numbers of sequences (2% on the tests' 51 validation sequences).
    """

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0

    def update(self, metrics: dict[str, torch.Tensor], n: int) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + v.detach().float() * n
        self.count += n

    def log(self, module: L.LightningModule) -> None:
        if not self.sums:
            return
        names = sorted(self.sums)  # the same order on every rank
        count = torch.tensor(float(self.count), device=module.device)
        totals = torch.stack([self.sums[k] for k in names] + [count])
        totals = module.trainer.strategy.reduce(totals, reduce_op="sum")
        means = {k: totals[i] / totals[-1] for i, k in enumerate(names)}
        # identical on every rank now; sync_dist only keeps Lightning from warning
        module.log("val/loss", means.pop("val/loss"), prog_bar=True, sync_dist=True)
        module.log_dict(means, sync_dist=True)
        self.sums, self.count = {}, 0


class DiffusionLM(L.LightningModule):
    """Trains any process with any network (``conf/module/diffusion.yaml``).

    Args:
        process: owns the time draw, corruption, loss and prior (``cdlm.processes.Process``).
        network: maps (x_t, t, self_cond) to the process's prediction.
        optimizer: partial taking the parameters (Hydra ``_partial_: true``).
        lr_scheduler: optional partial taking the optimizer; stepped every optimizer step.
        label_dropout: for a class-conditional network, the probability that a training
            sequence's label is dropped (classifier-free guidance training). Validation always
            scores the unconditional model, the one comparable with unlabelled baselines.
        prompt_dropout: for prompt→response rows, the probability that a training row's prompt
            is shown at the prior (``cdlm.processes.prompts``): the unconditional branch that
            prompt guidance mixes. Validation scores the response given the prompt.
        eval_times: noise levels at which validation logs CE and token accuracy.
        log_prior: (V,) unigram log-probabilities of the training data; with it, validation also
            logs the no-context readout at each level (``val/base_ce_t*``, ``val/base_acc_t*``)
            and the model's accuracy over it (``val/context_gain_t*``): the diagnostic that shows
            when a model starts using context.
        model_config: the resolved configs that rebuild the model from a checkpoint (written by
            ``cdlm.training.callbacks.ExportModel``).
    """

    def __init__(
        self,
        process: Process,
        network: nn.Module,
        optimizer: OptimizerFactory,
        lr_scheduler: SchedulerFactory | None = None,
        label_dropout: float = 0.1,
        prompt_dropout: float = 0.0,
        eval_times: Sequence[float] = (0.1, 0.5, 0.9),
        log_prior: torch.Tensor | None = None,
        model_config: dict | None = None,
    ) -> None:
        super().__init__()
        self.process, self.network = process, network
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler
        self.eval_times = tuple(eval_times)
        self.label_dropout = check_label_dropout(label_dropout)
        if not 0.0 <= prompt_dropout <= 1.0:
            raise ValueError(f"prompt_dropout must be in [0, 1], got {prompt_dropout}")
        self.prompt_dropout = prompt_dropout
        self.model_config = model_config or {}
        self.register_buffer("log_prior", log_prior, persistent=False)
        self.val_means = ValidationMeans()

    @property
    def denoiser(self) -> Denoiser:
        return self.process.make_denoiser(self.network)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        labels = training_labels(self.network, batch, self.label_dropout)
        batch = drop_prompts(batch, self.prompt_dropout)
        out = self.process.loss(with_labels(self.denoiser, labels), batch)
        self.process.observe(out)  # the one place a learned time sampler sees the losses
        self.log("train/loss", out.loss, prog_bar=True)
        self.log_dict({f"train/{k}": v for k, v in out.metrics.items()})
        return out.loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        # Fixed noise per batch, so validation curves compare checkpoints, not noise draws.
        generator = validation_generator(self.trainer, batch_idx, batch["tokens"].device)
        out = self.process.loss(self.denoiser, batch, generator)
        metrics = {"val/loss": out.loss} | {f"val/{k}": v for k, v in out.metrics.items()}
        for t in self.eval_times if self.process.noise_levels else ():
            ev = self.process.evaluate_at(self.denoiser, batch["tokens"], t, generator)
            m = level_metrics(ev, self.log_prior)
            metrics |= {f"val/ce_t{t:g}": m.ce, f"val/acc_t{t:g}": m.acc}
            if m.baseline_acc is not None:
                metrics |= {
                    f"val/base_ce_t{t:g}": m.baseline_ce,
                    f"val/base_acc_t{t:g}": m.baseline_acc,
                    f"val/context_gain_t{t:g}": m.acc / m.baseline_acc.clamp_min(1e-6),
                }
        self.val_means.update(metrics, len(batch["tokens"]))

    def on_validation_epoch_end(self) -> None:
        self.val_means.log(self)

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ) -> None:
        clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        return configure_optimization(
            self, self.parameters(), self.optimizer_factory, self.scheduler_factory
        )
