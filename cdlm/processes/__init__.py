"""Noise processes: each owns its time draw, corruption, loss, prior and decoding, behind the
``Process`` protocol (``cdlm.processes.base``)."""

from cdlm.processes.autoregressive import AutoregressiveProcess
from cdlm.processes.base import Corrupted, LevelEval, LossOutput, Process
from cdlm.processes.block import BlockProcess
from cdlm.processes.gaussian import GaussianProcess
from cdlm.processes.masked import MaskedProcess
from cdlm.processes.uniform import UniformProcess

__all__ = [
    "AutoregressiveProcess",
    "BlockProcess",
    "Corrupted",
    "GaussianProcess",
    "LevelEval",
    "LossOutput",
    "MaskedProcess",
    "Process",
    "UniformProcess",
]
