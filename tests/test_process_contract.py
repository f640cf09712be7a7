"""One contract that every registered process passes (STYLE rule 14; issue 42).

The registered processes are the files of conf/process/; ``CASES`` holds one row per file (its
toy-size overrides and the brute-force check of its loss), and
``test_every_registered_process_has_a_row`` fails, naming it, until a new file has one. Each
process is built from its config as ``cdlm-train`` builds it (``tests/process_brute_force.py``):
vocabulary 6, length 4, a one-layer Transformer; float64 wherever a check is numeric.

What is checked, against what: corruption shapes, dtypes and the untouched clean positions (by
hand; the masking rate against 1 - keep(t) within 5 standard errors); the prior (the canvas
placeholder, or N(0, I) moments of a seeded draw); ``evaluate_at`` (the masked positions and
their evidence, or the gaussian readout by hand); the model-file round trip (bit-identical
outputs and loss); and the loss or bound against enumeration and quadrature (see each
``check_*``). Uniform-state noise (``tests/process_uniform_checks.py``): uniform draws and prior
by chi-square, its evidence by hand, its ELBO against the KL rate of its definition.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import process_brute_force as bf
import process_uniform_checks as uc
import pytest
import torch
from process_brute_force import F64, L, V, gen, monte_carlo, weight_by_hand, words
from torch import Tensor

from cdlm.denoiser import Prediction
from cdlm.likelihood import elbo
from cdlm.model import Model, save_model
from cdlm.model_file import load_model
from cdlm.processes.base import Corrupted, LevelEval
from cdlm.schedules import CosineSchedule

CONF = Path(__file__).resolve().parents[1] / "conf" / "process"
NAMES = sorted(p.stem for p in CONF.glob("*.yaml"))
B = 256


@cache
def parts(name: str) -> bf.Parts:
    return bf.build(name, list(row(name).overrides))


def doubled(name: str):
    """(process, network) of ``name`` in float64, eval mode, fresh copies."""
    p = parts(name)
    return copy.deepcopy(p.process).double().eval(), copy.deepcopy(p.network).double().eval()


# --- the brute-force checks of each loss ----------------------------------------------------


def check_masked(name: str) -> None:
    """Per mask pattern and level, the process's ELBO integrand is w(t) times the hand CE of
    the masked positions; the eval loss's mean over seeded draws is the enumerated, quadrature
    ELBO over [t_min, 1] / (1 - t_min) within 4 SE; an oracle (the exact conditionals of a known
    joint) makes the ELBO over all levels -log p(x) exactly, and any network's bound averaged
    over that joint is at least its entropy."""
    process, network = doubled(name)
    denoiser, mask = process.make_denoiser(network), process.mask_id
    bos = process.eos_id if process.next_token_layout else None
    x, masked = words(1, 0)[0], bf.patterns(L)
    z = torch.where(masked, mask, x)
    hand = -(bf.subs_log_probs(network, z, mask, bos).gather(-1, x.expand_as(z)[..., None]))
    hand = (hand.squeeze(-1) * masked).sum(-1)
    for t in (0.1, 0.5, 0.9):
        c = Corrupted(
            x.expand_as(z), x.expand_as(z), z, torch.full((len(z),), t, dtype=F64), masked
        )
        integrand, _ = process.elbo(denoiser, c, torch.ones_like(masked))
        torch.testing.assert_close(integrand, weight_by_hand(process, t) * hand, rtol=1e-8, atol=0)
    xs, t_min = words(4, 1), process.t_min
    weights = bf.level_weights(bf.keep_of(process.schedule), L, t_min, 1.0)
    exact = float(bf.masked_bound(network, xs, mask, bos, weights).mean()) / (1 - t_min) / L
    mean, se = monte_carlo(process, denoiser, xs)
    assert se < 0.02 * exact and abs(mean - exact) < 4 * se, (mean, exact, se)
    seqs, p = bf.known_joint(2)
    full = bf.level_weights(lambda t: 1.0 - t, L, 0.0, 1.0)  # keep from 1 down to 0
    oracle = bf.Oracle(seqs, p, mask, bos)
    torch.testing.assert_close(bf.masked_bound(oracle, seqs, mask, bos, full), -p.log())
    entropy = float(-(p * p.log()).sum())
    assert float((p * bf.masked_bound(network, seqs, mask, bos, full)).sum()) >= entropy


def check_block(name: str) -> None:
    """Per mask pattern and per-block levels, the process's ELBO integrand (the training
    pass over x_t and x0) is sum_b w(t_b) times the CE of the sampler's window call for block b
    given the clean blocks before it; the eval loss's mean over seeded draws is the enumerated,
    quadrature block ELBO over [t_min, 1] / (1 - t_min) within 4 SE; over all levels, the bound
    averaged over a known joint is at least its entropy. (No oracle equality: in the shifted
    layout a block's last token is no network input, so it never informs its own block.)"""
    process, network = doubled(name)
    denoiser, mask, size = process.make_denoiser(network), process.mask_id, process.block_size
    assert L % size == 0 and L // size >= 2, "the row needs at least two whole blocks"
    x, masked = words(1, 0)[0], bf.patterns(L)
    z = torch.where(masked, mask, x)
    levels = torch.tensor([0.3, 0.7], dtype=F64).repeat_interleave(size)[:L]
    w = torch.tensor([weight_by_hand(process, float(t)) for t in levels], dtype=F64)
    hand = (bf.window_ce(denoiser, x, z, mask, size) * w).sum(-1)
    c = Corrupted(x.expand_as(z), x.expand_as(z), z, levels.expand(len(z), L), masked)
    integrand, _ = process.elbo(denoiser, c, torch.ones_like(masked))
    torch.testing.assert_close(integrand, hand, rtol=1e-8, atol=1e-12)
    xs, t_min = words(4, 1), process.t_min
    weights = bf.level_weights(bf.keep_of(process.schedule), size, t_min, 1.0)
    exact = float(bf.block_bound(denoiser, xs, mask, size, weights).mean()) / (1 - t_min) / L
    mean, se = monte_carlo(process, denoiser, xs)
    assert se < 0.02 * exact and abs(mean - exact) < 4 * se, (mean, exact, se)
    seqs, p = bf.known_joint(2)
    full = bf.level_weights(lambda t: 1.0 - t, size, 0.0, 1.0)
    bound = bf.block_bound(denoiser, seqs, mask, size, full)
    assert float((p * bound).sum()) >= float(-(p * p.log()).sum())


def check_gaussian(name: str) -> None:
    """Not a bound (``loss_is_bound`` False): the eval loss is the CE of the logits at the
    seeded stratified levels and noise, by hand; its likelihood, ``cdlm.likelihood.elbo``, with
    the linear denoiser x0_hat = alpha(t) x_t, matches the VDM terms by quadrature in t (prior
    exactly, diffusion and reconstruction within 4 SE over 4096 x 4 draws), under the config's
    schedule and under a low-SNR one where the rounding term is not 0)."""
    process, network = doubled(name)
    assert not process.loss_is_bound
    denoiser, tokens = process.make_denoiser(network), words(8, 3)
    loss = process.loss(denoiser, {"tokens": tokens}, gen(4)).loss
    g = gen(4)
    t = (torch.rand((), generator=g) + torch.arange(len(tokens)) / len(tokens)) % 1.0
    noise = torch.randn((*tokens.shape, process.embed_dim), generator=g, dtype=F64)
    s = process.schedule
    x_t = s.alpha(t)[:, None, None] * process.embedding(tokens) + s.sigma(t)[:, None, None] * noise
    logp = denoiser(x_t, t).logits.double().log_softmax(-1)
    hand = -logp.gather(-1, tokens[..., None]).mean()
    torch.testing.assert_close(loss, hand, rtol=1e-12, atol=0)

    def linear(x: Tensor, t: Tensor, *args, **kwargs) -> Prediction:
        return Prediction(logits=torch.zeros(()), x0=process.schedule.alpha(t)[:, None, None] * x)

    n, x = 4096, tokens[0]
    for schedule in (s, CosineSchedule(-3.0, 1.0)):  # the config's; one where rounding is not 0
        process.schedule = schedule.double()
        got = elbo(linear, process, x.expand(n, L), generator=gen(5), t_samples=4)
        exact = {k: v / (L * math.log(2)) for k, v in bf.vdm_linear_bound(process, x).items()}
        torch.testing.assert_close(got.prior, torch.full((n,), exact["prior"], dtype=F64))
        for term in ("diffusion", "reconstruction"):
            values = getattr(got, term)
            mean, se = float(values.mean()), float(values.std()) / math.sqrt(n)
            assert abs(mean - exact[term]) <= 4 * se + 1e-9, (term, mean, exact[term], se)
        assert float(got.diffusion.std()) / math.sqrt(n) < 0.02 * exact["diffusion"]


@dataclass(frozen=True)
class Row:
    """A registered process's toy-size config overrides and the brute-force check of its loss."""

    check: Callable[[str], None]
    overrides: tuple[str, ...] = ()


CASES: dict[str, Row] = {
    "autoregressive": Row(lambda name: bf.check_autoregressive(*doubled(name))),
    "block": Row(check_block, ("process.block_size=2",)),
    "gaussian": Row(check_gaussian, ("process.embed_dim=4",)),
    "masked": Row(check_masked),
    "uniform": Row(lambda name: uc.check_uniform(*doubled(name))),
}


def row(name: str) -> Row:
    if name not in CASES:
        pytest.fail(f"conf/process/{name}.yaml has no row in CASES (tests/test_process_contract)")
    return CASES[name]


def test_every_registered_process_has_a_row():
    missing, stale = set(NAMES) - set(CASES), set(CASES) - set(NAMES)
    assert not missing, f"conf/process files without a contract row: {sorted(missing)}"
    assert not stale, f"rows without a conf/process file: {sorted(stale)}"


# --- the contract ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_loss_matches_brute_force(name):
    row(name).check(name)


@pytest.mark.parametrize("name", NAMES)
def test_corruption(name):
    process, tokens, g = parts(name).process, words(B, 6), gen(6)
    for training in (True, False):  # training levels may be per token, (B, L)
        t = process.train(training).sample_t(B, g, length=L)
        assert t.shape in ((B,), (B, L)) and t.is_floating_point(), t.shape
        assert 0.0 <= float(t.min()) and float(t.max()) <= 1.0
        c = process.eval().corrupt(tokens, t, g)
        assert isinstance(c, Corrupted) and torch.equal(c.tokens, tokens) and c.t is t
        assert c.noisy.dtype == torch.bool and c.noisy.shape == (B, L)
        if process.continuous:
            d, s = process.embed_dim, process.schedule
            assert c.x0.shape == c.x_t.shape == c.noise.shape == (B, L, d)
            assert c.x_t.is_floating_point() and c.noisy.all()
            assert torch.equal(c.x0, process.embedding(tokens))
            alpha, sigma = (f(t).view(B, -1, 1) for f in (s.alpha, s.sigma))
            torch.testing.assert_close(c.x_t, alpha * c.x0 + sigma * c.noise)
            continue
        assert c.noise is None and c.x_t.dtype == c.x0.dtype == torch.long
        assert c.x_t.shape == (B, L) and torch.equal(c.x0, tokens)
        if process.kind == "uniform":  # nothing absorbs: x_t is x or uniform noise
            uc.check_corruption(process, c, tokens, t)
            continue
        if process.mask_id is None:  # the AR "corruption" is the shift after the BOS
            assert c.noisy.all() and (c.x_t[:, 0] == process.canvas_id).all()
            assert torch.equal(c.x_t[:, 1:], tokens[:, :-1])
            continue
        assert torch.equal(c.x_t, torch.where(c.noisy, process.mask_id, tokens))
        rate = 1.0 - process.keep(t).expand(B, L)
        se = float((rate * (1 - rate)).sum().sqrt()) / rate.numel()
        assert abs(float(c.noisy.double().mean() - rate.mean())) < 5 * se


@pytest.mark.parametrize("name", NAMES)
def test_prior(name):
    process, g = parts(name).process, gen(7)
    x = process.prior((64, 32), torch.device("cpu"), g)
    if process.kind == "uniform":
        assert x.shape == (64, 32) and process.canvas_id is None
        return uc.check_prior(process, lambda s: process.prior((64, 32), x.device, gen(s)))
    if not process.continuous:
        assert x.shape == (64, 32) and x.dtype == torch.long
        assert (x == process.canvas_id).all()
        expected = (
            parts(name).tokenizer.eos_token_id if process.mask_id is None else process.mask_id
        )
        assert process.canvas_id == expected  # [MASK], or the AR sampler's BOS placeholder
        return
    assert x.shape == (64, 32, process.embed_dim) and x.dtype == torch.float32
    n = x.numel()
    assert abs(float(x.mean())) < 4 / math.sqrt(n)
    assert abs(float(x.var()) - 1.0) < 4 * math.sqrt(2 / n)
    cov = torch.cov(x.flatten(0, 1).T)
    assert (cov - torch.eye(process.embed_dim)).abs().max() < 4 * math.sqrt(2 / len(cov.T))
    assert torch.equal(x, process.prior((64, 32), torch.device("cpu"), gen(7)))


@pytest.mark.parametrize("name", NAMES)
def test_evaluate_at(name):
    process, network = doubled(name)
    denoiser, tokens = process.make_denoiser(network), words(B, 8)
    if not process.noise_levels:
        with pytest.raises(ValueError):
            process.evaluate_at(denoiser, tokens, 0.5)
        return
    for t in (0.5, torch.rand(B, L, generator=gen(9))):
        out = process.evaluate_at(denoiser, tokens, t, gen(10))
        levels = t if torch.is_tensor(t) else torch.full((B,), t)
        c = process.corrupt(tokens, levels, gen(10))  # the very same draw
        assert isinstance(out, LevelEval) and torch.equal(out.tokens, tokens)
        assert out.logits.shape == out.evidence.shape == (B, L, V)
        assert torch.equal(out.scored, c.noisy)
        if process.continuous:
            s, table = process.schedule, process.embedding.table()
            gain = (s.alpha(levels.float()) / s.sigma(levels.float()) ** 2).view(B, -1, 1)
            hand = (gain * (c.x_t @ table.T)).log_softmax(-1)  # the fp32 readout
            torch.testing.assert_close(
                out.evidence.log_softmax(-1), hand.float(), rtol=1e-5, atol=1e-5
            )
            continue
        assert c.noisy.any() and (~c.noisy).any()
        if process.kind == "uniform":
            uc.check_evidence(out, c, process, levels)
            continue
        assert (out.evidence[c.noisy] == 0).all()
        point = torch.full((B, L, V), -math.inf, dtype=out.evidence.dtype)
        point.scatter_(-1, tokens[..., None], 0.0)
        assert torch.equal(out.evidence[~c.noisy], point[~c.noisy])


@pytest.mark.parametrize("name", NAMES)
def test_model_file_round_trip(name, tmp_path):
    p = parts(name)
    model = Model(p.process.eval(), p.network, p.tokenizer, p.config)
    save_model(tmp_path / "m.safetensors", model)
    loaded = load_model(tmp_path / "m.safetensors")
    assert type(loaded.process) is type(p.process) and loaded.config == p.config
    for capability in ("kind", "mask_id", "canvas_id", "block_size", "continuous", "causal"):
        assert getattr(loaded.process, capability) == getattr(p.process, capability)
    tokens = words(8, 11)
    t = p.process.sample_t(8, gen(12), length=L)
    x_t = p.process.corrupt(tokens, t, gen(13)).x_t
    assert torch.equal(loaded.denoiser(x_t, t).logits, model.denoiser(x_t, t).logits)
    loss = [m.process.loss(m.denoiser, {"tokens": tokens}, gen(14)).loss for m in (model, loaded)]
    assert torch.equal(*loss)
