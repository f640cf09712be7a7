"""The LightningModule: a thin loop around ``process.loss(denoiser, tokens)``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import lightning as L
import torch
from torch import nn

from cdlm import rng
from cdlm.data.order import global_batch_index
from cdlm.denoiser import Denoiser
from cdlm.evaluation.levels import level_metrics
from cdlm.guidance import WithLabel, drop_labels
from cdlm.processes.base import Process


def _cosine(progress: float, min_ratio: float) -> float:
    """Cosine decay from 1 at progress 0 to ``min_ratio`` at progress >= 1."""
    progress = min(1.0, progress)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_cosine(
    optimizer: torch.optim.Optimizer,
    warmup_steps: float,
    total_steps: int,
    min_ratio: float = 0.1,
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over ``warmup_steps``, then cosine decay to ``min_ratio`` of the peak at
    ``total_steps``. Both are in optimizer steps, so a short budget gets a short schedule;
    ``warmup_steps`` < 1 is a fraction of ``total_steps``."""
    if total_steps is None or total_steps < 1:
        raise ValueError(
            f"warmup_cosine needs a step budget (trainer.max_steps >= 1), got {total_steps}; "
            "for a time budget use lr_scheduler=wallclock_cosine"
        )
    warmup = max(1, round(warmup_steps * total_steps if warmup_steps < 1 else warmup_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return _cosine((step - warmup) / max(1, total_steps - warmup), min_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def parse_duration(budget: str | float) -> float:
    """Seconds from a number or Lightning's ``max_time`` string "DD:HH:MM:SS"."""
    if budget is None:
        raise ValueError("wallclock_cosine needs a time budget: set trainer.max_time")
    if isinstance(budget, int | float):
        return float(budget)
    try:
        days, hours, minutes, seconds = (float(p) for p in str(budget).split(":"))
    except ValueError:
        raise ValueError(f"budget must be seconds or 'DD:HH:MM:SS', got {budget!r}") from None
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


class WallclockLR(torch.optim.lr_scheduler.LambdaLR):
    """A ``LambdaLR`` whose factor is a function of the wall clock spent, which it keeps in its
    ``state_dict``: a resumed run continues the schedule where the checkpoint left it instead
    of restarting its clock (Lightning saves and restores scheduler states)."""

    def __init__(self, optimizer, factor: Callable[[float], float], clock: Callable[[], float]):
        self.clock, self.start, self.offset = clock, clock(), 0.0
        super().__init__(optimizer, lambda step: factor(self.elapsed()))

    def elapsed(self) -> float:
        """Seconds of training so far, over every run this schedule was resumed through."""
        return self.offset + self.clock() - self.start

    def state_dict(self) -> dict:
        # this process's clock readings mean nothing to the next one: only the time spent is kept
        skip = ("clock", "start", "offset")
        state = {k: v for k, v in super().state_dict().items() if k not in skip}
        return state | {"elapsed": self.elapsed()}

    def load_state_dict(self, state_dict: dict) -> None:
        state = dict(state_dict)
        elapsed = state.pop("elapsed", 0.0)
        super().load_state_dict(state)
        self.offset, self.start = elapsed, self.clock()


def wallclock_cosine(
    optimizer: torch.optim.Optimizer,
    budget: str | float,
    warmup: float = 0.1,
    min_ratio: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
) -> WallclockLR:
    """Warmup then cosine decay over a wall-clock ``budget`` (usually ``trainer.max_time``)
    instead of a step count: under a fixed time budget every process, whatever its speed, gets a
    complete schedule that ends when training is stopped. ``warmup`` is a share of the budget.
    The clock starts when the optimizer is configured (the start of fit) and, on resume,
    continues from the time the checkpoint recorded."""
    if not 0.0 <= warmup < 1.0:
        raise ValueError(f"warmup is a share of the budget in [0, 1), got {warmup}")
    seconds = parse_duration(budget)
    if seconds <= 0:
        raise ValueError(f"budget must be > 0 seconds, got {budget!r}")

    def factor(elapsed: float) -> float:
        progress = elapsed / seconds
        if progress < warmup:
            return max(progress, 1e-3) / warmup  # warmup > 0 here
        return _cosine((progress - warmup) / (1.0 - warmup), min_ratio)

    return WallclockLR(optimizer, factor, clock)


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
        optimizer: Callable[..., torch.optim.Optimizer],
        lr_scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler] | None = None,
        label_dropout: float = 0.1,
        eval_times: Sequence[float] = (0.1, 0.5, 0.9),
        log_prior: torch.Tensor | None = None,
        model_config: dict | None = None,
    ) -> None:
        super().__init__()
        if not 0.0 <= label_dropout <= 1.0:
            raise ValueError(f"label_dropout must be in [0, 1], got {label_dropout}")
        self.process, self.network = process, network
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler
        self.eval_times = tuple(eval_times)
        self.label_dropout = label_dropout
        self.model_config = model_config or {}
        self.register_buffer("log_prior", log_prior, persistent=False)
        self.val_means = ValidationMeans()

    @property
    def denoiser(self) -> Denoiser:
        return self.process.make_denoiser(self.network)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        denoiser = self.denoiser
        if getattr(self.network, "num_classes", 0) > 0:
            denoiser = WithLabel(denoiser, drop_labels(batch["label"], self.label_dropout))
        out = self.process.loss(denoiser, batch)
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

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        if getattr(self.scheduler_factory, "func", None) is wallclock_cosine and (
            self.trainer.world_size > 1
        ):
            # Each process would read its own clock: learning rates, then replicas, would drift.
            raise ValueError(
                "lr_scheduler=wallclock_cosine is for single-process runs; with several devices "
                "use lr_scheduler=warmup_cosine and a step budget (trainer.max_steps)"
            )
        scheduler = self.scheduler_factory(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }
