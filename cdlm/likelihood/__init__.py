"""Likelihood evaluation of Gaussian embedding diffusion, in bits per token: the VDM diffusion
ELBO (``elbo``) and the probability-flow ODE likelihood (``ode_nll``), both upper bounds on
-log2 p(w) / L for blocks of L tokens. See ``docs/guide/samplers.md``."""

from cdlm.likelihood.elbo import Elbo, elbo
from cdlm.likelihood.ode import FlowDensity, OdeNll, flow_log_likelihood, ode_nll
from cdlm.likelihood.terms import DECODERS, likelihood_denoiser

__all__ = [
    "DECODERS",
    "Elbo",
    "FlowDensity",
    "OdeNll",
    "elbo",
    "flow_log_likelihood",
    "likelihood_denoiser",
    "ode_nll",
]
