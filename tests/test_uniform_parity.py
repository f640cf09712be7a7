"""Parity of process=uniform and sampler=duo_ancestral with the Duo reference, in float64.

Reference: github.com/s-sahoo/duo at commit 7c9b498f5b717de064d6fad7e2509c866e6cb620
(``algo.py``: ``DUO_BASE.nll_per_token``, ``DUO_BASE._posterior_from_x0``,
``DUO._gamma_to_alphat_integral``; ``utils.py``: ``_discrete_prob_map``,
``_discrete_prob_grad``; ``trainer_base.py``: ``Diffusion._ancestral_update``). The reference's
formulas are re-derived below in plain torch / scipy, in the reference's own variables, and
compared with cdlm's functions on fixed inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import integrate
from scipy.stats import norm

from cdlm.processes.duality import DualSchedule, uniform_alpha, uniform_dalpha_dlogsnr
from cdlm.processes.uniform import uniform_nelbo
from cdlm.samplers.base import sample_categorical
from cdlm.samplers.uniform import step_posterior, uniform_posterior
from cdlm.schedules import CosineSchedule

F64 = torch.float64
B, L, V = 3, 5, 7


def fixed_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(B, L, V, generator=g, dtype=F64)
    x0 = torch.randint(0, V, (B, L), generator=g)
    x_t = torch.where(
        torch.rand(B, L, generator=g) < 0.5, x0, torch.randint(0, V, (B, L), generator=g)
    )
    return logits, x0, x_t


def reference_nll_per_token(log_x_theta, xt, x0, alpha_t, dalpha_t, vocab):
    """The reference's uniform-state NELBO per token (``DUO_BASE.nll_per_token``), its terms
    as written there; alpha_t, dalpha_t: (B, 1)."""
    x_reconst = log_x_theta.exp()
    x_bar_theta = vocab * alpha_t[:, :, None] * x_reconst + 1 - alpha_t[:, :, None]
    coeff = dalpha_t / (vocab * alpha_t)
    x_eq_xt = (x0 == xt).double()
    x_neq_xt = 1 - x_eq_xt
    xbar_xt = (1 - alpha_t) + vocab * alpha_t * x_eq_xt
    xbar_theta_xt = torch.gather(x_bar_theta, -1, xt[..., None]).squeeze(-1)
    xbar_theta_x = torch.gather(x_bar_theta, -1, x0[..., None]).squeeze(-1)
    term1 = vocab * (1 / xbar_xt - 1 / xbar_theta_xt)
    const = (1 - alpha_t) / (vocab * alpha_t + 1 - alpha_t)
    term2_coefs = x_eq_xt * const + x_neq_xt
    term2_offset = ((vocab - 1) * const * x_eq_xt - (1 / const) * x_neq_xt) * const.log()
    term2_theta = -term2_coefs * (x_bar_theta.log().sum(-1) - vocab * xbar_theta_xt.log())
    term2_theta = (
        term2_theta
        - vocab * alpha_t / (1 - alpha_t) * (xbar_theta_x.log() - xbar_theta_xt.log()) * x_neq_xt
    )
    return coeff * (term1 - (term2_theta + term2_offset))


@pytest.mark.parametrize("alpha", [0.03, 0.4, 0.97])
def test_loss_matches_reference(alpha):
    logits, x0, x_t = fixed_inputs()
    logp = logits.log_softmax(-1)
    a = torch.full((B, 1), alpha, dtype=F64)
    da = torch.full((B, 1), -0.999, dtype=F64)  # log-linear, eps = 1e-3
    ref = reference_nll_per_token(logp, x_t, x0, a, da, V)
    ours = uniform_nelbo(logp, x_t, x0, a[:, 0], da[:, 0])
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    assert (ours >= -1e-12).all()
    exact = torch.full_like(logp, -torch.inf).scatter_(-1, x0[..., None], 0.0).clamp_min(-700)
    torch.testing.assert_close(
        uniform_nelbo(exact, x_t, x0, a[:, 0], da[:, 0]),
        torch.zeros(B, L, dtype=F64),
        atol=1e-10,
        rtol=0,
    )


def reference_alpha(gamma: float, vocab: int) -> tuple[float, float]:
    """The reference's usdm alpha_t at gamma = -logsnr (``Integral`` tabulates p_t by ``quad``
    of ``_discrete_prob_map``; alpha = (V p_t - 1) / (V - 1)) and d p_t / d gamma
    (``_discrete_prob_grad``)."""
    snr_sqrt = np.exp(-gamma / 2)

    def value(x):
        return norm.pdf(x, loc=snr_sqrt) * norm.cdf(x) ** (vocab - 1)

    def grad(x):
        return -0.5 * snr_sqrt * (x - snr_sqrt) * value(x)

    pt = integrate.quad(value, -np.inf, np.inf, epsabs=1e-13, epsrel=1e-12, limit=200)[0]
    dpt = integrate.quad(grad, -np.inf, np.inf, epsabs=1e-13, epsrel=1e-12, limit=200)[0]
    return (vocab * pt - 1) / (vocab - 1), dpt


@pytest.mark.parametrize("vocab", [2, 50, 50257])
@pytest.mark.parametrize("gamma", [-5.0, -3.5, -2.6, -1.75, -1.0, 2.0])
def test_schedule_map_matches_reference(vocab, gamma):
    want, dpt = reference_alpha(gamma, vocab)
    logsnr = torch.tensor([-gamma], dtype=F64)
    assert float(uniform_alpha(logsnr, vocab)) == pytest.approx(want, rel=1e-9, abs=1e-12)
    # d alpha / d logsnr = -V / (V - 1) d p_t / d gamma
    slope = float(uniform_dalpha_dlogsnr(logsnr, vocab))
    assert slope == pytest.approx(-vocab / (vocab - 1) * dpt, rel=1e-8, abs=1e-12)


def test_dual_schedule_derivative():
    s = DualSchedule(CosineSchedule(-6.0, 6.0), 100)
    t = torch.tensor([0.2, 0.5, 0.8], dtype=F64)
    h = 1e-5
    fd = (s.keep(t + h) - s.keep(t - h)) / (2 * h)
    torch.testing.assert_close(s.dkeep(t), fd, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(s.time_of(s.keep(t)), t, rtol=1e-9, atol=1e-9)


def reference_posterior(x0, xt, alpha_s, alpha_t, vocab):
    """``DUO_BASE._posterior_from_x0`` as written there; alpha_s, alpha_t: (B, 1, 1)."""
    alpha_ts = alpha_t / alpha_s
    d_alpha = alpha_s - alpha_t
    xt_one_hot = torch.nn.functional.one_hot(xt, vocab).double()
    return (
        alpha_t * vocab * x0 * xt_one_hot
        + (alpha_ts - alpha_t) * xt_one_hot
        + d_alpha * x0
        + (1 - alpha_ts) * (1 - alpha_s) / vocab
    ) / (alpha_t * vocab * torch.gather(x0, -1, xt[..., None]) + (1 - alpha_t))


def test_one_ancestral_step_matches_reference():
    logits, _, x_t = fixed_inputs(1)
    p = logits.softmax(-1)
    a_t, a_s = torch.tensor([0.2, 0.5, 0.9], dtype=F64), torch.tensor([0.3, 0.6, 0.95], dtype=F64)
    ref = reference_posterior(p, x_t, a_s.view(-1, 1, 1), a_t.view(-1, 1, 1), V)
    ours = uniform_posterior(p, x_t, a_s, a_t)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(ours.sum(-1), torch.ones(B, L, dtype=F64))
    # the draw: Gumbel-max over the same uniforms on the reference posterior
    drawn = step_posterior(x_t, logits.log_softmax(-1), a_s, a_t, torch.Generator().manual_seed(3))
    torch.testing.assert_close(
        drawn, sample_categorical(ref.log(), torch.Generator().manual_seed(3)), rtol=0, atol=0
    )
