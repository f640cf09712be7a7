"""The one EMA utility: an averaging function whose decay warms up, used by the training
callback (Lightning's ``WeightAveraging``, whose averaged weights are what gets exported) and
by any module that needs an averaged copy of a network as a target (``averaged_copy``: the
EMA target of consistency distillation, Song et al. 2023)."""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

from cdlm.training.resume import AtEnd
from cdlm.training.scaling import is_sharded


def ema_with_warmup(decay: float = 0.999) -> Callable:
    """An ``avg_fn`` for ``AveragedModel``/``WeightAveraging``: EMA whose decay ramps up as
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


def ema_fn(decay: float, warmup: bool = True) -> Callable:
    """The averaging function for ``decay``: warmed up (``ema_with_warmup``) or fixed."""
    return ema_with_warmup(decay) if warmup else get_ema_avg_fn(decay)


def averaged_copy(module: nn.Module, decay: float, warmup: bool = True) -> AveragedModel:
    """A frozen EMA copy of ``module``, updated by ``copy.update_parameters(module)``."""
    copy = AveragedModel(module, avg_fn=ema_fn(decay, warmup), use_buffers=True)
    copy.requires_grad_(False)
    return copy


class EMA(AtEnd, WeightAveraging):
    """Lightning's weight averaging with ``ema_fn``: an EMA whose decay warms up by default;
    ``warmup=False`` gives the plain fixed-decay EMA of ``EMAWeightAveraging``. The average goes
    into the module at the end of every finished run, a run resumed at its last step too
    (``AtEnd``), before the model is exported."""

    def __init__(self, decay: float = 0.999, warmup: bool = True, **kwargs) -> None:
        super().__init__(avg_fn=ema_fn(decay, warmup), **kwargs)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if is_sharded(trainer):  # the average would be of one shard's views, not the weights
            raise ValueError(
                "callbacks.ema cannot average sharded weights (trainer=fsdp): Lightning's "
                "WeightAveraging keeps a whole copy of the model; trainer=fsdp sets callbacks.ema=null"
            )
        super().setup(trainer, pl_module, stage)

    def at_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        WeightAveraging.on_train_end(self, trainer, pl_module)
