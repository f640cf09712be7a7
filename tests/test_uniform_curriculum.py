"""Duo's Gaussian curriculum (``cdlm.processes.curriculum``): parity with the reference in
float64, and its mechanics (the duality's keep rate, the switch at its share, eval mode).

Reference: github.com/s-sahoo/duo at commit 7c9b498f5b717de064d6fad7e2509c866e6cb620,
``algo.py``: ``DUO.nll`` (mode ``simple``), ``DUO._q_xt_gaussian``,
``DUO._compute_gumbel_tau_inverse``, ``DUO._gamma_to_alpha_dalpha_cached``,
``DUO_BASE.nll_per_token``; ``models/dit.py``: ``EmbeddingLayer.forward`` (the softmax of a
(B, L, V) input). Its expressions are re-derived below in its own variables.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_uniform_parity import reference_alpha, reference_nll_per_token

from cdlm.denoiser import Prediction
from cdlm.processes.curriculum import GaussianCurriculum
from cdlm.processes.duality import uniform_alpha
from cdlm.processes.uniform import UniformProcess, uniform_nelbo

F64 = torch.float64
B, L, V = 3, 5, 7
GAMMA_MIN, GAMMA_MAX = -3.5, -1.75


def reference_relaxed(x0, gamma_t, epsilon, tau_log10, vocab):
    """``DUO.nll`` (mode simple): xt = _q_xt_gaussian(one_hot(x0), gamma_t) *
    _compute_gumbel_tau_inverse(); the backbone embeds softmax(xt) (``EmbeddingLayer``), the
    loss reads xt.argmax(-1)."""
    gamma_t = gamma_t[:, None, None]
    alpha_t = torch.sigmoid(-gamma_t).sqrt()
    sigma_t = torch.sigmoid(gamma_t).sqrt()
    xt = alpha_t * torch.nn.functional.one_hot(x0, vocab).to(F64) + sigma_t * epsilon
    xt = xt * 10 ** (-tau_log10)
    return torch.softmax(xt, dim=-1), xt.argmax(-1)


def fixed(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randint(0, V, (B, L), generator=g)
    t = torch.tensor([0.1, 0.5, 0.93], dtype=F64)
    eps = torch.randn(B, L, V, generator=g, dtype=F64)
    logits = 3 * torch.randn(B, L, V, generator=g, dtype=F64)
    return x0, t, eps, logits


@pytest.mark.parametrize("tau_log10", [0.0, -1.0, -3.0])
def test_relaxed_input_matches_reference(tau_log10):
    x0, t, eps, _ = fixed()
    cur = GaussianCurriculum(share=1.0, tau_start=10.0**tau_log10, tau_end=10.0**tau_log10)
    r = cur.relax(x0, t, eps)
    gamma_t = GAMMA_MIN + t * (GAMMA_MAX - GAMMA_MIN)
    soft, xt = reference_relaxed(x0, gamma_t, eps, tau_log10, V)
    torch.testing.assert_close(r.soft, soft, rtol=1e-12, atol=1e-14)
    assert torch.equal(r.x_t, xt)


def test_relaxed_loss_matches_reference():
    x0, t, eps, logits = fixed()
    logp = logits.log_softmax(-1)
    r = GaussianCurriculum(share=1.0).relax(x0, t, eps)
    ours = uniform_nelbo(logp, r.x_t, x0, r.keep, r.dkeep)
    gamma_t = GAMMA_MIN + t * (GAMMA_MAX - GAMMA_MIN)
    _, xt = reference_relaxed(x0, gamma_t, eps, -3.0, V)
    # _gamma_to_alpha_dalpha_cached: alpha from the tabulated integral, d alpha / dt =
    # (gamma_max - gamma_min) d alpha / d gamma (the reference takes a forward difference of
    # the table; the exact derivative ``_discrete_prob_grad`` is what it approximates).
    pairs = [reference_alpha(float(g), V) for g in gamma_t]
    alpha = torch.tensor([[a] for a, _ in pairs], dtype=F64)
    dalpha = torch.tensor(
        [[(GAMMA_MAX - GAMMA_MIN) * V / (V - 1) * d] for _, d in pairs], dtype=F64
    )
    ref = reference_nll_per_token(logp, xt, x0, alpha, dalpha, V)
    torch.testing.assert_close(ours, ref, rtol=1e-8, atol=1e-10)


class Spy:
    """A denoiser with fixed logits that records what the network would read."""

    def __init__(self, logits):
        self.logits, self.seen = logits, []

    def __call__(self, z, t, self_cond=None, **kwargs):
        self.seen.append((z, t))
        return Prediction(logits=self.logits.log_softmax(-1))


def test_process_loss_is_the_relaxed_bound():
    """The training loss inside the share is the mean relaxed NELBO at the process's own draws,
    and the network reads the soft input at the schedule time of the mapped alpha."""
    n = 64  # enough positions that some are replaced
    x0 = torch.randint(0, V, (B, n), generator=torch.Generator().manual_seed(1))
    logits = 3 * torch.randn(B, n, V, generator=torch.Generator().manual_seed(2), dtype=F64)
    proc = UniformProcess(vocab_size=V, curriculum=GaussianCurriculum(share=0.5)).double()
    proc.set_progress(0.2)
    spy = Spy(logits)
    out = proc.loss(spy, {"tokens": x0}, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    t = proc.sample_t(B, g, device=torch.device("cpu"), length=n)
    eps = torch.randn(B, n, V, generator=g)  # float32, as the process draws it
    r = proc.curriculum.relax(x0, t, eps)
    assert (r.x_t != x0).any()
    want = uniform_nelbo(logits.log_softmax(-1), r.x_t, x0, r.keep, r.dkeep).mean()
    torch.testing.assert_close(out.loss, want, rtol=1e-10, atol=1e-12)
    z, level = spy.seen[0]
    torch.testing.assert_close(z, r.soft)
    torch.testing.assert_close(proc.schedule.keep(level), r.keep, rtol=1e-10, atol=1e-12)


def test_argmax_is_the_uniform_state_draw():
    """The duality: argmax(w) keeps x0 with probability alpha + (1 - alpha) / V at the mapped
    alpha, else lands uniformly on the other tokens; and softmax(w / tau) -> one_hot(argmax)."""
    vocab, n = 50, 40000
    cur = GaussianCurriculum(share=1.0, tau_start=1e-4, tau_end=1e-4)
    g = torch.Generator().manual_seed(0)
    x0 = torch.randint(0, vocab, (4, n), generator=g)
    t = torch.tensor([0.0, 0.3, 0.7, 1.0], dtype=F64)
    r = cur.relax(x0, t, torch.randn(4, n, vocab, generator=g, dtype=F64))
    kept = (r.x_t == x0).double().mean(-1)
    want = r.keep + (1 - r.keep) / vocab
    se = (want * (1 - want) / n).sqrt()
    assert ((kept - want).abs() < 4 * se).all(), (kept, want, se)
    torch.testing.assert_close(r.keep, uniform_alpha(-(GAMMA_MIN + t * 1.75), vocab))
    offset = (r.x_t - x0) % vocab  # 1..V-1 on a replaced token, uniform by symmetry
    counts = torch.bincount(offset[r.x_t != x0], minlength=vocab)[1:].double()
    expected = counts.sum() / (vocab - 1)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < (vocab - 1) + 5 * math.sqrt(2 * (vocab - 1)), chi2
    # tau -> 0: the soft input's mass off argmax(w) shrinks to 0 (only near-ties keep any)
    eps = torch.randn(4, 2000, vocab, generator=g, dtype=F64)
    gaps = []
    for tau in (1e-1, 1e-2, 1e-3, 1e-4):
        low = GaussianCurriculum(share=1.0, tau_start=tau, tau_end=tau).relax(x0[:, :2000], t, eps)
        gaps.append(float(1 - low.soft.gather(-1, low.x_t[..., None]).mean()))
    assert all(a > b for a, b in zip(gaps, gaps[1:], strict=False)) and gaps[-1] < 1e-3, gaps


def test_curriculum_switches_off_at_its_share_and_in_eval():
    x0, _, _, logits = fixed()
    proc = UniformProcess(vocab_size=V, curriculum=GaussianCurriculum(share=0.5))
    spy = Spy(logits.float())
    for progress, training, soft in [
        (0.0, True, True),
        (0.49, True, True),
        (0.5, True, False),
        (0.9, True, False),
        (0.0, False, False),
    ]:
        proc.train(training)
        proc.set_progress(progress)
        proc.loss(spy, {"tokens": x0}, torch.Generator().manual_seed(0))
        z = spy.seen[-1][0]
        assert z.is_floating_point() == soft, (progress, training)
        assert z.shape == ((B, L, V) if soft else (B, L))
    assert not GaussianCurriculum(share=0.0).active()


def test_temperature_schedule_is_log_linear_over_the_share():
    cur = GaussianCurriculum(share=0.5, tau_start=1e-1, tau_end=1e-2)
    for progress, want in [(0.0, 1e-1), (0.25, 10**-1.5), (0.5, 1e-2), (0.8, 1e-2)]:
        cur.set_progress(progress)
        assert cur.temperature() == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="gamma_min < gamma_max"):
        GaussianCurriculum(gamma_min=-1.0, gamma_max=-2.0)
    assert np.isclose(GaussianCurriculum().gaussian.logsnr(torch.tensor(1.0)), 1.75)
