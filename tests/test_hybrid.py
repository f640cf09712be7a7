"""CANDI's hybrid corruption of the gaussian process (issue 39's second lever): the corruption
by its definition, its loss unbiased against a Monte Carlo of its definition (float64), its
sampler, and a CLI train + sample round trip."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import run_main, train_tiny

from cdlm.denoiser import Prediction
from cdlm.model_file import load_model
from cdlm.networks.transformer import Transformer
from cdlm.processes import GaussianProcess
from cdlm.processes.hybrid import HybridMasking
from cdlm.processes.inputs import PosteriorInput, VectorInput
from cdlm.samplers import uniform_grid
from cdlm.samplers.hybrid import sample_hybrid
from cdlm.schedules import CosineMaskSchedule

V, D, L = 5, 3, 3
F64 = torch.float64


def built() -> tuple[GaussianProcess, Transformer]:
    """A float64 hybrid process on a cosine masking schedule (a weight that is not 1/t) and a
    seeded one-layer network nudged off its identity start."""
    torch.manual_seed(0)
    hybrid = HybridMasking(CosineMaskSchedule())
    proc = GaussianProcess(V, embed_dim=D, input=PosteriorInput(), hybrid=hybrid).double()
    net = Transformer(**proc.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=8)
    with torch.no_grad():
        for q in net.parameters():
            q.add_(0.3 * torch.randn_like(q))
    return proc, net.double().eval()


def test_the_corruption_follows_its_definition():
    proc, _ = built()
    ids = torch.randint(0, V, (4000, L), generator=torch.Generator().manual_seed(1))
    t = torch.full((4000,), 0.3, dtype=F64)
    c = proc.corrupt(ids, t, torch.Generator().manual_seed(2))
    x0 = proc.embedding(ids)
    anchors = ~c.noisy
    assert torch.equal(c.x_t[anchors], x0[anchors]) and bool((c.t[anchors] == 0).all())
    assert bool((c.t[c.noisy] == 0.3).all())
    noised = proc.noised(x0, c.t, c.noise)
    torch.testing.assert_close(c.x_t[c.noisy], noised[c.noisy])
    share = 1 - float(proc.hybrid.mask_schedule.keep(torch.tensor(0.3, dtype=F64)))
    se = math.sqrt(share * (1 - share) / c.noisy.numel())
    assert abs(c.noisy.double().mean().item() - share) < 5 * se


def definition(proc, denoiser, x: torch.Tensor, draws: int) -> tuple[float, float]:
    """The hybrid loss of one sequence x (L,) from its definition, built here and not by the
    process: ``draws`` times t ~ U(0, 1), at each every corruption pattern m enumerated with
    its probability and one Gaussian draw, E_t[w(t) sum_m P(m | t) sum_i m_i CE_i / L].
    Returns the estimate and its standard error."""
    g = torch.Generator().manual_seed(11)
    t = torch.rand(draws, generator=g, dtype=F64)
    schedule, x0 = proc.hybrid.mask_schedule, proc.embedding(x)[None]
    keep = schedule.keep(t)
    weight = -schedule.dkeep(t) / (1 - keep)
    alpha, sigma = (f(t)[:, None, None] for f in (proc.schedule.alpha, proc.schedule.sigma))
    per_t = torch.zeros(draws, dtype=F64)
    for m in itertools.product([False, True], repeat=L):
        m = torch.tensor(m)
        if not m.any():  # the all-clean pattern scores nothing
            continue
        p = keep ** (~m).sum() * (1 - keep) ** m.sum()
        eps = torch.randn(draws, L, D, generator=g, dtype=F64)
        x_t = torch.where(m[None, :, None], alpha * x0 + sigma * eps, x0)
        levels = torch.where(m, t[:, None], torch.zeros((), dtype=F64))
        logits = denoiser(x_t, levels).logits
        ce = F.cross_entropy(logits.transpose(1, 2), x.expand(draws, L), reduction="none")
        per_t += p * weight * (ce * m).sum(-1) / L
    return per_t.mean().item(), per_t.std().item() / math.sqrt(draws)


def test_the_loss_is_unbiased_against_a_monte_carlo_of_its_definition():
    """The eval-mode loss (stratified times, a fresh pattern and draw per row) averaged over
    seeded batches matches the definition within 4 combined standard errors."""
    proc, net = built()
    proc.eval()
    den = proc.make_denoiser(net)
    x = torch.tensor([1, 3, 2])
    with torch.no_grad():
        expected, se_def = definition(proc, den, x, draws=20000)
        batch = {"tokens": x.expand(128, L)}
        losses = torch.tensor(
            [
                proc.loss(den, batch, torch.Generator().manual_seed(s)).loss.item()
                for s in range(100)
            ]
        )
    mean, se = losses.mean().item(), losses.std().item() / math.sqrt(len(losses))
    assert abs(mean - expected) < 4 * math.hypot(se, se_def), (mean, expected, se, se_def)


def test_the_per_token_terms_are_the_weighted_cross_entropy_of_the_corrupted_tokens():
    proc, net = built()
    proc.eval()
    seen = {}

    def recording(x_t, t, self_cond=None):
        pred = proc.make_denoiser(net)(x_t, t, self_cond)
        seen["logits"], seen["levels"] = pred.logits, t
        return pred

    x = torch.randint(0, V, (6, L), generator=torch.Generator().manual_seed(3))
    loss = proc.loss(recording, {"tokens": x}, torch.Generator().manual_seed(4)).loss
    levels = seen["levels"]
    noisy = levels > 0
    rows = levels.max(-1).values  # the rows' times, where a row has a corrupted token
    keep = proc.hybrid.mask_schedule.keep(rows)
    w = torch.where(noisy.any(-1), -proc.hybrid.mask_schedule.dkeep(rows) / (1 - keep), 0.0)
    ce = F.cross_entropy(seen["logits"].transpose(1, 2), x, reduction="none")
    assert bool(noisy.any())
    torch.testing.assert_close(loss, (w[:, None] * ce * noisy).sum() / x.numel())


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="token_noise=0"):
        GaussianProcess(V, input=PosteriorInput(), token_noise=1.0, hybrid=HybridMasking())
    with pytest.raises(ValueError, match="anchors"):
        GaussianProcess(V, input=VectorInput(), hybrid=HybridMasking())
    proc = GaussianProcess(V, embed_dim=D, input=PosteriorInput())
    net = Transformer(**proc.network_kwargs, d_model=16, n_layers=1, n_heads=2)
    grid = uniform_grid(2)
    with pytest.raises(ValueError, match="process.hybrid"):
        sample_hybrid(proc.make_denoiser(net), torch.randn(1, L, D), grid, process=proc)


def test_the_sampler_reveals_at_the_forward_rate_and_an_oracle_gets_the_data_back():
    """Each step reveals (keep(s) - keep(t)) / (1 - keep(t)) of the corrupted tokens (5 SE),
    the revealed ones exact embeddings; the run ends on anchors only, the data itself."""
    proc, _ = built()
    n, steps = 1000, 6
    data = torch.randint(0, V, (n, L), generator=torch.Generator().manual_seed(5))
    x0 = proc.embedding(data).detach()
    point = torch.full((n, L, V), -1e30, dtype=F64).scatter_(-1, data[..., None], 0.0)

    def oracle(x_t, t, self_cond=None, **kw):
        return Prediction(logits=point, x0=x0)

    seen, grid = [], uniform_grid(steps).to(F64)
    out = sample_hybrid(
        oracle,
        torch.randn(n, L, D, dtype=F64),
        grid,
        process=proc,
        generator=torch.Generator().manual_seed(0),
        callback=seen.append,
    )
    assert torch.equal(out.tokens, data) and out.nfe == steps == len(seen)
    torch.testing.assert_close(out.x, x0)
    before = torch.zeros(n, L, dtype=torch.bool)
    for step in seen[:-1]:
        anchors = (step.x == x0).all(-1)
        assert bool(anchors[before].all())  # an anchor stays
        t, s = (torch.tensor(v, dtype=F64) for v in (step.t, step.s))
        rate = float(proc.hybrid.unmask_share(t, s))
        left = int((~before).sum())
        se = math.sqrt(rate * (1 - rate) / left)
        assert abs(int((anchors & ~before).sum()) / left - rate) < 5 * se + 1e-12
        before = anchors


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_corpus):
    return train_tiny(tmp_path_factory, tiny_corpus, "recipe=candi")


def test_cli_trains_and_samples_the_hybrid(trained, tmp_path):
    model = load_model(trained)
    assert isinstance(model.process.hybrid, HybridMasking)
    assert model.process.default_sampler == "hybrid"
    out = tmp_path / "s.jsonl"
    args = (f"ckpt={trained}", "steps=4", "num_samples=2", f"out={out}")
    result = run_main("cdlm-sample", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and all(r["nfe"] == 4 for r in records)


def test_levels_given_per_token_are_taken_as_given():
    """A caller that chooses each token's level (``context_ceiling``) gets exactly those levels:
    the hybrid draw is for one time per row."""
    proc, _ = built()
    ids = torch.randint(0, V, (2, L), generator=torch.Generator().manual_seed(1))
    levels = torch.tensor([[0.0, 0.5, 0.9], [0.9, 0.9, 0.2]], dtype=F64)
    c = proc.corrupt(ids, levels, torch.Generator().manual_seed(2))
    assert torch.equal(c.t, levels) and bool(c.noisy.all())
    torch.testing.assert_close(c.x_t, proc.noised(proc.embedding(ids), levels, c.noise))


def test_the_elbo_says_it_scores_the_pure_gaussian_process(trained, tiny_corpus, tmp_path):
    """``cdlm-eval metric=elbo`` on a hybrid model is a bound of every token noised, not of the
    anchored process the model trained on: its line and its record say so."""
    out = tmp_path / "elbo.json"
    args = (f"ckpt={trained}", "metric=elbo", f"data.path={tiny_corpus}", "batch_size=2")
    args += ("num_batches=1", "wandb=false", f"out={out}")
    result = run_main("cdlm-eval", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    scope = "the reverse SDE of pure Gaussian noise on every token"
    assert f"elbo of {scope}" in result.stdout
    assert json.loads(out.read_text())["scores"] == scope
