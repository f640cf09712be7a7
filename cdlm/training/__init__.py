"""Training: the LightningModule and its callbacks."""

from cdlm.training.module import DiffusionLM, warmup_cosine

__all__ = ["DiffusionLM", "warmup_cosine"]
