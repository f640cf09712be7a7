"""The process contract's checks of process=uniform (``tests/test_process_contract.py``), by
enumeration and quadrature in float64, independent of cdlm's formulas.

The noise draws from the process's support (``cdlm.processes.uniform_support``): built as
``cdlm-train`` builds it, the K = 5 ids the toy data holds, not [MASK]. The ELBO integrand is checked against its definition: the rate at
which the per-position KL(q(x_s | x_t, x) || p_theta(x_s | x_t)) grows as s -> t, with both
posteriors built from explicit V x V transition matrices (Bayes' rule, nothing of cdlm's
algebra). The eval loss is checked against the ELBO by enumerating all K^L corruptions at
Gauss-Legendre nodes in t.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from process_brute_force import DATA_IDS, F64, L, V, monte_carlo, words
from torch import Tensor

from cdlm.processes.base import Corrupted

SUPPORT, K = DATA_IDS, len(DATA_IDS)
ON = torch.zeros(V, dtype=F64).index_fill(0, torch.tensor(SUPPORT), 1.0)  # (V,) the support


def transition(a: float) -> Tensor:
    """(V, V) row-stochastic: keep with probability a, else uniform over the support."""
    return a * torch.eye(V, dtype=F64) + (1 - a) * ON / K


def bayes_posterior(x0: Tensor, x_t: Tensor, a_s: float, a_t: float) -> Tensor:
    """(..., V) q(x_s | x_t, x0) for x0 (..., V) a distribution, by matrices:
    q(x_s = v | x0) q(x_t | x_s = v) / normaliser."""
    forward = x0 @ transition(a_s)  # (..., V) q(x_s | x0)
    step = transition(a_t / a_s)[:, x_t].movedim(0, -1)  # q(x_t | x_s = v), (..., V)
    joint = forward * step
    return joint / joint.sum(-1, keepdim=True)


def kl_rate(process, logp: Tensor, x: Tensor, z: Tensor, t: float) -> Tensor:
    """(N,) sum over positions of KL(q(x_s | x_t, x) || p_theta(x_s | x_t)) / (t - s), s -> t,
    by Richardson extrapolation of two small steps."""
    keep = process.schedule.keep

    def rate(h: float) -> Tensor:
        a_t, a_s = (float(keep(torch.tensor(u, dtype=F64))) for u in (t, t - h))
        q = bayes_posterior(
            torch.nn.functional.one_hot(x, V).double().expand(*z.shape, V), z, a_s, a_t
        )
        p = bayes_posterior(logp.exp(), z, a_s, a_t)
        kl = torch.where(q > 0, q * (q.log() - p.log()), 0.0)  # off the support q = p = 0
        return kl.sum((-1, -2)) / h

    h = 1e-5
    return 2 * rate(h) - rate(2 * h)


def all_corruptions() -> Tensor:
    return torch.tensor(list(itertools.product(SUPPORT, repeat=L)))


def check_uniform(process, network) -> None:
    """Per corruption and level, the process's ELBO integrand is the KL rate of its definition;
    the eval loss's mean over seeded draws is the enumerated, Gauss-Legendre ELBO over
    [t_min, 1] / (1 - t_min) within 4 SE; the model's ELBO is 0 for a denoiser certain of x."""
    assert process.support.ids.tolist() == SUPPORT  # the data's ids, [MASK] left out
    denoiser, x, z = process.make_denoiser(network), words(1, 0)[0], all_corruptions()
    valid = torch.ones(z.shape, dtype=torch.bool)
    for t in (0.1, 0.5, 0.9):
        tt = torch.full((len(z),), t, dtype=F64)
        logp = denoiser(z, tt).logits.double()
        c = Corrupted(x.expand_as(z), x.expand_as(z), z, tt, z != x)
        integrand = process.elbo_terms(logp, c, valid)
        torch.testing.assert_close(integrand, kl_rate(process, logp, x, z, t), rtol=1e-6, atol=1e-9)
        certain = torch.nn.functional.one_hot(x, V).double().expand(len(z), L, V)
        zero = process.elbo_terms(certain.clamp_min(1e-300).log(), c, valid)
        torch.testing.assert_close(zero, torch.zeros_like(zero), rtol=0, atol=1e-9)
    xs = words(2, 1)
    exact = sum(float(enumerated_bound(process, denoiser, row)) for row in xs) / len(xs)
    mean, se = monte_carlo(process, denoiser, xs)
    assert se < 0.02 * exact and abs(mean - exact) < 4 * se, (mean, exact, se)


def enumerated_bound(process, denoiser, x: Tensor, nodes: int = 24) -> Tensor:
    """int_{t_min}^1 sum_{x_t} q(x_t | x, t) ELBO integrand dt / (1 - t_min) / L: every
    corruption of ``x`` (L,) at the Gauss-Legendre nodes of two panels (the integrand is
    steeper as alpha -> 0)."""
    z, t_min = all_corruptions(), process.t_min
    same = (z == x).double()
    total = torch.zeros((), dtype=F64)
    for lo, hi in ((t_min, 0.8), (0.8, 1.0)):
        u, w = np.polynomial.legendre.leggauss(nodes)
        for node, weight in zip(u, w, strict=True):
            t = 0.5 * (hi - lo) * node + 0.5 * (hi + lo)
            tt = torch.full((len(z),), t, dtype=F64)
            a = float(process.schedule.keep(torch.tensor(t, dtype=F64)))
            prob = (a * same + (1 - a) / K).prod(-1)  # q(x_t | x, t)
            c = Corrupted(x.expand_as(z), x.expand_as(z), z, tt, z != x)
            integrand = process.elbo_terms(
                denoiser(z, tt).logits.double(), c, torch.ones_like(same, dtype=torch.bool)
            )
            total += 0.5 * (hi - lo) * weight * (prob * integrand).sum()
    return total / (1 - t_min) / L


def check_corruption(process, c: Corrupted, tokens: Tensor, t: Tensor) -> None:
    """Kept positions are the clean token; resampled ones are uniform over the support (a
    chi-square test), never elsewhere; the resampling rate is 1 - alpha(t) within 5 SE."""
    assert torch.equal(c.x_t[~c.noisy], tokens[~c.noisy])
    drawn = torch.bincount(c.x_t[c.noisy], minlength=V).double()
    assert float(drawn[ON == 0].sum()) == 0.0
    drawn = drawn[SUPPORT]
    chi2 = float(((drawn - drawn.sum() / K) ** 2 / (drawn.sum() / K)).sum())
    assert chi2 < 28.0, chi2  # P(chi2_4 > 28) ~ 1e-5
    rate = 1.0 - process.keep(t).expand(tokens.shape)
    se = float((rate * (1 - rate)).sum().sqrt()) / rate.numel()
    assert abs(float(c.noisy.double().mean() - rate.mean())) < 5 * se


def check_prior(process, draw) -> None:
    """The prior is uniform noise over the support from the generator: seeded draws repeat,
    no other id appears, and the counts pass a chi-square test."""
    x = draw(7)
    assert x.dtype == torch.long and torch.equal(x, draw(7)) and not torch.equal(x, draw(8))
    counts = torch.bincount(x.flatten(), minlength=V).double()
    assert len(counts) == V and float(counts[ON == 0].sum()) == 0.0
    counts = counts[SUPPORT]
    assert float(((counts - x.numel() / K) ** 2 / (x.numel() / K)).sum()) < 28


def check_evidence(out, c: Corrupted, process, levels: Tensor) -> None:
    """The evidence is log q(x_t | x0 = v): log(alpha + (1 - alpha) / K) at v = x_t, else
    log((1 - alpha) / K), by hand; the scored positions are the resampled ones."""
    a = process.keep(levels).double().expand(c.x_t.shape)[..., None]
    hand = torch.log((1 - a) / K).expand(*c.x_t.shape, V).clone()
    hand.scatter_(-1, c.x_t[..., None], torch.log(a + (1 - a) / K))
    torch.testing.assert_close(out.evidence.double(), hand)
