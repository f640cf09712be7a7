"""The rolling (left-to-right) per-token grid and token drawing of the gaussian samplers."""

import pytest
import torch
from test_ode_samplers import F64, GaussianData, moments, whitened_prior

from cdlm.denoiser import Prediction
from cdlm.samplers import make_grid, sample_ddim, sample_ddpm, sample_rolling
from cdlm.samplers.gaussian import rolling


@pytest.mark.parametrize("steps, length, token_steps", [(10, 4, 3), (40, 7, 16), (8, 1, 8)])
def test_rolling_grid_sweeps_left_to_right(steps, length, token_steps):
    shared = make_grid("uniform", steps)
    grid = rolling(shared, length, token_steps)
    assert grid.shape == (steps + 1, length)
    assert (grid[0] == 1.0).all() and (grid[-1] == 0.0).all()
    moves = grid[:-1] > grid[1:]
    assert (grid[:-1] >= grid[1:]).all() and (moves.sum(0) == token_steps).all()
    # every token walks the same W-step grid (here: the uniform one), later tokens later
    own = torch.linspace(1.0, 0.0, token_steps + 1, dtype=F64)
    for i in range(length):
        torch.testing.assert_close(grid[:, i].unique_consecutive(), own)
    start = moves.float().argmax(0)
    assert start[0] == 0 and (start[1:] >= start[:-1]).all()
    assert moves[:, -1].nonzero().max() == steps - 1  # the last token ends on the last step


def test_rolling_with_every_step_is_the_shared_grid_and_bad_sizes_are_refused():
    shared = make_grid("uniform", 6)
    torch.testing.assert_close(rolling(shared, 5, 6), shared[:, None].expand(7, 5))
    for bad in (0, 7):
        with pytest.raises(ValueError, match="token_steps"):
            rolling(shared, 5, bad)


def test_rolling_ddpm_samples_every_position_from_the_data():
    """Positions of the Gaussian data are independent, so each one's chain is an exact DDPM
    chain on its own grid, whatever the others do: every position must match N(mu, Sigma)
    (Monte Carlo: ~4 standard errors, as in the shared-grid test)."""
    data = GaussianData(logsnr_min=-12.0)
    g = torch.Generator().manual_seed(3)
    x1 = torch.randn(20000, 3, data.d, generator=g, dtype=F64)
    grid = make_grid("uniform", 202, data.schedule)
    out = sample_ddpm(data, x1, grid, process=data.process(), generator=g, token_steps=200)
    assert out.nfe == 202 == data.calls
    for i in range(3):
        mean, cov = moments(out.x[:, i : i + 1])
        torch.testing.assert_close(mean, data.mu, atol=0.04, rtol=0)
        torch.testing.assert_close(cov, data.cov, atol=0.08, rtol=0)


def test_rolling_ddim_carries_each_position_to_the_data_moments():
    data = GaussianData()
    x1 = whitened_prior(2048, data.d).expand(-1, 2, -1)
    grid = make_grid("logsnr", 1025, data.schedule)
    out = sample_ddim(data, x1, grid, process=data.process(), token_steps=1024)
    for i in range(2):
        mean, cov = moments(out.x[:, i : i + 1])
        torch.testing.assert_close(mean, data.mu, atol=2e-3, rtol=0)
        torch.testing.assert_close(cov, data.cov, atol=1e-2, rtol=0)


def test_waiting_tokens_keep_the_prior_and_decided_tokens_keep_their_value():
    data = GaussianData()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 6, data.d, generator=g, dtype=F64)
    states = []
    grid = make_grid("uniform", 12, data.schedule)
    out = sample_ddpm(
        data, x, grid, process=data.process(), generator=g, callback=states.append, token_steps=4
    )
    levels = rolling(grid, 6, 4)
    assert len(states) == out.nfe == 12 and states[-1].x is out.x
    for k, state in enumerate(states):
        waiting, done = levels[k + 1] == 1.0, levels[k] == 0.0
        torch.testing.assert_close(state.x[:, waiting], x[:, waiting], atol=0, rtol=0)
        if k and done.any():
            torch.testing.assert_close(state.x[:, done], states[k - 1].x[:, done], atol=0, rtol=0)
    again = torch.Generator().manual_seed(5)
    x2 = torch.randn(2, 6, data.d, generator=again, dtype=F64)
    rerun = sample_ddpm(data, x2, grid, process=data.process(), generator=again, token_steps=4)
    torch.testing.assert_close(rerun.x, out.x, atol=0, rtol=0)


class FixedLogits:
    """Predicts the same token distribution everywhere, with x0 its mean embedding."""

    def __init__(self, logits, table):
        self.logits, self.table = logits, table

    def __call__(self, x, t, self_cond=None):
        logits = self.logits.expand(*x.shape[:2], -1)
        return Prediction(x0=torch.softmax(logits, -1) @ self.table, logits=logits)


@pytest.mark.parametrize("token_steps", [None, 1])
def test_draw_tokens_draws_from_the_prediction_and_writes_its_embedding(token_steps):
    data = GaussianData()
    process = data.process()
    table = process.embedding.table().detach()
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)
    den = FixedLogits(p.log(), table)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4000, 5, data.d, generator=g, dtype=F64)
    grid = make_grid("uniform", 5 if token_steps else 2, data.schedule)
    out = sample_ddpm(
        den, x, grid, process=process, generator=g, token_steps=token_steps, draw_tokens=True
    )
    freq = torch.bincount(out.tokens.flatten(), minlength=4) / out.tokens.numel()
    assert (freq - p).abs().max() < 4 * (0.25 / out.tokens.numel()) ** 0.5
    torch.testing.assert_close(out.x, table[out.tokens])
    greedy = sample_ddpm(den, x, grid, process=process, generator=g, token_steps=token_steps)
    assert (greedy.tokens == 3).all()
    torch.testing.assert_close(greedy.x, den(x, None).x0)


class LeftNeighbour:
    """An oracle for a Markov chain of tokens: position 0 predicts ``first``, position i > 0
    the row of ``transition`` of the token whose embedding is nearest to x[:, i - 1]. A
    left-to-right sampler that decides each token with its left neighbour already written as a
    clean embedding therefore draws exact chains; one that decides it from a noisy neighbour,
    or by argmax, or at another temperature, does not."""

    def __init__(self, first, transition, table):
        self.first, self.transition, self.table = first.log(), transition.log(), table

    def __call__(self, x, t, self_cond=None):
        nearest = torch.cdist(x, self.table.expand(len(x), -1, -1)).argmin(-1)
        logits = torch.cat([self.first.expand(len(x), 1, -1), self.transition[nearest[:, :-1]]], 1)
        return Prediction(x0=torch.softmax(logits, -1) @ self.table, logits=logits)


@pytest.mark.parametrize("token_steps", [1, 2])
def test_rolling_sampler_draws_a_markov_chain_left_to_right(token_steps):
    """With K = length - 1 + token_steps steps token i starts i steps after token 0, so its last
    step comes after token i - 1 is drawn: the samples must follow the chain at temperature 0.5,
    first token ~ p^2 and transitions ~ T[a]^2 (renormalised). Monte Carlo over 12000 chains:
    tolerances ~4 standard errors."""
    data = GaussianData()
    process = data.process()
    table = process.embedding.table().detach()
    first = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)
    transition = torch.tensor(
        [[0.1, 0.6, 0.2, 0.1], [0.1, 0.1, 0.6, 0.2], [0.2, 0.1, 0.1, 0.6], [0.6, 0.2, 0.1, 0.1]],
        dtype=F64,
    )
    den = LeftNeighbour(first, transition, table)
    length, n = 5, 12000
    grid = make_grid("uniform", length - 1 + token_steps, data.schedule)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(n, length, data.d, generator=g, dtype=F64)
    out = sample_rolling(
        den, x, grid, process=process, generator=g, token_steps=token_steps, temperature=0.5
    )
    assert out.nfe == len(grid) - 1
    torch.testing.assert_close(out.x, table[out.tokens])
    tempered = first**2 / (first**2).sum()
    freq = torch.bincount(out.tokens[:, 0], minlength=4) / n
    assert (freq - tempered).abs().max() < 4 * (0.25 / n) ** 0.5, (freq, tempered)
    expected = transition**2 / (transition**2).sum(-1, keepdim=True)
    prev, nxt = out.tokens[:, :-1].flatten(), out.tokens[:, 1:].flatten()
    pairs = torch.zeros(4, 4, dtype=F64).index_put_(
        (prev, nxt), torch.ones(len(prev), dtype=F64), True
    )
    observed = pairs / pairs.sum(-1, keepdim=True)
    bound = 4 * (0.25 / pairs.sum(-1, keepdim=True)) ** 0.5
    assert ((observed - expected).abs() < bound).all(), (observed, expected)
    with pytest.raises(ValueError, match="temperature"):
        sample_rolling(den, x, grid, process=process, temperature=0.0)
