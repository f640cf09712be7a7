"""The exact-k step rule (``cdlm.samplers.rules.ExactK``) against the truth of a tiny world: at
k = 1 the masked and block oracles sample it exactly (a chi-square test over every sequence),
k = 2 does not (the same test has the power to tell); every step commits exactly k tokens, at
positions chosen uniformly; a grid too short to finish is refused by name. The entropy-bounded
rule at gamma = 0 and temperature 1 commits one uncertain token per step, so it is exact too;
at gamma > 0 its error, computed exactly over every path, is the sum of its steps' total
correlations, each within gamma (the bound docs/samplers.md states)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hydra.utils import instantiate
from scipy import stats
from test_sampler_contract import SEED, Spy, make_network, make_process
from test_worlds import chi_square_p, process_cfg, tiny_world

from cdlm.configs import compose
from cdlm.generation import Plan
from cdlm.generation.generate import generate
from cdlm.model_file import oracle_model
from cdlm.samplers import uniform_grid
from cdlm.samplers.masked import sample_block, sample_masked
from cdlm.samplers.masked_steps import Interval, step_entropy_bounded
from cdlm.samplers.rules import ExactK
from cdlm.worlds.agreement import Agreement

N, LENGTH = 3000, 4
UNSHIFTED = ["process.shift=false", "process.causal_clean=false", "process.ar_weight=0"]
EXACT_K = ["sampler.rule._target_=cdlm.samplers.rules.ExactK", "+sampler.rule.k=1"]


def draw(process: list[str], sampler: list[str], steps: int, n: int = N, seed: int = 0):
    """n sequences of the tiny world drawn by ``cdlm-sample``'s path: its oracle model of
    ``process`` overrides and the sampler config of ``sampler`` overrides."""
    world = tiny_world(length=LENGTH)
    model = oracle_model(world, process_cfg(*process))
    cfg = compose("sample", sampler)
    plan = Plan(num_samples=n, seq_len=LENGTH, steps=steps, seed=seed, cut_at_eos=False)
    gen = generate(model, instantiate(cfg.sampler), plan)
    return world, torch.tensor([s.token_ids for s in gen.samples])


EXACT = [
    pytest.param(["masked"], ["sampler=exact_k"], id="masked"),
    pytest.param(["masked"], ["sampler=exact_k", "sampler.block_length=2"], id="masked-blocks"),
    pytest.param(
        ["block", "process.block_size=2", *UNSHIFTED], ["sampler=block", *EXACT_K], id="block"
    ),
    pytest.param(
        ["block", "process.block_size=2"], ["sampler=block", *EXACT_K], id="shifted-block"
    ),
    # entropy_bounded at gamma 0: one uncertain token per step, drawn (not argmax)
    pytest.param(
        ["masked"],
        ["sampler=entropy_bounded", "sampler.rule.gamma=0", "sampler.rule.temperature=1"],
        id="entropy_bounded-gamma0",
    ),
]


@pytest.mark.parametrize(("process", "sampler"), EXACT)
def test_one_token_per_step_samples_the_world_exactly(process, sampler):
    world, samples = draw(process, sampler, steps=LENGTH)
    assert chi_square_p(world, samples) > 1e-3


def test_two_tokens_per_step_do_not_and_the_test_can_tell():
    """The chi-square test's power: two tokens per step drawn from their marginals miss the
    chain's dependence at 3000 samples (p ~ 1e-6)."""
    world, samples = draw(["masked"], ["sampler=exact_k", "sampler.rule.k=2"], steps=2)
    assert chi_square_p(world, samples) < 1e-3


def spied_run(kind: str, k: int, steps: int, rows: int = 2, length: int = 8, **options):
    """The contract's seeded float64 network on ``kind`` (block: blocks of 4), ``rows`` canvases
    of ``length`` decoded by ``ExactK(k)``: every reported state and the spy's call count."""
    process = make_process(kind)
    network = make_network(process)
    spy = Spy(network)
    sampler = sample_block if kind == "block" else sample_masked
    start = process.prior((rows, length), torch.device("cpu"), None)
    seen = []
    out = sampler(
        process.sampling_denoiser(network),
        start,
        uniform_grid(steps),
        process=process,
        generator=torch.Generator().manual_seed(SEED),
        callback=seen.append,
        rule=ExactK(k=k),
        stop_at_eos=False,
        **options,
    )
    return process, start, seen, out, spy


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize(
    ("kind", "steps", "options"),
    [("masked", 8, {}), ("masked", 8, {"block_length": 4}), ("block", 8, {})],
    ids=["masked", "masked-blocks", "block"],
)
def test_each_step_commits_exactly_k_tokens_of_its_block(kind, steps, options, k):
    """Each step commits min(k, masked left in its block) per row, in that block only, so a
    block of n takes ceil(n / k) steps, each one network call."""
    process, start, seen, out, spy = spied_run(kind, k, steps, **options)
    mask = process.mask_id
    blocks = [(0, 4), (4, 8)] if options or kind == "block" else [(0, 8)]
    before, i = start, 0
    for a, b in blocks:
        for _ in range(math.ceil((b - a) / k)):
            x = seen[i].x
            new = (before == mask) & (x != mask)
            left = (before[:, a:b] == mask).sum(-1)
            assert torch.equal(new.sum(-1), left.clamp(max=k)), (i, new)
            assert not new[:, :a].any() and not new[:, b:].any()
            before, i = x, i + 1
    assert len(seen) == i and not (out.tokens == mask).any()
    assert out.nfe == spy.calls == i


@pytest.mark.parametrize(("block_length", "span"), [(None, 6), (3, 3)])
def test_the_position_each_step_commits_is_uniform_over_the_masked_ones(block_length, span):
    """Over 3000 rows, the position of a state's first commit is uniform over the canvas (or
    over the first block), and the second one over the positions still masked."""
    process, _, seen, _, _ = spied_run("masked", 1, 6, 3000, 6, block_length=block_length)
    mask = process.mask_id
    first = (seen[0].x != mask).float().argmax(-1)
    counts = torch.bincount(first, minlength=6).double()
    assert counts[span:].sum() == 0
    assert stats.chisquare(counts[:span]).pvalue > 1e-3
    second = ((seen[1].x != mask) & (seen[0].x == mask)).float().argmax(-1)
    offset = (second - first) % span  # uniform over the span's other positions
    assert stats.chisquare(torch.bincount(offset, minlength=span)[1:].double()).pvalue > 1e-3


def test_a_grid_too_short_or_a_bad_k_is_named():
    with pytest.raises(ValueError, match=r"k=2 tokens per step: 8 masked positions do not fit"):
        spied_run("masked", 2, 3)
    with pytest.raises(ValueError, match="4 masked positions do not fit in 1 steps"):
        spied_run("block", 1, 2)  # the grid's 2 steps shared out: 1 per block of 4
    for k in (0, 1.5, True):
        with pytest.raises(ValueError, match="k must be an integer >= 1"):
            ExactK(k=k)


def support(world, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence (N, L) the world makes and its probability, by brute force."""
    seqs = torch.tensor(list(itertools.product(range(world.vocab_size), repeat=length)))
    p = world.log_prob(seqs).exp()
    return seqs[p > 0], p[p > 0]


def path_costs(model, x: torch.Tensor, gamma: float, seqs, p) -> tuple[float, list[float]]:
    """The entropy-bounded rule's deterministic path to ``x`` (L,) from the all-[MASK] canvas:
    log q(x) (the product of the marginals it draws from), and per step the total correlation
    of the set it commits given the state, from the world's ``seqs`` and ``p`` (nats)."""
    mask, length = model.process.mask_id, x.shape[0]
    state, log_q, costs = torch.full_like(x, mask), 0.0, []
    far = Interval(t=1.0, s=0.5, steps_left=length + 1, p_reveal=0.5, keep_t=0.0, keep_s=0.5)
    while (state == mask).any():
        logp = model.denoiser(state[None], torch.ones(1)).logits[0].double().log_softmax(-1)
        open_ = state == mask
        chosen = open_ & (step_entropy_bounded(state, logp, open_, far, None, 0.0, gamma) != mask)
        at = chosen.nonzero().flatten()
        assert len(at), "a step must commit at least one token"
        log_q += float(logp[at, x[at]].sum())
        fits = (seqs[:, ~open_] == state[~open_]).all(-1)
        joint: dict[tuple, float] = {}
        for s, w in zip(seqs[fits][:, at].tolist(), p[fits].tolist(), strict=True):
            joint[tuple(s)] = joint.get(tuple(s), 0.0) + w
        pj = torch.tensor(list(joint.values()), dtype=torch.float64) / float(p[fits].sum())
        marginal_h = float(torch.special.entr(logp[at].exp()).sum())
        costs.append(marginal_h - float(torch.special.entr(pj).sum()))
        state = torch.where(chosen, x, state)
    return log_q, costs


@pytest.mark.parametrize(
    ("world", "gamma", "want"),
    [
        (tiny_world(length=LENGTH), 1.2, None),  # pairs committed, weakly dependent
        (Agreement(names=2, period=2, length=2), 0.5, 0.0),  # the names' 0.69 nats do not fit
        (Agreement(names=2, period=2, length=2), 1.0, math.log(2)),  # both names apart
    ],
    ids=["tiny-1.2", "agreement-0.5", "agreement-1.0"],
)
def test_entropy_bounded_error_is_the_sum_of_its_steps_dependence_within_gamma(world, gamma, want):
    """The bound docs/samplers.md states, exactly, on a world's masked oracle: each step's total
    correlation is within gamma, and KL(world || the rule's samples at temperature 1) equals the
    expected sum of them (the chain rule: the path is a function of the sample)."""
    model = oracle_model(world, process_cfg("masked"))
    seqs, p = support(world, world.length)
    log_q, costs = zip(*(path_costs(model, x, gamma, seqs, p) for x in seqs), strict=True)
    assert max(c for path in costs for c in path) <= gamma + 1e-6
    kl = float((p * (p.log() - torch.tensor(log_q, dtype=torch.float64))).sum())
    expected = float((p * torch.tensor([sum(c) for c in costs], dtype=torch.float64)).sum())
    assert kl == pytest.approx(expected, abs=1e-5)
    assert kl <= gamma * max(len(c) for c in costs)
    assert kl > 0.01 if want is None else kl == pytest.approx(want, abs=1e-5)
