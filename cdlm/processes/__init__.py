"""Noise processes: each owns its corruption, loss, prior and decoding."""

from cdlm.processes.autoregressive import AutoregressiveProcess
from cdlm.processes.base import LevelMetrics, LossOutput
from cdlm.processes.gaussian import GaussianProcess
from cdlm.processes.masked import MaskedProcess

__all__ = [
    "AutoregressiveProcess",
    "GaussianProcess",
    "LevelMetrics",
    "LossOutput",
    "MaskedProcess",
]
