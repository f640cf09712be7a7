"""Block diffusion and cached decoding: the KV cache changes no logit, block size 1 is the AR
NLL, oracles come back exactly through every sampler and cache, threshold decoding commits."""

import math

import pytest
import torch

from cdlm.denoiser import Prediction
from cdlm.networks.transformer import Transformer
from cdlm.processes.block import BlockProcess, vectorised_mask
from cdlm.processes.masked import MaskedProcess
from cdlm.samplers import uniform_grid
from cdlm.samplers.blockwise import sample_block
from cdlm.samplers.masked import (
    sample_ancestral,
    sample_entropy_bounded,
    sample_threshold,
    sample_topk,
)
from cdlm.samplers.masked_steps import Interval, step_entropy_bounded, step_threshold
from cdlm.schedules import LogLinearMaskSchedule

V, MASK, EOS = 12, 11, 0


def network(process) -> Transformer:
    torch.manual_seed(0)
    net = Transformer(d_model=16, n_layers=2, n_heads=2, max_seq_len=40, **process.network_kwargs)
    for p in net.parameters():  # leave the identity init: attention must matter
        p.data += 0.1 * torch.randn_like(p)
    return net.double().eval()


def block_process(size: int = 4, eps: float = 1e-3) -> BlockProcess:
    return BlockProcess(V, MASK, block_size=size, eos_id=EOS, schedule=LogLinearMaskSchedule(eps))


def test_vectorised_mask_is_bd3lm_s():
    m = vectorised_mask(4, 2)
    noisy, clean = m[:4], m[4:]
    assert noisy[:, :4].tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
    assert noisy[:, 4:].tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]]
    assert not clean[:, :4].any()
    assert clean[:, 4:].tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]


@pytest.mark.parametrize("size", [1, 4])
def test_cached_logits_equal_the_one_pass_training_logits(size):
    """A block's logits read against the KV cache of its clean past (written block by block),
    recomputed without a cache, and from the vectorised x_t ⊕ x0 training pass all agree."""
    process = block_process(size)
    net = network(process)
    den = process.make_denoiser(net)
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, V - 1, (2, 12), generator=g)
    noisy = torch.where(torch.rand(clean.shape, generator=g) < 0.5, MASK, clean)
    t = torch.full((2,), 0.5, dtype=torch.float64)
    with torch.no_grad():
        full = den(noisy, t, clean=clean).logits
        cache = net.new_cache()
        for a in range(0, 12, size):
            block = torch.arange(a, min(a + size, 12))
            canvas = torch.cat([clean[:, :a], noisy[:, a:]], 1)  # the past is clean
            with cache.read_only():
                cached = den(canvas, t, positions=block, cache=cache).logits
            uncached = den(canvas, t, positions=block).logits
            torch.testing.assert_close(cached, full[:, block], atol=1e-10, rtol=0)
            torch.testing.assert_close(uncached, full[:, block], atol=1e-10, rtol=0)
            den(clean, t, positions=block, cache=cache)  # write the finished block


def test_block_size_one_bound_is_the_ar_nll():
    """At block size 1 with eps = 0 every position is masked at t = 1 where the ELBO weight is 1,
    so the bound's integrand is the sum of next-token NLLs (each token from its clean past) —
    and the estimator's mean at any t is the same, since weight x P(masked) = 1."""
    process = block_process(1, eps=0.0)
    net = network(process)
    den = process.make_denoiser(net)
    tokens = torch.randint(1, V - 1, (3, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        nll = 0.0
        for i in range(10):  # the AR factorisation: position i masked, its past clean
            canvas = tokens.clone()
            canvas[:, i:] = MASK
            logp = den(canvas, torch.ones(3), positions=torch.tensor([i])).logits[:, 0]
            nll = nll - logp.gather(-1, tokens[:, i : i + 1]).squeeze(-1)
        c = process.corrupt(tokens, torch.ones(3, 10, dtype=torch.float64))
        assert bool(c.noisy.all())
        integrand, _ = process.elbo(den, c, torch.ones_like(tokens, dtype=torch.bool))
        torch.testing.assert_close(integrand, nll, atol=1e-10, rtol=0)
        process.eval()
        draws = [
            process.loss(den, {"tokens": tokens}, torch.Generator().manual_seed(k)).loss
            for k in range(100)
        ]
    mean, spread = torch.stack(draws).mean(), torch.stack(draws).std() / math.sqrt(100)
    assert abs(float(mean - nll.sum() / 30)) < 4 * float(spread)


class Oracle:
    """Puts all mass on the true token at every position it is asked for."""

    def __init__(self, truth, process, network=None):
        self.truth, self.mask_id = truth, process.mask_id
        self.network = network or Transformer(
            out_dim=V, in_vocab=V, d_model=8, n_layers=1, n_heads=2, self_condition=False
        )
        self.calls = 0

    def network_length(self, n):
        return n

    def __call__(self, z, t, self_cond=None, *, positions=None, cache=None, **kw):
        self.calls += 1
        truth = self.truth if positions is None else self.truth[:, positions]
        if cache is not None and not cache.frozen:  # keep the cache's length honest
            for layer in cache:
                layer.extend(*(torch.zeros(z.shape[0], 1, len(positions), 2),) * 2)
        logp = torch.full((*truth.shape, V), -math.inf, dtype=torch.float64)
        return Prediction(logits=logp.scatter_(-1, truth[..., None], 0.0))


@pytest.mark.parametrize(
    ("sampler", "options"),
    [
        (sample_block, {"cache": "prefix"}),
        (sample_block, {"cache": "none"}),
        (sample_block, {"cache": "prefix", "step": step_threshold, "threshold": 0.9}),
        (sample_block, {"cache": "prefix", "step": step_entropy_bounded, "gamma": 1.0}),
        (sample_block, {"cache": "prefix", "steps_per_block": 1}),
    ],
)
def test_block_samplers_return_the_data_with_an_oracle(sampler, options):
    process = block_process(4)
    truth = torch.randint(1, V - 1, (2, 12), generator=torch.Generator().manual_seed(2))
    x = process.prior((2, 12), torch.device("cpu"), None)
    out = sampler(
        Oracle(truth, process),
        x,
        uniform_grid(6),
        process=process,
        generator=torch.Generator().manual_seed(0),
        **options,
    )
    assert torch.equal(out.tokens, truth)


@pytest.mark.parametrize(
    "sampler", [sample_ancestral, sample_topk, sample_threshold, sample_entropy_bounded]
)
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_masked_cached_samplers_return_the_data_with_an_oracle(sampler, cache):
    process = MaskedProcess(V, MASK, EOS)
    truth = torch.randint(1, V - 1, (2, 12), generator=torch.Generator().manual_seed(3))
    x = process.prior((2, 12), torch.device("cpu"), None)
    out = sampler(
        Oracle(truth, process),
        x,
        uniform_grid(6),
        process=process,
        generator=torch.Generator().manual_seed(0),
        block_length=4,
        cache=cache,
    )
    assert torch.equal(out.tokens, truth)


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_refreshing_every_step_equals_no_cache(shift, cache):
    """With the cache refreshed before every step, cached decoding is uncached decoding: greedy
    confidence decoding gives the very same tokens, and the positions processed add up."""
    process = MaskedProcess(V, MASK, EOS, shift=shift)
    net = network(process)
    runs = {}
    for mode in ("none", cache):
        den = process.make_denoiser(net)
        x = process.prior((2, 12), torch.device("cpu"), None)
        runs[mode] = sample_topk(
            den,
            x,
            uniform_grid(6),
            process=process,
            generator=torch.Generator().manual_seed(0),
            block_length=4,
            cache=mode,
            refresh=1 if mode != "none" else None,
        )
    assert torch.equal(runs["none"].tokens, runs[cache].tokens)
    # and without refreshing the approximation runs fewer positions than the whole canvas
    den = process.make_denoiser(net)
    lazy = sample_topk(
        den,
        process.prior((2, 12), torch.device("cpu"), None),
        uniform_grid(6),
        process=process,
        generator=torch.Generator().manual_seed(0),
        block_length=4,
        cache=cache,
    )
    assert lazy.positions < runs["none"].positions


def test_threshold_commits_at_least_one_and_never_changes_a_commit():
    g = torch.Generator().manual_seed(4)
    x = torch.full((3, 8), MASK)
    x[:, :2] = 5
    logits = torch.randn(3, 8, V, generator=g, dtype=torch.float64) * 0.1
    logp = logits.index_fill(-1, torch.tensor([MASK]), -math.inf).log_softmax(-1)  # as SUBS
    iv = Interval(t=1.0, s=0.5, steps_left=3, p_reveal=0.5)
    new = step_threshold(x, logp, x == MASK, iv, g, threshold=0.99)
    assert torch.equal(new[:, :2], x[:, :2])
    assert bool(((new != MASK).sum(-1) >= 3).all())


def test_entropy_bounded_commits_the_surest_within_the_budget_and_never_changes_a_commit():
    """Hand-built entropies at four open positions: 0, ~0.2, ~0.7 and log 5 nats. The summed
    entropy less the largest, prefix by prefix (lowest first), is 0, 0, 0.2, 0.9: gamma = 0
    already takes two (a certain token costs nothing), just under 0.2 two, just over three."""
    x = torch.full((1, 6), MASK)
    x[0, :2] = 5  # committed before: never changed
    rows = [
        torch.tensor([0.0, -math.inf, -math.inf, -math.inf, -math.inf]),  # entropy 0
        torch.tensor([0.0, -3.0, -3.0, -math.inf, -math.inf]),  # ~0.2
        torch.tensor([0.0, -0.5, -1.0, -math.inf, -math.inf]),  # ~0.7 (well under 1.6)
        torch.zeros(5),  # log 5 = 1.61
    ]
    logp = torch.full((1, 6, V), -math.inf, dtype=torch.float64)
    for i, r in enumerate(rows):
        logp[0, 2 + i, :5] = r.double().log_softmax(-1)
    entropy = torch.special.entr(logp[0, 2:].exp()).sum(-1)
    assert entropy.argsort().tolist() == [0, 1, 2, 3]
    cum = entropy.cumsum(0) - entropy  # summed entropy less the largest, prefix by prefix
    iv = Interval(t=1.0, s=0.5, steps_left=3, p_reveal=0.5)
    for gamma, count in [(0.0, 2), (float(cum[2]) - 1e-9, 2), (float(cum[2]) + 1e-9, 3), (9, 4)]:
        g = torch.Generator().manual_seed(0)
        new = step_entropy_bounded(x, logp, x == MASK, iv, g, gamma=gamma)
        assert torch.equal(new[:, :2], x[:, :2])
        decided = (new[0, 2:] != MASK).tolist()
        assert decided == [True] * count + [False] * (4 - count), gamma
    last = Interval(t=0.5, s=0.0, steps_left=1, p_reveal=1.0)
    assert bool((step_entropy_bounded(x, logp, x == MASK, last, g, gamma=0.0) != MASK).all())


def test_cache_choices_that_do_not_fit_are_refused():
    process = block_process(4)
    x = process.prior((1, 8), torch.device("cpu"), None)
    with pytest.raises(ValueError, match="no suffix to cache"):
        sample_block(Oracle(x, process), x, uniform_grid(2), process=process, cache="dual")
    masked = MaskedProcess(V, MASK, EOS)
    with pytest.raises(ValueError, match="block_length"):
        sample_ancestral(Oracle(x, masked), x, uniform_grid(2), process=masked, cache="dual")


def test_block_process_trains_from_the_cli_and_samples(tmp_path, tiny_corpus):
    """cdlm-train process=block process.block_size=4 trains in one pass over x_t ⊕ x0, and
    cdlm-sample decodes it with the KV cache by default."""
    from conftest import TINY_TRAIN, run_cli

    run = tmp_path / "run"
    result = run_cli(
        "cdlm-train",
        "process=block",
        "process.block_size=4",
        f"data.path={tiny_corpus}",
        *TINY_TRAIN,
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = run_cli(
        "cdlm-sample", f"ckpt={run / 'model.safetensors'}", "steps=8", "num_samples=2", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sampler=block" in out.stdout
    bad = run_cli("cdlm-sample", f"ckpt={run / 'model.safetensors'}", "cache=dual", cwd=tmp_path)
    assert bad.returncode == 2 and "no suffix to cache" in bad.stderr
