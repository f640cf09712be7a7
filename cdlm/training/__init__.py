"""Training: the LightningModule and its callbacks."""

from cdlm.training.lr_schedules import warmup_cosine
from cdlm.training.module import DiffusionLM

__all__ = ["DiffusionLM", "warmup_cosine"]
