"""What every cdlm LightningModule shares: the optimizer with its per-step schedule, and the class
labels a training batch conditions on. ``DiffusionLM`` and ``Distillation`` both call these, so a
guard or a dropout rule is written once."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import lightning as L
import torch
from torch import Tensor, nn

from cdlm.denoiser import Denoiser
from cdlm.guidance import WithLabel, drop_labels
from cdlm.training.lr_schedules import WallclockLR
from cdlm.training.scaling import is_sharded

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


def configure_optimization(
    module: L.LightningModule,
    parameters: Iterable[nn.Parameter],
    optimizer: OptimizerFactory,
    lr_scheduler: SchedulerFactory | None = None,
) -> torch.optim.Optimizer | dict:
    """What ``configure_optimizers`` returns: ``optimizer`` over ``parameters`` and, if given,
    ``lr_scheduler`` stepped every optimizer step. A wall-clock schedule is refused on several
    processes: each would read its own clock, and learning rates, then replicas, would drift."""
    built = optimizer(parameters)
    if lr_scheduler is None:
        return built
    scheduler = lr_scheduler(built)
    if isinstance(scheduler, WallclockLR) and module.trainer.world_size > 1:
        raise ValueError(
            "lr_scheduler=wallclock_cosine is for single-process runs; with several devices "
            "use lr_scheduler=warmup_cosine and a step budget (trainer.max_steps)"
        )
    return {"optimizer": built, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def clip_gradients(
    module: L.LightningModule,
    optimizer: torch.optim.Optimizer,
    value: float | None,
    algorithm: str | None,
) -> None:
    """``configure_gradient_clipping`` of both modules: Lightning's clipping, except by norm
    under FSDP, whose precision plugin refuses it (seen on a GPU, docs/results/gpu.md); there the
    sharded root module clips the norm over all shards itself (``clip_grad_norm_``)."""
    if value and (algorithm or "norm") == "norm" and is_sharded(module.trainer):
        module.trainer.model.clip_grad_norm_(value)
        return
    module.clip_gradients(optimizer, value, algorithm)


def check_label_dropout(p: float) -> float:
    """``p`` if it is a probability, else a ValueError that names the option."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"label_dropout must be in [0, 1], got {p}")
    return p


def training_labels(network: nn.Module, batch: dict[str, Tensor], dropout: float) -> Tensor | None:
    """The labels (B,) a training batch conditions on, each dropped with probability
    ``dropout`` (classifier-free guidance training); None for an unconditional network. Drawn
    once per batch, so that every denoiser bound to them (a student and its teacher) sees the
    same ones."""
    if getattr(network, "num_classes", 0) <= 0:
        return None
    return drop_labels(batch["label"], dropout)


def with_labels(denoiser: Denoiser | None, labels: Tensor | None) -> Denoiser | None:
    """``denoiser`` bound to ``labels`` (``training_labels``); as it is when either is None."""
    if denoiser is None or labels is None:
        return denoiser
    return WithLabel(denoiser, labels)
