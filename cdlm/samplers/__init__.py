"""Samplers: small functions over a denoiser, one shared contract (see ``base``)."""

from cdlm.samplers import autoregressive, masked, remdm, speculative, uniform  # noqa: F401
from cdlm.samplers.adaptive import sample_adaptive
from cdlm.samplers.base import SAMPLERS, SampleOutput, StepInfo, check_compatible
from cdlm.samplers.gaussian import sample_ddim, sample_ddpm, sample_rolling
from cdlm.samplers.grids import GRIDS, karras_grid, logsnr_grid, make_grid, uniform_grid
from cdlm.samplers.hybrid import sample_hybrid
from cdlm.samplers.ode import sample_dpmpp_2m, sample_euler, sample_heun
from cdlm.samplers.sde import sample_consistency, sample_euler_maruyama

__all__ = [
    "GRIDS",
    "SAMPLERS",
    "SampleOutput",
    "StepInfo",
    "check_compatible",
    "karras_grid",
    "logsnr_grid",
    "make_grid",
    "sample_adaptive",
    "sample_consistency",
    "sample_ddim",
    "sample_ddpm",
    "sample_dpmpp_2m",
    "sample_euler",
    "sample_euler_maruyama",
    "sample_heun",
    "sample_hybrid",
    "sample_rolling",
    "uniform_grid",
]
