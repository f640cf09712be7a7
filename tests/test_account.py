"""The per-level account of the gaussian bound (cdlm/likelihood/account.py) on a one-position,
two-token world whose exact denoiser is written here: by the I-MMSE relation (Guo, Shamai and
Verdu 2005) its diffusion term over a wide log-SNR range is the entropy of the token, a closed
form; the no-context readout is exact where the prior is uniform; training's share of each bin
is the time sampler's mass between the bin's edges."""

from __future__ import annotations

import math

import torch

from cdlm.denoiser import Prediction, readout_evidence
from cdlm.likelihood.account import account, training_share
from cdlm.processes.gaussian import GaussianProcess
from cdlm.time_samplers import TimeSampler


def exact(process: GaussianProcess, prior: torch.Tensor):
    """The posterior-mean denoiser of one token drawn from ``prior`` (V,)."""

    def denoise(x_t, t, self_cond=None, **kwargs):
        logits = prior.log()[None, None] + readout_evidence(
            process.embedding, process.schedule, x_t, t
        )
        return Prediction(logits, torch.softmax(logits, -1) @ process.embedding.table())

    return denoise


def setup(p0: float, n: int = 4000):
    torch.manual_seed(0)
    process = GaussianProcess(vocab_size=2, embed_dim=4, time_sampler=TimeSampler()).eval()
    prior = torch.tensor([p0, 1 - p0])
    tokens = torch.multinomial(
        prior, n, replacement=True, generator=torch.Generator().manual_seed(1)
    )
    return process, prior, tokens[:, None]


def entropy_bits(p0: float) -> float:
    return -sum(p * math.log2(p) for p in (p0, 1 - p0))


def test_the_exact_denoisers_bound_is_the_tokens_entropy_and_the_model_equal_to_it_has_no_excess():
    process, prior, tokens = setup(0.8)
    truth = exact(process, prior)
    split = account(process, truth, truth, tokens, bins=40, per_bin=4,
                    generator=torch.Generator().manual_seed(2))  # fmt: skip
    assert abs(split.total("reference") - entropy_bits(0.8)) < 0.03  # 0.722 bits
    assert split.total("model") == split.total("reference") and split.excess_se == 0.0
    assert split.prior < 1e-3 and split.reconstruction < 1e-3
    assert split.total("no_context") > split.total("reference") + 0.1  # it ignores the prior


def test_a_uniform_token_prior_makes_the_no_context_readout_exact_bin_by_bin():
    process, prior, tokens = setup(0.5, n=256)
    truth = exact(process, prior)
    split = account(process, truth, truth, tokens, bins=10, per_bin=2,
                    generator=torch.Generator().manual_seed(3))  # fmt: skip
    torch.testing.assert_close(split.no_context, split.reference, rtol=1e-5, atol=1e-9)
    rows = split.rows()
    assert len(rows) == 10 and abs(sum(r["bound_share"] for r in rows) - 1) < 1e-9


def test_trainings_share_of_a_bin_is_the_time_samplers_mass_between_its_edges():
    process, _, _ = setup(0.5)
    edges = torch.linspace(-10, 10, 6, dtype=torch.float64)
    share = training_share(process.train(), edges, torch.Generator().manual_seed(4))
    t = process.schedule.t_from_logsnr(edges)  # uniform t: the mass is the span of t
    torch.testing.assert_close(share, (t[:-1] - t[1:]).double(), atol=1e-4, rtol=0)
