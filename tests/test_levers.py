"""Learning-efficiency levers of the masked and uniform processes (docs/guide/levers.md): the flat loss
weight, complementary masking, and time conditioning, each checked exactly against the draws
it changes."""

from __future__ import annotations

import pytest
import torch

from cdlm.guidance import WithLabel
from cdlm.networks.transformer import Transformer
from cdlm.processes.complement import with_masked_complement, with_uniform_complement
from cdlm.processes.masked import MaskedProcess
from cdlm.processes.masked_denoiser import MaskedDenoiser
from cdlm.processes.uniform import UniformProcess
from cdlm.processes.uniform_bound import uniform_nelbo
from cdlm.schedules import CosineMaskSchedule, LogLinearMaskSchedule

V, MASK, B, L = 9, 8, 6, 10


class TableNetwork(torch.nn.Module):
    """Logits that depend on each input token only: a fixed random (V, V) table, so that a loss
    can be recomputed by hand from the same draws."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.randn(V, V, generator=torch.Generator().manual_seed(0))
        self.times: list[torch.Tensor] = []

    def forward(self, z, t, **kwargs):
        self.times.append(t)
        return self.table[z]


def tokens_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"tokens": torch.randint(0, MASK, (B, L), generator=g)}


def masked(**levers) -> MaskedProcess:
    return MaskedProcess(V, mask_id=MASK, schedule=CosineMaskSchedule(), **levers)


def uniform(**levers) -> UniformProcess:
    return UniformProcess(V, schedule=CosineMaskSchedule(), **levers)


def nll(den, c) -> torch.Tensor:
    """(B, L) -log p(x0) of the denoiser at a corruption."""
    logp = den(c.x_t, c.t).logits
    return -logp.gather(-1, c.tokens[..., None]).squeeze(-1)


def test_flat_weight_trains_on_the_plain_masked_ce_and_validates_the_bound():
    den, batch = MaskedDenoiser(TableNetwork(), MASK), tokens_batch()
    flat, elbo = masked(flat_weight=True).train(), masked().train()
    loss = flat.loss(den, batch, torch.Generator().manual_seed(5)).loss
    g = torch.Generator().manual_seed(5)  # the same draws, by hand: t, then the masks
    c = flat.corrupt(batch["tokens"], flat.sample_t(B, g), g)
    torch.testing.assert_close(loss, (nll(den, c) * c.noisy).sum() / (B * L))  # weight 1
    weighted = (elbo.weight(c.t)[:, None] * nll(den, c) * c.noisy).sum() / (B * L)
    torch.testing.assert_close(
        elbo.loss(den, batch, torch.Generator().manual_seed(5)).loss, weighted
    )
    assert not torch.allclose(loss, weighted)
    # validation reports the bound whatever trained the model
    flat.eval(), elbo.eval()
    for seed in range(3):
        pair = [p.loss(den, batch, torch.Generator().manual_seed(seed)).loss for p in (flat, elbo)]
        torch.testing.assert_close(*pair)


def test_flat_weight_drops_the_uniform_elbo_factor_in_training_only():
    network = TableNetwork()
    den, batch = uniform().make_denoiser(network), tokens_batch()
    flat, elbo = uniform(flat_weight=True).train(), uniform().train()
    loss = flat.loss(den, batch, torch.Generator().manual_seed(7)).loss
    g = torch.Generator().manual_seed(7)
    c = flat.corrupt(batch["tokens"], flat.sample_t(B, g), g)
    logp = den(c.x_t, c.t).logits
    keep, dkeep = flat.schedule.keep(c.t), flat.schedule.dkeep(c.t)
    per = uniform_nelbo(logp, c.x_t, c.tokens, keep, dkeep)
    factor = (dkeep / keep).abs().double()[:, None]  # alpha' / alpha, per row
    torch.testing.assert_close(loss.double(), (per / factor).sum() / (B * L))
    torch.testing.assert_close(
        elbo.loss(den, batch, torch.Generator().manual_seed(7)).loss.double(), per.sum() / (B * L)
    )
    flat.eval(), elbo.eval()
    pair = [p.loss(den, batch, torch.Generator().manual_seed(8)).loss for p in (flat, elbo)]
    torch.testing.assert_close(*pair)


def assert_complementary_rates(process, t, t_other):
    """keep(t') = 1 - keep(t) wherever the schedule reaches that rate (its keep stays within
    [keep(1), keep(t_min)]: the complement of an almost clean row is clamped to t = 1)."""
    ends = process.schedule.keep(torch.tensor([1.0, process.t_min]))
    want = 1 - process.schedule.keep(t)
    reachable = (want >= ends[0]) & (want <= ends[1])
    assert reachable.sum() >= B - 1
    got = process.schedule.keep(t_other)
    torch.testing.assert_close(got[reachable], want[reachable], atol=1e-5, rtol=0)
    torch.testing.assert_close(t_other[~reachable], torch.ones_like(t_other[~reachable]))


def test_masked_complement_partitions_the_positions_at_the_complementary_rate():
    process, tokens = masked(), tokens_batch()["tokens"]
    g = torch.Generator().manual_seed(2)
    c = process.corrupt(tokens, process.sample_t(B, g), g)
    pair = with_masked_complement(c, process.schedule, MASK, process.t_min)
    first, second = pair.noisy[:B], pair.noisy[B:]
    assert bool((first ^ second).all())  # every position masked in exactly one half
    assert torch.equal(pair.x_t[B:], torch.where(c.noisy, tokens, MASK))
    assert torch.equal(pair.x_t[:B], c.x_t) and torch.equal(pair.tokens[B:], tokens)
    assert_complementary_rates(process, c.t, pair.t[B:])


def test_uniform_complement_redraws_what_the_first_kept_and_keeps_what_it_redrew():
    process, tokens = uniform(), tokens_batch()["tokens"]
    g = torch.Generator().manual_seed(3)
    c = process.corrupt(tokens, process.sample_t(B, g), g)
    state = g.get_state()
    pair = with_uniform_complement(c, process.schedule, process.support, process.t_min, g)
    assert bool((pair.noisy[:B] ^ pair.noisy[B:]).all())
    second = pair.x_t[B:]
    assert torch.equal(second[c.noisy], tokens[c.noisy])  # the first's redrawn tokens, clean
    noise = torch.randint(V, (B, L), generator=torch.Generator().set_state(state))
    assert torch.equal(second[~c.noisy], noise[~c.noisy])  # the kept ones: a fresh draw
    assert_complementary_rates(process, c.t, pair.t[B:])


@pytest.mark.parametrize("make", [masked, uniform])
def test_complementary_loss_is_the_mean_of_both_halves(make):
    process, batch = make(complementary=True).train(), tokens_batch()
    den = process.make_denoiser(TableNetwork())
    loss = process.loss(den, batch, torch.Generator().manual_seed(4)).loss
    g = torch.Generator().manual_seed(4)
    c = process.corrupt(batch["tokens"], process.sample_t(B, g), g)
    if make is masked:
        pair = with_masked_complement(c, process.schedule, MASK, process.t_min)
        valid = torch.ones(2 * B, L, dtype=torch.bool)
        rows, _ = process.elbo_terms(den(pair.x_t, pair.t).logits, pair, valid)
    else:
        pair = with_uniform_complement(c, process.schedule, process.support, process.t_min, g)
        valid = torch.ones(2 * B, L, dtype=torch.bool)
        rows = process.elbo_terms(den(pair.x_t, pair.t).logits, pair, valid)
    halves = [rows[:B].sum() / (B * L), rows[B:].sum() / (B * L)]
    torch.testing.assert_close(loss.double(), ((halves[0] + halves[1]) / 2).double())
    process.eval()  # validation scores one corruption per sequence: the bound
    out = process.loss(den, batch, torch.Generator().manual_seed(4)).loss
    torch.testing.assert_close(
        out, make().eval().loss(den, batch, torch.Generator().manual_seed(4)).loss
    )


def test_complementary_masking_never_masks_a_held_prompt():
    process, batch = masked(complementary=True).train(), tokens_batch()
    batch["prompt"] = torch.zeros(B, L, dtype=torch.bool)
    batch["prompt"][:, :3] = True
    network = TableNetwork()
    seen = []
    den = MaskedDenoiser(network, MASK)
    process.loss(lambda z, t, **kw: seen.append(z) or den(z, t, **kw), batch, None)
    assert seen[0].shape == (2 * B, L) and not (seen[0][:, :3] == MASK).any()


def small_transformer(process) -> Transformer:
    torch.manual_seed(0)
    network = Transformer(
        **process.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=L
    )
    with torch.no_grad():
        for p in network.parameters():
            p.add_(0.3 * torch.randn_like(p))  # the time embedding's output layer starts at 0
    return network.eval()


def test_the_masked_denoiser_feeds_the_network_no_time():
    """MDLM Sec. 3.4: the count of masks tells the network its level. A network that reads
    time (ours does) still sees 0 at every level, so predictions are the same at every t."""
    process = masked()
    network = small_transformer(process)
    den = process.make_denoiser(network)
    z = torch.where(torch.rand(B, L, generator=torch.Generator().manual_seed(0)) < 0.5, MASK, 1)
    low, high = (den(z, torch.full((B,), t)).logits for t in (0.05, 0.95))
    assert torch.equal(low, high)
    assert not torch.allclose(
        network(z, torch.full((B,), 0.05)), network(z, torch.full((B,), 0.95))
    )
    spy = TableNetwork()
    MaskedDenoiser(spy, MASK)(z, torch.full((B,), 0.7))
    assert torch.equal(spy.times[0], torch.zeros(B))


@pytest.mark.parametrize("conditioned", [True, False])
def test_uniform_time_conditioning_switch(conditioned):
    process = uniform(time_conditioning=conditioned)
    den = process.make_denoiser(small_transformer(process))
    z = torch.randint(V, (B, L), generator=torch.Generator().manual_seed(0))
    low, high = (den(z, torch.full((B,), t)).logits for t in (0.05, 0.95))
    assert torch.equal(low, high) != conditioned


def test_levers_compose_with_a_log_linear_masked_process_from_the_config_keys():
    process = MaskedProcess(
        V, mask_id=MASK, schedule=LogLinearMaskSchedule(), flat_weight=True, complementary=True
    ).train()
    out = process.loss(MaskedDenoiser(TableNetwork(), MASK), tokens_batch(), None)
    assert out.loss.isfinite() and out.observation[0].shape[0] <= 2 * B


@pytest.mark.parametrize("make", [masked, uniform])
def test_complementary_masking_gives_each_half_its_rows_labels(make):
    """A class-conditional run (the Austen default) binds one label per sequence; the
    complement stacked below the batch reads the same labels, row for row."""
    process, batch = make(complementary=True).train(), tokens_batch()
    labels = torch.arange(B) % 3
    seen = []

    class Labelled(TableNetwork):
        def forward(self, z, t, label=None, **kwargs):
            seen.append(label)
            return super().forward(z, t)

    process.loss(WithLabel(process.make_denoiser(Labelled()), labels), batch)
    assert torch.equal(seen[0], labels.repeat(2))
