"""Masked diffusion: the ELBO by hand, and every masked sampler against an oracle."""

import functools
import inspect
import math

import pytest
import torch

from cdlm.denoiser import NetworkDenoiser, Prediction
from cdlm.generation import named_sampler
from cdlm.processes.base import Corrupted
from cdlm.processes.masked import MaskedDenoiser, MaskedProcess
from cdlm.samplers import check_compatible, uniform_grid
from cdlm.samplers.masked import sample_masked
from cdlm.samplers.masked_steps import (
    step_ancestral,
    step_entropy_bounded,
    step_threshold,
    step_topk,
)
from cdlm.samplers.rules import Ancestral, CachedAncestral, Confidence, EntropyBounded, Threshold
from cdlm.schedules import CosineMaskSchedule, CosineSchedule, LogLinearMaskSchedule
from cdlm.time_samplers import TimeSampler

MASK, EOS, V = 4, 3, 5  # toy vocabulary: 0, 1, 2, EOS=3, MASK=4
# the masked samplers of conf/sampler: the one loop with each step rule
sample_ancestral = functools.partial(sample_masked, rule=Ancestral())
sample_cached_ancestral = functools.partial(sample_masked, rule=CachedAncestral())
sample_topk = functools.partial(sample_masked, rule=Confidence())
sample_threshold = functools.partial(sample_masked, rule=Threshold())
sample_entropy_bounded = functools.partial(sample_masked, rule=EntropyBounded())
MASKED_SAMPLERS = [sample_ancestral, sample_cached_ancestral, sample_topk, sample_threshold]


class FixedNetwork(torch.nn.Module):
    """Returns the same logits for every input."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, z, t, label=None):
        return self.logits.expand(z.shape[0], -1, -1)


def test_elbo_equals_hand_computed_value():
    process = MaskedProcess(vocab_size=V, mask_id=MASK, schedule=LogLinearMaskSchedule(eps=0.0))
    tokens = torch.tensor([[0, 2, 1]])
    z = torch.tensor([[MASK, 2, MASK]])
    masked = z == MASK
    raw = torch.tensor([[[1.0, 0.0, 0.0, 0.0, 9.0], [0.0] * 5, [0.0, 2.0, 1.0, 0.0, 9.0]]])
    den = MaskedDenoiser(FixedNetwork(raw), MASK)
    t = torch.tensor([0.4])
    c = Corrupted(tokens=tokens, x0=tokens, x_t=z, t=t, noisy=masked)
    integrand, per_masked = process.elbo(den, c, torch.ones_like(masked))
    # SUBS drops the [MASK] logit; loglinear weight -keep'/(1-keep) = 1/t; 3 tokens.
    p0 = math.e / (math.e + 3)
    p2 = math.e**2 / (1 + math.e**2 + math.e + 1)
    expected = (1 / 0.4) * (-math.log(p0) - math.log(p2)) / 3
    assert process.weight(t).item() == pytest.approx(1 / 0.4, rel=1e-6)
    assert integrand.item() / 3 == pytest.approx(expected, rel=1e-6)  # summed over positions
    assert per_masked.item() == pytest.approx((-math.log(p0) - math.log(p2)) / 2, rel=1e-6)
    # a PAD position (valid=False) is never scored, masked or not
    integrand, per_masked = process.elbo(den, c, torch.tensor([[True, True, False]]))
    assert integrand.item() == pytest.approx((1 / 0.4) * -math.log(p0), rel=1e-6)
    assert per_masked.item() == pytest.approx(-math.log(p0), rel=1e-6)


def test_loss_is_the_elbo_integrand_per_valid_token_and_changes_nothing():
    """``loss`` draws t and the masks, then averages the ELBO integrand over valid tokens; its
    observation is (the time sampler's u, mean CE per masked token), handed over only by
    ``observe``."""

    class Spy(TimeSampler):
        def __init__(self):
            super().__init__()
            self.seen = []

        def observe(self, t, loss):
            self.seen.append((t, loss))

    spy = Spy()
    process = MaskedProcess(vocab_size=V, mask_id=MASK, time_sampler=spy)
    den = MaskedDenoiser(FixedNetwork(torch.randn(1, 6, V)), MASK)
    tokens = torch.randint(0, 3, (4, 6))
    valid = torch.ones(4, 6, dtype=torch.bool)
    valid[1, 4:] = valid[3, 2:] = False  # PAD at the end of two rows
    batch = {"tokens": tokens, "valid": valid}
    for training in (False, True):
        process.train(training)
        out = process.loss(den, batch, torch.Generator().manual_seed(7))
        g = torch.Generator().manual_seed(7)  # the same draws, made by hand
        t = process.sample_t(4, g)
        c = process.corrupt(tokens, t, g)
        integrand, per_masked = process.elbo(den, c, valid)
        torch.testing.assert_close(out.loss, integrand.sum() / valid.sum())
        assert out.metrics["bits_per_token"].item() == pytest.approx(out.loss.item() / math.log(2))
        if not training:
            assert out.observation is None
            continue
        seen = (c.noisy & valid).any(-1)
        u, losses = out.observation
        torch.testing.assert_close(u, ((t - process.t_min) / (1 - process.t_min))[seen])
        torch.testing.assert_close(losses, per_masked[seen])
    assert spy.seen == []
    process.observe(out)
    assert len(spy.seen) == 1 and spy.seen[0][0] is out.observation[0]


def test_subs_carries_unmasked_tokens_and_never_predicts_mask():
    raw = torch.randn(1, 4, V)
    pred = MaskedDenoiser(FixedNetwork(raw), MASK)(
        torch.tensor([[MASK, 1, MASK, 2]]), torch.zeros(1)
    )
    probs = pred.logits.exp()
    assert torch.all(probs[..., MASK] == 0)
    assert probs[0, 1, 1] == 1 and probs[0, 3, 2] == 1
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 4))


def test_cosine_mask_schedule_endpoints_and_derivative():
    s = CosineMaskSchedule(eps=1e-3)
    t = torch.linspace(0.05, 0.95, 10, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(s.keep(t).sum(), t)
    torch.testing.assert_close(s.dkeep(t.detach()), grad)
    assert s.keep(torch.tensor(0.0)) == pytest.approx(1.0)
    assert s.keep(torch.tensor(1.0, dtype=torch.float64)) == pytest.approx(1e-3)


def test_gaussian_schedule_is_refused_for_masking():
    with pytest.raises(ValueError, match="mask_schedule"):
        MaskedProcess(vocab_size=V, mask_id=MASK, schedule=CosineSchedule())


class Oracle(NetworkDenoiser):
    """Knows the data: log-probability 0 on the true token (through SUBS carry-over too)."""

    def __init__(self, data):
        self.data, self.calls = data, 0

    def __call__(self, z, t, self_cond=None):
        self.calls += 1
        logp = torch.full((*z.shape, V), -math.inf).scatter_(-1, self.data[..., None], 0.0)
        return Prediction(logits=logp)


class Random(NetworkDenoiser):
    """Arbitrary but deterministic beliefs, so samplers must make real choices."""

    def __call__(self, z, t, self_cond=None):
        g = torch.Generator().manual_seed(int(z.sum()))
        raw = torch.randn(*z.shape, V, generator=g)
        return MaskedDenoiser(FixedNetwork(raw), MASK)(z, t)


def run(sampler, den, shape=(4, 12), steps=8, seed=0, **kw):
    process = MaskedProcess(vocab_size=V, mask_id=MASK, eos_id=EOS)
    g = torch.Generator().manual_seed(seed)
    states = []
    out = sampler(
        den,
        process.prior(shape, torch.device("cpu"), g),
        uniform_grid(steps),
        process=process,
        generator=g,
        callback=states.append,
        **kw,
    )
    return out, states


@pytest.mark.parametrize("sampler", MASKED_SAMPLERS)
@pytest.mark.parametrize("block_length", [None, 5])
@pytest.mark.parametrize("steps", [1, 8, 40])
def test_oracle_reproduces_the_data(sampler, block_length, steps):
    data = torch.randint(0, 3, (4, 12))  # no EOS: all blocks are needed
    out, _ = run(sampler, Oracle(data), steps=steps, block_length=block_length)
    assert torch.equal(out.tokens, data)
    assert not (out.tokens == MASK).any()
    assert out.positions == out.nfe * 12


@pytest.mark.parametrize("sampler", MASKED_SAMPLERS)
@pytest.mark.parametrize("block_length", [None, 4])
def test_committed_tokens_never_change(sampler, block_length):
    out, states = run(sampler, Random(), steps=12, block_length=block_length)
    for before, after in zip(states, states[1:], strict=False):
        committed = before.x != MASK
        assert torch.equal(after.x[committed], before.x[committed])
    assert not (out.tokens == MASK).any()


@pytest.mark.parametrize("sampler", MASKED_SAMPLERS)
def test_blocks_fill_left_to_right(sampler):
    _, states = run(sampler, Random(), shape=(2, 12), steps=6, block_length=4)
    for st in states:
        undecided = (st.x == MASK).any(0)
        if undecided.any():  # nothing after the first undecided block is decided
            first = int(undecided.float().argmax()) // 4 * 4
            assert (st.x[:, first + 4 :] == MASK).all()


def test_block_sampling_stops_at_eos():
    data = torch.tensor([[0, 1, EOS, 2, 1, 0, 2, 1], [1, EOS, 0, 0, 1, 2, 0, 1]])
    out, _ = run(sample_topk, Oracle(data), shape=(2, 8), steps=8, block_length=4)
    assert out.nfe == 4  # the second block is never sampled
    assert torch.equal(out.tokens[:, :4], data[:, :4])
    assert (out.tokens[:, 4:] == EOS).all()
    # stop_at_eos=False fills the whole canvas (the speed table's equal-length rows)
    out, _ = run(
        sample_topk, Oracle(data), shape=(2, 8), steps=8, block_length=4, stop_at_eos=False
    )
    assert out.nfe == 8 and torch.equal(out.tokens, data)


def test_cached_ancestral_matches_ancestral_with_fewer_calls():
    data = torch.randint(0, 3, (2, 6))
    full, _ = run(sample_ancestral, Oracle(data), shape=(2, 6), steps=64, seed=3)
    cached, _ = run(sample_cached_ancestral, Oracle(data), shape=(2, 6), steps=64, seed=3)
    assert torch.equal(full.tokens, cached.tokens)
    assert cached.nfe < full.nfe <= 64
    r_full, _ = run(sample_ancestral, Random(), steps=30, seed=1)
    r_cached, _ = run(sample_cached_ancestral, Random(), steps=30, seed=1)
    assert torch.equal(r_full.tokens, r_cached.tokens) and r_cached.nfe <= r_full.nfe


def test_threshold_commits_at_least_one_per_step_and_confident_ones_at_once():
    data = torch.randint(0, 3, (1, 10))
    out, states = run(sample_threshold, Oracle(data), shape=(1, 10), steps=10)
    assert out.nfe == 1  # the oracle is sure of everything: one parallel step
    _, states = run(
        sample_masked, Random(), shape=(1, 10), steps=10, rule=Threshold(threshold=0.999)
    )
    masks = [int((s.x == MASK).sum()) for s in states]
    assert all(b < a for a, b in zip([10, *masks], masks, strict=False))


def test_masked_samplers_refuse_other_processes():
    for sampler in MASKED_SAMPLERS:
        check_compatible(sampler, "masked")
        with pytest.raises(ValueError, match="does not fit a 'gaussian' model"):
            check_compatible(sampler, "gaussian")


def test_repeat_penalty_lowers_decided_neighbours_tokens_only():
    from cdlm.samplers.masked import penalise_repeats

    x = torch.tensor([[2, MASK, 3, MASK]])
    logp = torch.full((1, 4, V), -math.log(4.0))
    logp[..., MASK] = -math.inf
    out = penalise_repeats(x, logp, MASK, penalty=math.log(4.0))
    p = out[0, 1].exp()
    # position 1 sits between tokens 2 and 3: each becomes 4x less likely than 0 and 1
    assert torch.allclose(p[[2, 3]], torch.full((2,), 0.1), atol=1e-6)
    assert torch.allclose(p[[0, 1]], torch.full((2,), 0.4), atol=1e-6) and p[MASK] == 0
    assert out[0, 3].exp()[3] < out[0, 3].exp()[2]  # last position: left neighbour 3 only
    assert torch.equal(penalise_repeats(x, logp, MASK, 0.0), logp)


@pytest.mark.parametrize(
    ("rule", "step", "own"),
    [
        (Ancestral, step_ancestral, ["temperature"]),
        (Confidence, step_topk, ["temperature"]),
        (Threshold, step_threshold, ["temperature", "threshold"]),
        (EntropyBounded, step_entropy_bounded, ["temperature", "gamma"]),
    ],
)
def test_every_option_is_in_the_signature(rule, step, own):
    """Nothing hides in ``**options`` (Hydra, ``stops_at_eos`` and readers see every option):
    a rule's options default as its step does, the sampler's shared ones as before, and a
    misspelt option is refused by name."""
    params = inspect.signature(sample_masked).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    step_params = inspect.signature(step).parameters
    fields = inspect.signature(rule).parameters
    assert {n: fields[n].default for n in own} == {n: step_params[n].default for n in own}
    shared = {"block_length": None, "repeat_penalty": 0.0, "stop_at_eos": True, "cache": None}
    assert {n: params[n].default for n in shared} == shared
    process = MaskedProcess(vocab_size=V, mask_id=MASK, eos_id=EOS)
    with pytest.raises(TypeError, match="tempreature"):
        sample_masked(
            None, torch.full((1, 4), MASK), uniform_grid(2), process=process, tempreature=1
        )
    with pytest.raises(TypeError, match="tempreature"):
        rule(tempreature=1.0)


@pytest.mark.parametrize(
    ("name", "option", "bad", "message"),
    [
        ("threshold", "threshold", 0.0, r"threshold must be in \(0, 1\]"),
        ("threshold", "threshold", -0.5, r"threshold must be in \(0, 1\]"),
        ("threshold", "threshold", 1.5, r"threshold must be in \(0, 1\]"),
        ("threshold", "threshold", math.nan, r"threshold must be in \(0, 1\]"),
        ("entropy_bounded", "gamma", -0.1, "gamma must be >= 0"),
        ("entropy_bounded", "gamma", math.nan, "gamma must be >= 0"),
    ],
)
def test_guard_options_out_of_range_are_refused_at_config_time(name, option, bad, message):
    """tau = 0 was a bare 'math domain error' from log(0) at the first step; now the rule names
    the option and its range when the config is built (``sampler.rule.<option>``), before any
    network call."""
    with pytest.raises(Exception, match=message):
        named_sampler(name, rule={option: bad})


def test_a_rule_must_be_a_rule_object_and_options_must_fit():
    """A step function or a name where a rule object belongs, and options that do not fit the
    canvas, fail before any network call with what to give instead."""
    process = MaskedProcess(vocab_size=V, mask_id=MASK, eos_id=EOS)
    x, grid = torch.full((1, 8), MASK), uniform_grid(2)
    with pytest.raises(TypeError, match="rule must be a step rule object"):
        sample_masked(Uncallable(), x, grid, process=process, rule=step_threshold)
    with pytest.raises(ValueError, match="repeat_penalty must be >= 0"):
        sample_masked(Uncallable(), x, grid, process=process, repeat_penalty=-1.0)


class Uncallable:
    """A denoiser that must not be called: an option check comes before any network call."""

    def __call__(self, *args, **kwargs):
        raise AssertionError("the network was called before the options were checked")


def test_guard_options_at_their_bounds_are_accepted():
    data = torch.randint(0, 3, (2, 8))
    out, _ = run(sample_masked, Oracle(data), shape=(2, 8), rule=Threshold(threshold=1.0))
    assert torch.equal(out.tokens, data)
    out, _ = run(sample_masked, Oracle(data), shape=(2, 8), rule=EntropyBounded(gamma=0.0))
    assert torch.equal(out.tokens, data)
