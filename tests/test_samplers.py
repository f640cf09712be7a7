"""Every gaussian sampler passes the same contract checks."""

import functools

import pytest
import torch

from cdlm.denoiser import Prediction
from cdlm.processes.gaussian import GaussianProcess
from cdlm.samplers import SAMPLERS, check_compatible, sample_ddim, sample_ddpm, uniform_grid
from cdlm.samplers.gaussian import step_ddim, step_ddpm

GAUSSIAN_SAMPLERS = [sample_ddpm, sample_ddim]


def make_process():
    torch.manual_seed(0)
    return GaussianProcess(vocab_size=20, embed_dim=6).double()


class Oracle:
    """Returns the true clean data, whatever it is given."""

    def __init__(self, x0, vocab_size):
        self.x0, self.vocab_size, self.calls = x0, vocab_size, 0

    def __call__(self, x_t, t, self_cond=None):
        self.calls += 1
        return Prediction(x0=self.x0, logits=torch.zeros(*self.x0.shape[:2], self.vocab_size))


@pytest.mark.parametrize("sampler", GAUSSIAN_SAMPLERS)
@pytest.mark.parametrize("steps", [1, 7, 50])
def test_oracle_reproduces_data_and_counts_nfe(sampler, steps):
    process = make_process()
    x0 = process.embedding(torch.randint(0, 20, (3, 9)))
    oracle = Oracle(x0, 20)
    g = torch.Generator().manual_seed(1)
    x = process.prior((3, 9), torch.device("cpu"), g).double()
    seen = []
    out = sampler(
        oracle, x, uniform_grid(steps), process=process, generator=g, callback=seen.append
    )
    torch.testing.assert_close(out.x, x0, atol=1e-12, rtol=0)
    assert out.nfe == steps == oracle.calls == len(seen)
    assert [s.i for s in seen] == list(range(steps))
    assert seen[0].t == 1.0 and seen[-1].s == 0.0


@pytest.mark.parametrize("sampler", GAUSSIAN_SAMPLERS)
def test_oracle_trajectory_stays_on_the_forward_marginal(sampler):
    """With the true x0, every intermediate state is alpha x0 + sigma * (unit-variance noise)."""
    process = make_process()
    x0 = process.embedding(torch.randint(0, 20, (128, 64))).detach()
    g = torch.Generator().manual_seed(2)
    x = process.prior((128, 64), torch.device("cpu"), g).double()
    states = []
    sampler(
        Oracle(x0, 20), x, uniform_grid(10), process=process, generator=g, callback=states.append
    )
    for st in states[:-1]:
        s = torch.tensor(st.s, dtype=torch.float64)
        eps = (st.x - process.schedule.alpha(s) * x0) / process.schedule.sigma(s)
        assert eps.mean().abs() < 0.03 and (eps.var() - 1).abs() < 0.04


@pytest.mark.parametrize("sampler", GAUSSIAN_SAMPLERS)
def test_fixed_seed_is_deterministic(sampler):
    process = make_process()
    den = lambda x, t, sc=None: Prediction(x0=torch.tanh(x), logits=x[..., :3])  # noqa: E731
    runs = []
    for _ in range(2):
        g = torch.Generator().manual_seed(7)
        x = process.prior((2, 5), torch.device("cpu"), g).double()
        runs.append(sampler(den, x, uniform_grid(6), process=process, generator=g).x)
    torch.testing.assert_close(runs[0], runs[1], atol=0, rtol=0)


def test_ddim_eta_one_has_the_ddpm_posterior_moments():
    a_t, s_t = torch.tensor(0.6), torch.tensor(0.8)
    a_s, s_s = torch.tensor(0.9), torch.tensor(0.1).sqrt() * torch.tensor(1.9).sqrt()
    s_s = (1 - a_s**2).sqrt()
    x, x0 = torch.randn(4000, 8), torch.randn(4000, 8)
    zero = torch.zeros_like(x)
    torch.testing.assert_close(
        step_ddim(x, x0, a_t, s_t, a_s, s_s, zero, eta=1.0),
        step_ddpm(x, x0, a_t, s_t, a_s, s_s, zero),
        atol=1e-6,
        rtol=1e-6,
    )
    unit = torch.ones_like(x)
    torch.testing.assert_close(
        step_ddim(x, x0, a_t, s_t, a_s, s_s, unit, eta=1.0)
        - step_ddim(x, x0, a_t, s_t, a_s, s_s, zero, eta=1.0),
        step_ddpm(x, x0, a_t, s_t, a_s, s_s, unit) - step_ddpm(x, x0, a_t, s_t, a_s, s_s, zero),
        atol=1e-6,
        rtol=1e-6,
    )


def test_incompatible_process_is_refused_with_the_fitting_list(monkeypatch):
    monkeypatch.setitem(SAMPLERS, "toy_a", ("toy",))
    monkeypatch.setitem(SAMPLERS, "toy_b", ("toy", "gaussian"))
    with pytest.raises(
        ValueError, match="'ddim' does not fit a 'toy' model; use one of: toy_a, toy_b"
    ):
        check_compatible(sample_ddim, "toy")
    with pytest.raises(ValueError, match="no registered sampler"):
        check_compatible(sample_ddim, "nothing")
    check_compatible(sample_ddim, "gaussian")
    check_compatible(functools.partial(sample_ddim, eta=0.5), "gaussian")


def test_bad_grid_and_eta_are_refused():
    with pytest.raises(ValueError, match="steps must be >= 1"):
        uniform_grid(0)
    process = make_process()
    with pytest.raises(ValueError, match="eta"):
        sample_ddim(None, torch.zeros(1, 1, 6), uniform_grid(2), process=process, eta=-1.0)


def test_decode_cuts_at_eos_or_keeps_paragraphs():
    from cdlm.data.corpus import Document
    from cdlm.data.tokenizer import train_bpe, wrap
    from cdlm.generation import decode

    tok = wrap(train_bpe([Document("one two three four " * 30, "x")], 280).to_str())
    a, b = tok("one two")["input_ids"], tok(" three")["input_ids"]
    ids = [*a, tok.eos_token_id, *b, tok.eos_token_id, tok.eos_token_id]
    assert decode(tok, ids).text == "one two" and decode(tok, ids).token_ids == a
    full = decode(tok, ids, cut_at_eos=False)
    assert full.text == "one two\nthree" and full.token_ids == ids
