"""Noise processes: each owns its corruption, loss, prior and decoding."""

from cdlm.processes.base import LevelMetrics, LossOutput
from cdlm.processes.gaussian import GaussianProcess

__all__ = ["GaussianProcess", "LevelMetrics", "LossOutput"]
