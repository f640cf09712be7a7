"""Samplers: small functions over a denoiser, one shared contract (see ``base``)."""

from cdlm.samplers.base import SAMPLERS, SampleOutput, StepInfo, check_compatible, uniform_grid
from cdlm.samplers.gaussian import sample_ddim, sample_ddpm

__all__ = [
    "SAMPLERS",
    "SampleOutput",
    "StepInfo",
    "check_compatible",
    "sample_ddim",
    "sample_ddpm",
    "uniform_grid",
]
