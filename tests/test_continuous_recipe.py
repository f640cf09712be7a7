"""The pieces of the continuous recipe (docs/results/historical/continuous.md): proposals over noise levels with
exact densities, the x0 head and preconditioning skip, self-conditioning guidance, the
consistency sampler, and distillation rounds with the original teacher and per-round EMA."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.integrate import quad

from cdlm.data.corpus import Document
from cdlm.data.tokenizer import train_bpe, wrap
from cdlm.denoiser import Prediction, SelfCondGuided
from cdlm.likelihood.elbo import elbo
from cdlm.model_file import Model, load_model, save_model
from cdlm.networks.transformer import Transformer
from cdlm.processes.gaussian import GaussianProcess
from cdlm.processes.inputs import PosteriorInput
from cdlm.processes.objectives import CrossEntropy
from cdlm.processes.parameterization import PreconditionSkip, XPrediction, skip_coefficients
from cdlm.samplers.sde import sample_consistency
from cdlm.schedules import CosineSchedule
from cdlm.time_samplers import LogitNormal, LogSNRGumbel, Warped

S2 = 0.7  # the data variance of the closed-form case


def vdm_integrand(schedule, t: torch.Tensor) -> torch.Tensor:
    """The continuous-time VDM loss density at t for 1-D Gaussian data N(0, S2) under its exact
    denoiser: -1/2 dSNR/dt * Var(x0 | x_t), in closed form (float64)."""
    t = t.double()
    lam, dlam = schedule.logsnr(t), schedule.dlogsnr(t)
    a2, s2 = torch.sigmoid(lam), torch.sigmoid(-lam)
    return -0.5 * lam.exp() * dlam * S2 * s2 / (a2 * S2 + s2)


def fitted_warped() -> Warped:
    w = Warped(bins=10, momentum=1.0, uniform=0.2)
    t = (torch.arange(10) + 0.5) / 10
    w.observe(t, t**2)  # a loss curve rising with t
    return w


def fitted_gumbel(schedule) -> LogSNRGumbel:
    g = LogSNRGumbel(bins=10, momentum=1.0)
    g.attach(schedule)
    t = (torch.arange(10) + 0.5) / 10
    g.observe(t, torch.sigmoid(8 * (t - 0.6)))  # the loss changes most around t = 0.6
    return g


@pytest.mark.parametrize("kind", ["logit_normal", "gumbel", "warped"])
def test_proposals_importance_weighted_leave_the_bound_unbiased(kind):
    """E_q[f(t) / q(t)] is the uniform-t bound: a Monte Carlo of the VDM loss of Gaussian data
    under draws from the proposal, weighted by 1 / density, lands within 3 standard errors of
    the quadrature of the closed-form integrand over t in [0, 1]."""
    schedule = CosineSchedule()
    sampler = {
        "logit_normal": lambda: LogitNormal(mean=0.3, std=1.2, shift=2.0),
        "gumbel": lambda: fitted_gumbel(schedule),
        "warped": fitted_warped,
    }[kind]()
    exact, _ = quad(lambda t: float(vdm_integrand(schedule, torch.tensor([t]))), 0, 1, limit=200)
    g = torch.Generator().manual_seed(0)
    draws = torch.cat([sampler(2000, torch.device("cpu"), g) for _ in range(20)]).double()
    f = vdm_integrand(schedule, draws)
    weighted = f / sampler.density(draws).double()
    estimate = float(weighted.mean())
    stderr = float(weighted.std()) / math.sqrt(len(weighted))
    assert abs(estimate - exact) < 3 * stderr, (estimate, exact, stderr)
    if kind != "warped":  # the proposal is not uniform: the unweighted mean is biased
        assert abs(float(f.mean()) - exact) > 3 * stderr


def test_densities_integrate_to_one():
    schedule = CosineSchedule()
    for sampler in (LogitNormal(shift=3.0), fitted_gumbel(schedule), fitted_warped()):
        total, _ = quad(lambda t, s=sampler: float(s.density(torch.tensor([t]))), 0, 1, limit=200)
        assert total == pytest.approx(1.0, abs=2e-3)


def test_gumbel_moves_towards_where_the_loss_changes():
    g = fitted_gumbel(CosineSchedule())
    draws = g(4000, torch.device("cpu"), torch.Generator().manual_seed(1))
    assert 0.45 < float(draws.median()) < 0.75  # the loss's steepest part, t ~ 0.6


def test_importance_weight_divides_each_token_loss_by_the_density(monkeypatch):
    torch.manual_seed(0)
    process = GaussianProcess(vocab_size=11, embed_dim=4, importance_weight=True)
    network = Transformer(
        d_model=16, n_layers=1, n_heads=2, max_seq_len=8, **process.network_kwargs
    )
    batch = {"tokens": torch.randint(0, 11, (4, 6))}
    denoiser = process.make_denoiser(network)
    process.train()
    weighted = process.loss(denoiser, batch, torch.Generator().manual_seed(3)).loss
    monkeypatch.setattr(process.time_sampler, "density", lambda t: torch.full_like(t, 4.0))
    quarter = process.loss(denoiser, batch, torch.Generator().manual_seed(3)).loss
    process.importance_weight = False
    plain = process.loss(denoiser, batch, torch.Generator().manual_seed(3)).loss
    torch.testing.assert_close(weighted, plain)  # stratified: density 1
    torch.testing.assert_close(quarter, plain / 4)


class Spy(torch.nn.Module):
    """A network whose output is a fixed function of its input, recording the keywords it got."""

    def __init__(self, out_dim: int, in_dim: int = 4) -> None:
        super().__init__()
        self.out_dim, self.seen = out_dim, []
        self.proj = torch.nn.Linear(in_dim, out_dim)

    def forward(self, x, t, self_cond=None, **kwargs):
        self.seen.append(sorted(kwargs))
        return self.proj(x)


def x0_process(**kwargs) -> GaussianProcess:
    return GaussianProcess(
        vocab_size=11, embed_dim=4, prediction=[XPrediction(), PreconditionSkip()], **kwargs
    )


def test_x0_head_and_skip_pass_keywords_on_and_compute_the_edm_skip():
    process = x0_process()
    assert process.network_kwargs["out_dim"] == 11 + 4
    spy = Spy(15)
    torch.nn.init.zeros_(spy.proj.weight)
    torch.nn.init.zeros_(spy.proj.bias)  # F = 0: x0 is c_skip x_t
    x, t = torch.randn(2, 5, 4), torch.tensor([0.3, 0.8])
    pred = process.make_denoiser(spy)(x, t, positions=torch.arange(5), label=None)
    assert spy.seen == [["label", "positions"]]
    c_skip, _ = skip_coefficients(process.schedule, t, 1.0)
    torch.testing.assert_close(pred.x0, c_skip[:, None, None] * x)
    assert pred.logits.shape == (2, 5, 11)


def test_x0_head_can_leave_the_hull_and_trains_its_x0():
    process = x0_process()
    spy = Spy(15)
    with torch.no_grad():
        spy.proj.bias[11:] = 50.0  # far outside every embedding's norm
    x, t = torch.randn(1, 3, 4), torch.tensor([0.5])
    x0 = process.make_denoiser(spy)(x, t).x0
    assert float(x0.norm(dim=-1).min()) > float(process.embedding.table().norm(dim=-1).max())
    process.train()
    out = process.loss(process.make_denoiser(spy), {"tokens": torch.randint(0, 11, (2, 3))})
    assert "x0_mse" in out.metrics and float(out.metrics["x0_mse"]) > 100


def posterior_x0_process(base: str | None) -> GaussianProcess:
    """Posterior input, readout skip, and (unless ``base`` is None) an x0 head with that skip."""
    prediction = [] if base is None else [XPrediction(), PreconditionSkip(base=base)]
    torch.manual_seed(0)  # the same embedding table for every base
    return GaussianProcess(
        vocab_size=11, embed_dim=4, input=PosteriorInput(),
        objective=CrossEntropy(readout_skip=True), prediction=prediction,
    )  # fmt: skip


def head_and_logits(bias: float) -> tuple[Spy, Spy]:
    """A network with an x0 head fixed at ``bias`` and one with only its logit columns."""
    torch.manual_seed(1)
    headed, plain = Spy(15, in_dim=11), Spy(11, in_dim=11)
    with torch.no_grad():
        headed.proj.weight[11:] = 0.0
        headed.proj.bias[11:] = bias
        plain.proj.weight.copy_(headed.proj.weight[:11])
        plain.proj.bias.copy_(headed.proj.bias[:11])
    return headed, plain


def test_readout_skip_base_is_the_ce_estimate_plus_a_noise_gated_correction():
    process, ce = posterior_x0_process("readout"), posterior_x0_process(None)
    head, logits_only = head_and_logits(3.0)
    headed, plain = process.make_denoiser(head), ce.make_denoiser(logits_only)
    x, t = torch.randn(2, 5, 4), torch.tensor([0.3, 0.8])
    a, b = headed(x, t), plain(x, t)
    torch.testing.assert_close(a.logits, b.logits)  # the readout skip is kept
    gate = (process.schedule.sigma(t) ** 2)[:, None, None]
    torch.testing.assert_close(a.x0, b.x0 + 3.0 * gate.expand(2, 5, 4))
    low = torch.zeros(2)  # t = 0: sigma^2 ~ 0, the CE estimate alone
    torch.testing.assert_close(headed(x, low).x0, plain(x, low).x0, atol=1e-3, rtol=0)


def test_readout_base_keeps_the_bound_where_the_x_t_skip_blows_it_up():
    """F = 0: the readout base's bound is the CE model's. EDM's x_t skip, fed the posterior
    input, leaves c_skip x_t's noise in x0; at low noise the bound's integrand exp(logsnr)
    |e - x0|^2 is then ~D per token, where the CE estimate's is near 0."""
    tokens = torch.randint(0, 11, (4, 6), generator=torch.Generator().manual_seed(2))
    bounds, integrand = {}, {}
    for base, index in (("readout", 0), (None, 1), ("x_t", 0)):
        process = posterior_x0_process(base)
        denoiser = process.make_denoiser(head_and_logits(0.0)[index])
        gen = torch.Generator().manual_seed(3)
        bounds[base] = elbo(denoiser, process, tokens, generator=gen, t_samples=4)
        logsnr = torch.full((4,), 8.0, dtype=torch.float64)
        t = process.schedule.t_from_logsnr(logsnr).float()
        e = process.embedding(tokens).detach()
        x_t = process.noised(e, t, torch.randn(e.shape, generator=gen))
        error = (e - denoiser(x_t, t).x0).pow(2).sum(-1).mean()
        integrand[base] = float(logsnr[0].exp() * error)
    torch.testing.assert_close(bounds["readout"].total, bounds[None].total)
    assert integrand["x_t"] > 0.5 * 4 > 10 * integrand[None]


def test_pieces_are_checked():
    with pytest.raises(ValueError, match="needs an XPrediction before it"):
        GaussianProcess(vocab_size=11, embed_dim=4, prediction=[PreconditionSkip()])
    with pytest.raises(ValueError, match="unknown prediction piece"):
        GaussianProcess(vocab_size=11, embed_dim=4, prediction=["skip"])


@pytest.mark.parametrize("base", ["x_t", "readout"])
def test_x0_pieces_round_trip_through_a_model_file(tmp_path, base):
    torch.manual_seed(0)
    tok = wrap(train_bpe([Document("the cat sat on the mat " * 20, "x")], 280).to_str())
    process = GaussianProcess(
        vocab_size=len(tok),
        embed_dim=8,
        input=PosteriorInput(),
        prediction=[XPrediction(weight=0.5), PreconditionSkip(base=base)],
    )
    net_kwargs = {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 16}
    network = Transformer(**net_kwargs, **process.network_kwargs)
    pieces = "cdlm.processes.parameterization"
    config = {
        "process": {
            "_target_": "cdlm.processes.gaussian.GaussianProcess",
            "vocab_size": len(tok),
            "embed_dim": 8,
            "input": {"_target_": "cdlm.processes.inputs.PosteriorInput"},
            "prediction": [
                {"_target_": f"{pieces}.XPrediction", "weight": 0.5},
                {"_target_": f"{pieces}.PreconditionSkip", "base": base},
            ],
        },
        "network": {"_target_": "cdlm.networks.transformer.Transformer"}
        | net_kwargs
        | process.network_kwargs,
        "seq_len": 16,
        "labels": [],
    }
    model = Model(process, network, tok, config)
    save_model(tmp_path / "m.safetensors", model)
    loaded = load_model(tmp_path / "m.safetensors")
    x, t = torch.randn(2, 16, 8), torch.rand(2)
    a, b = model.denoiser(x, t), loaded.denoiser(x, t)
    torch.testing.assert_close(a.x0, b.x0)
    torch.testing.assert_close(a.logits, b.logits)
    assert [type(p).__name__ for p in loaded.process.prediction] == [
        "XPrediction",
        "PreconditionSkip",
    ]
    assert loaded.process.prediction[1].base == base


def scripted(x, t, self_cond=None, **kwargs):
    """cond and uncond predictions that differ: x0 = x + 1 with an estimate, x without."""
    shift = 0.0 if self_cond is None else 1.0
    logits = torch.stack([x[..., 0] * 0 + shift, x[..., 0] * 0], -1)
    return Prediction(logits=logits, x0=x + shift)


def test_self_conditioning_guidance_mixes_cond_and_uncond():
    x, t, est = torch.zeros(1, 2, 3), torch.tensor([0.5]), torch.ones(1, 2, 3)
    assert torch.equal(SelfCondGuided(scripted, 1.0)(x, t, est).x0, x + 1)
    assert torch.equal(SelfCondGuided(scripted, 0.0)(x, t, est).x0, x)
    assert torch.equal(SelfCondGuided(scripted, 3.0)(x, t, est).x0, x + 3)
    assert torch.equal(SelfCondGuided(scripted, 3.0)(x, t, None).x0, x)  # first step: none yet
    with pytest.raises(ValueError, match="self_cond_scale"):
        SelfCondGuided(scripted, -1.0)


def test_self_cond_scale_needs_a_self_conditioned_model():
    process = GaussianProcess(vocab_size=11, embed_dim=4)
    with pytest.raises(ValueError, match="self_cond_prob"):
        process.sampling_denoiser(Spy(11), self_cond_scale=2.0)


def test_self_cond_guidance_counts_both_passes_in_nfe():
    """generate's NFE and positions are the network's own: with scale 2 every call but the
    first (no estimate yet) runs twice."""
    from conftest import draw_from
    from test_guidance import Tok
    from test_sampler_contract import Spy as Counter
    from test_sampler_contract import make_network, make_process

    from cdlm.generation import named_sampler

    process = make_process("gaussian").float()
    network = make_network(process).float()
    for scale, calls in ((1.0, 5), (2.0, 9)):
        counter = Counter(network)
        gen = draw_from(
            process, network, Tok(), named_sampler("ddpm"), steps=5, num_samples=1, seq_len=6, seed=0,
            cut_at_eos=False, guidance=None, denoising={"self_cond_scale": scale},
        )  # fmt: skip
        assert counter.calls == calls and gen.nfe == calls
        assert gen.positions == counter.positions


def test_consistency_sampler_renoises_the_estimate_afresh():
    """Each step is alpha_s x0_hat + sigma_s z with fresh z: with a constant estimate c, the
    state before the last step is exactly that, and the last step returns c."""
    process = GaussianProcess(vocab_size=11, embed_dim=4)
    c = torch.full((2, 3, 4), 0.25)
    states = []

    def constant(x, t, self_cond=None, **kwargs):
        states.append(x.clone())
        return Prediction(logits=torch.zeros(2, 3, 11), x0=c)

    grid = torch.tensor([1.0, 0.5, 0.0])
    g = torch.Generator().manual_seed(0)
    out = sample_consistency(constant, torch.randn(2, 3, 4), grid, process=process, generator=g)
    assert out.nfe == 2 and torch.equal(out.x, c)
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(2, 3, 4, generator=g)
    half = torch.tensor(0.5)
    expected = process.schedule.alpha(half) * c + process.schedule.sigma(half) * noise
    torch.testing.assert_close(states[1], expected)
