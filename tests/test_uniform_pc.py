"""Parity of sampler=duo_psi with the Psi-samplers of the Duo reference, in float64.

Reference: github.com/s-sahoo/duo at commit 7c9b498f5b717de064d6fad7e2509c866e6cb620
(``trainer_base.py``: ``Diffusion._psi_update``, ``Diffusion._mode_to_psi_kappas``,
``UniformState._forward_process``; ``algo.py``: ``DUO_BASE._posterior_from_x0``), the code of
Deschenaux, Gulcehre & Sahoo 2026 ("The Diffusion Duality, Chapter II"). Its formulas are
re-derived below in plain torch, in the reference's own variables, and compared with cdlm's
functions on fixed logits and fixed uniforms: one predictor step (kappa = 1), one corrector step
(kappa = 0), a mixture, and the kappa of each ReMDM-style mode.
"""

from __future__ import annotations

import pytest
import torch

from cdlm.samplers.base import sample_categorical
from cdlm.samplers.uniform import psi_kappa, psi_posterior, step_posterior

F64 = torch.float64
B, L, V = 3, 5, 7


def fixed_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(B, L, V, generator=g, dtype=F64)
    return logits, torch.randint(0, V, (B, L), generator=g)


def reference_posterior(x0, xt, alpha_s, alpha_t):
    """``DUO_BASE._posterior_from_x0``: the closed form, numerator over denominator;
    alpha_s, alpha_t: (B, 1, 1)."""
    one_hot = torch.nn.functional.one_hot(xt, V).double()
    ratio = alpha_t / alpha_s
    top = (
        alpha_t * V * x0 * one_hot
        + (ratio - alpha_t) * one_hot
        + (alpha_s - alpha_t) * x0
        + (1 - ratio) * (1 - alpha_s) / V
    )
    return top / (alpha_t * V * x0.gather(-1, xt[..., None]) + 1 - alpha_t)


def reference_psi(x0, xt, alpha_s, alpha_t, kappa):
    """``_psi_update``: kappa q_xs + (1 - kappa) forward(q_x0, alpha_s), where q_x0 is the
    posterior with alpha_s = 1 and forward(p, a) = a p + (1 - a) / V."""
    q_xs = reference_posterior(x0, xt, alpha_s, alpha_t)
    q_x0 = reference_posterior(x0, xt, torch.ones_like(alpha_t), alpha_t)
    pc_q_xs = alpha_s * q_x0 + (1 - alpha_s) / V
    return kappa * q_xs + (1 - kappa) * pc_q_xs


ALPHA_T = torch.tensor([0.2, 0.5, 0.9], dtype=F64)
ALPHA_S = torch.tensor([0.3, 0.6, 0.95], dtype=F64)


@pytest.mark.parametrize("kappa", [1.0, 0.0, 0.3])  # predictor, corrector, a mixture
def test_one_psi_step_matches_reference(kappa):
    logits, x_t = fixed_inputs(1)
    p = logits.softmax(-1)
    k = torch.full((B,), kappa, dtype=F64)
    ref = reference_psi(p, x_t, ALPHA_S.view(-1, 1, 1), ALPHA_T.view(-1, 1, 1), kappa)
    ours = psi_posterior(p, x_t, ALPHA_S, ALPHA_T, k)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(ours.sum(-1), torch.ones(B, L, dtype=F64))
    # the draw: Gumbel-max over the same uniforms on the reference distribution
    drawn = sample_categorical(ours.log(), torch.Generator().manual_seed(3))
    want = sample_categorical(ref.log(), torch.Generator().manual_seed(3))
    torch.testing.assert_close(drawn, want, rtol=0, atol=0)


def test_predictor_is_the_ancestral_step():
    """kappa = 1 draws what ``duo_ancestral`` draws from the same uniforms."""
    logits, x_t = fixed_inputs(2)
    q = psi_posterior(logits.softmax(-1), x_t, ALPHA_S, ALPHA_T, torch.ones(B, dtype=F64))
    ancestral = step_posterior(x_t, logits, ALPHA_S, ALPHA_T, torch.Generator().manual_seed(4))
    torch.testing.assert_close(
        sample_categorical(q.log(), torch.Generator().manual_seed(4)), ancestral, rtol=0, atol=0
    )


def reference_kappas(mode: str, alphas: torch.Tensor) -> torch.Tensor:
    """``_mode_to_psi_kappas`` on one segment of grid levels ``alphas`` (N+1,), the
    reference's mode names; its appended final 1 (for a step it never takes) left out."""
    n = len(alphas) - 1
    if mode == "pure-posterior":
        return torch.ones(n, dtype=F64)
    if mode == "pure-pc":
        return torch.zeros(n, dtype=F64)
    eta = float(mode.split("-")[-1])
    if mode.startswith("constant-") and not mode.startswith("constant-remdm"):
        return torch.full((n,), eta, dtype=F64)
    alpha_t, alpha_s = alphas[:-1], alphas[1:]
    eta_t = torch.tensor([eta], dtype=F64)
    if mode.startswith("max-capped-"):
        sigma = torch.minimum(eta_t.expand_as(alpha_t), (1 - alpha_s) / alpha_t)
        sigma = torch.where(alpha_t == 0, eta, sigma)
    elif mode.startswith("max-rescale-"):
        sigma_max = torch.minimum(eta_t.expand_as(alpha_t), (1 - alpha_s) / alpha_t)
        sigma = torch.where(alpha_t > 0, sigma_max, 1) * eta
    else:  # constant-remdm
        sigma = eta_t
    return torch.clip(1 - sigma / (1 - alpha_s), 0, 1)


@pytest.mark.parametrize(
    ("ours", "theirs", "eta"),
    [
        ("posterior", "pure-posterior", 0.0),
        ("pc", "pure-pc", 0.0),
        ("constant", "constant-0.3", 0.3),
        ("remdm", "constant-remdm-0.05", 0.05),
        ("remdm", "max-capped-0.01", 0.01),  # the same kappas: see ``psi_kappa``
        ("remdm", "max-capped-0.4", 0.4),
        ("remdm_rescale", "max-rescale-0.01", 0.01),
        ("remdm_rescale", "max-rescale-0.5", 0.5),
    ],
)
def test_kappas_match_reference(ours, theirs, eta):
    # log-linear levels from t = 1 (alpha = 0) to t = 0.01, as the reference's grid
    alphas = 1 - torch.linspace(1, 0.01, 17, dtype=F64)
    want = reference_kappas(theirs, alphas)
    got = psi_kappa(alphas[:-1], alphas[1:], ours, eta)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)


def test_unknown_mode_names_the_modes():
    with pytest.raises(ValueError, match="remdm_rescale"):
        psi_kappa(torch.ones(1), torch.ones(1), "max-capped", 0.1)
