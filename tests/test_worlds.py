"""Exact worlds: likelihoods, posteriors and entropies against brute-force enumeration in
float64, and the oracle models sampled by cdlm's own samplers against the world."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from hydra.utils import instantiate
from scipy import stats

from cdlm import worlds
from cdlm.configs import compose
from cdlm.generation import Plan
from cdlm.generation.generate import generate
from cdlm.model_file import oracle_model
from cdlm.worlds.agreement import Agreement
from cdlm.worlds.base import World
from cdlm.worlds.chain import symbol_tokenizer
from cdlm.worlds.transition import Transition


def tiny_world(length: int = 5, seed: int = 0) -> World:
    """3 symbols, a random dense chain with a random start (not stationary)."""
    g = torch.Generator().manual_seed(seed)
    matrix = torch.rand(3, 3, generator=g, dtype=torch.float64) + 0.1
    start = torch.rand(3, generator=g, dtype=torch.float64) + 0.1
    return World(
        "tiny",
        symbol_tokenizer(["a", "b", "c"]),
        torch.arange(3) + 3,
        start / start.sum(),
        [Transition(matrix / matrix.sum(-1, keepdim=True))],
        length,
    )


def enumerate_world(world: World, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence (N, L) of emitted tokens and its probability, by brute force."""
    seqs = torch.tensor(list(itertools.product(range(3), repeat=length))) + 3
    states = seqs - 3
    p = world.initial[states[:, 0]].clone()
    for i in range(1, length):
        p *= world.step(i).dense[states[:, i - 1], states[:, i]]
    return seqs, p


def brute_posterior(seqs, p, evidence: torch.Tensor) -> torch.Tensor:
    """(L, V) p(x_i = v | evidence (L, V) log-likelihoods), by enumeration."""
    w = p * torch.exp(evidence.double().gather(1, seqs.T).T.sum(-1)) if len(seqs) else p
    out = torch.zeros(evidence.shape, dtype=torch.float64)
    for i in range(seqs.shape[1]):
        out[i].index_add_(0, seqs[:, i], w)
    return out / w.sum()


def test_log_prob_and_entropy_equal_enumeration():
    world = tiny_world()
    seqs, p = enumerate_world(world, 5)
    assert torch.allclose(world.log_prob(seqs).exp(), p, rtol=1e-12, atol=0)
    assert float(p.sum()) == pytest.approx(1.0, abs=1e-12)
    assert world.entropy(5) == pytest.approx(float(-(p * p.log()).sum()), rel=1e-12)
    impossible = seqs[:1].clone()
    impossible[0, 2] = 1  # <eos>: never emitted
    assert world.violations(impossible).tolist() == [True]


@pytest.mark.parametrize("corruption", ["mask", "gaussian"])
def test_posterior_and_predictive_equal_enumeration(corruption):
    world = tiny_world()
    seqs, p = enumerate_world(world, 5)
    g = torch.Generator().manual_seed(1)
    v = world.vocab_size
    if corruption == "mask":  # observed tokens one-hot, masked ones nothing
        truth = world.sample(1, 5, g)[0]
        evidence = torch.full((5, v), -math.inf).scatter_(1, truth[:, None], 0.0)
        evidence[torch.tensor([0, 2, 3])] = 0.0
    else:  # Gaussian likelihoods of noisy embeddings at several noise levels
        table = torch.randn(v, 4, generator=g, dtype=torch.float64)
        truth = world.sample(1, 5, g)[0]
        alpha = torch.tensor([0.9, 0.5, 0.2, 0.7, 0.05], dtype=torch.float64)
        sigma = (1 - alpha**2).sqrt()
        y = alpha[:, None] * table[truth] + sigma[:, None] * torch.randn(5, 4, generator=g)
        evidence = -((y[:, None] - alpha[:, None, None] * table[None]) ** 2).sum(-1)
        evidence = evidence / (2 * sigma[:, None] ** 2)
    got = world.posterior(evidence[None].float())[0].double().exp()
    want = brute_posterior(seqs, p, evidence)
    assert torch.allclose(got, want, atol=2e-6)
    causal = world.predictive(evidence[None].float())[0].double().exp()
    for i in range(5):  # p(x_i | evidence before i): enumerate with the rest unobserved
        before = evidence.clone()
        before[i:] = 0.0
        assert torch.allclose(causal[i], brute_posterior(seqs, p, before)[i], atol=2e-6)


def test_an_explicit_masks_rows_each_get_the_posterior_of_exactly_the_keys_they_see():
    """Rows that see keys past their query, rows that see only a prefix, a row that sees
    nothing: each query's answer is the enumerated posterior given its own keys (the oracle
    cuts each row's canvas after its last key and query: that cut must lose nothing)."""
    from cdlm.worlds.oracle import OracleNetwork

    world = tiny_world(length=6)
    seqs, p = enumerate_world(world, 6)
    net = OracleNetwork(world, world.vocab_size, world.vocab_size, mask_id=2)
    x = torch.tensor([[3, 5, 2, 4, 5, 3]])  # position 2 masked: no evidence
    see = torch.tensor([
        [1, 1, 1, 1, 1, 1],  # all: later keys inform position 0
        [0, 0, 0, 0, 1, 1],  # only the last two keys
        [1, 1, 0, 0, 0, 0],  # a prefix
        [0, 0, 0, 0, 0, 0],  # nothing: the prior marginal
        [1, 0, 1, 0, 1, 0],
        [0, 1, 0, 1, 0, 0],
    ], dtype=torch.bool)  # fmt: skip
    queries = torch.tensor([0, 2, 5, 4, 3, 1])
    got = net._answer((torch.arange(6), net.evidence(x)), queries, see, 1)[0].double().exp()
    for row, query in enumerate(queries.tolist()):
        evidence = torch.zeros(6, world.vocab_size, dtype=torch.float64)
        for j in torch.nonzero(see[row]).flatten().tolist():
            evidence[j] = net.evidence(x)[0, j].double()
        want = brute_posterior(seqs, p, evidence)[query]
        assert torch.allclose(got[row], want, atol=2e-6), (row, query)


def test_gaussian_oracle_is_the_exact_posterior_at_per_token_levels():
    """The gaussian oracle model's logits at x_t with one noise level per token equal
    enumeration with the Gaussian likelihood of each position under the process's own table."""
    world = tiny_world(length=3)
    model = oracle_model(world, process_cfg("gaussian", "process.embed_dim=4"))
    process, g = model.process, torch.Generator().manual_seed(2)
    tokens = world.sample(2, 3, g)
    t = torch.tensor([[0.3, 0.6, 0.9], [0.5, 0.5, 0.5]])
    x_t = process.noised(process.embedding(tokens), t, torch.randn(2, 3, 4, generator=g))
    got = process.make_denoiser(model.network)(x_t, t).logits.double().exp()
    table = process.embedding.table().double()
    alpha, sigma = process.schedule.alpha(t).double(), process.schedule.sigma(t).double()
    seqs, p = enumerate_world(world, 3)
    for b in range(2):
        diff = x_t[b].double()[:, None] - alpha[b][:, None, None] * table[None]
        evidence = -(diff**2).sum(-1) / (2 * sigma[b][:, None] ** 2)
        assert torch.allclose(got[b], brute_posterior(seqs, p, evidence), atol=1e-5)


def test_entropy_rate_matches_monte_carlo():
    world = worlds.load("world:agreement")
    x = world.sample(2000, 48, torch.Generator().manual_seed(0))
    nll = -world.log_prob(x) / 48
    se = float(nll.std()) / math.sqrt(len(nll))
    assert abs(float(nll.mean()) - world.entropy_rate(48)) < 3 * se
    assert world.violations(x).sum() == 0


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if "tokens" in n else n for n in worlds.names()],
)
def test_every_world_builds(name):
    """Each conf/world/ file builds a world whose exact samples it gives positive probability,
    whose tokenizer decodes them, and whose transitions are distributions (the token chain:
    a sparse top-K chain with teleport over the Austen BPE)."""
    world = worlds.load(f"world:{name}")
    x = world.sample(8, 32, torch.Generator().manual_seed(0))
    assert not world.violations(x).any()
    assert all(isinstance(world.tokenizer.decode(row), str) for row in x)
    rows = world.step(1).rows(torch.arange(world.initial.numel()))
    assert torch.allclose(rows.sum(-1), torch.ones(len(rows), dtype=torch.float64))


def test_char_chain_is_austen_at_3_3_bits():
    world = worlds.load("world:chars")
    assert world.vocab_size == 30
    assert world.describe()["entropy_rate_bits"] == pytest.approx(3.31, abs=0.02)


def process_cfg(name: str, *overrides: str):
    return compose("train", [f"process={name}", *overrides]).process


def draw(model, sampler: str, steps: int, n: int, seq_len: int, seed: int = 0, **options):
    cfg = compose(
        "sample", [f"sampler={sampler}"] + [f"sampler.{k}={v}" for k, v in options.items()]
    )
    plan = Plan(num_samples=n, seq_len=seq_len, steps=steps, seed=seed, cut_at_eos=False)
    gen = generate(model, instantiate(cfg.sampler), plan)
    return torch.tensor([s.token_ids for s in gen.samples])


def chi_square_p(world: World, samples: torch.Tensor) -> float:
    """p-value of the samples' sequence counts against the world's exact probabilities."""
    seqs, p = enumerate_world(world, samples.shape[1])
    index = {tuple(s.tolist()): i for i, s in enumerate(seqs)}
    counts = torch.zeros(len(seqs))
    for row in samples:
        counts[index[tuple(row.tolist())]] += 1
    return float(stats.chisquare(counts, p * len(samples)).pvalue)


@pytest.mark.parametrize(
    "process, sampler, options",
    [
        ("autoregressive", "ar", {}),
        ("masked", "ancestral", {"block_length": 1}),  # one token per step
        ("masked", "ancestral", {"block_length": 1, "stop_at_eos": False}),
    ],
)
def test_one_token_per_step_samples_the_world_exactly(process, sampler, options):
    world = tiny_world(length=3)
    model = oracle_model(world, process_cfg(process))
    samples = draw(model, sampler, 3, 3000, 3, **options)
    assert chi_square_p(world, samples) > 0.05


def test_block_diffusion_and_speculative_decoding_sample_the_world():
    """BD3-LM's own (unshifted) layout with many steps per block, and self-speculative decoding
    (a shifted oracle drafts, its causal stream verifies): exact in distribution."""
    world = tiny_world(length=4)
    unshifted = ["process.shift=false", "process.causal_clean=false", "process.ar_weight=0"]
    block = oracle_model(world, process_cfg("block", "process.block_size=2", *unshifted))
    assert chi_square_p(world, draw(block, "block", 128, 3000, 4, steps_per_block=64)) > 0.05
    shifted = oracle_model(world, process_cfg("block", "process.block_size=2"))
    assert chi_square_p(world, draw(shifted, "speculative", 4, 3000, 4)) > 0.05


def test_unshifted_masked_oracle_agrees_with_the_shifted_one():
    world = tiny_world(length=4)
    shifted = oracle_model(world, process_cfg("masked"))
    plain = oracle_model(world, process_cfg("masked", "process.shift=false"))
    z = torch.tensor([[3, 2, 2, 5], [2, 4, 2, 2]])
    t = torch.zeros(2)
    a, b = shifted.denoiser(z, t).logits, plain.denoiser(z, t).logits
    assert torch.allclose(a.exp(), b.exp(), atol=1e-6)


def test_two_tokens_per_step_break_agreement_at_the_closed_form_rate():
    """Both ends of a segment decided in one step from their marginals disagree with
    probability 1 - 1/names (here 1/2); one token per step never disagrees."""
    world = Agreement(names=2, period=2, length=2)
    model = oracle_model(world, process_cfg("masked"))
    n = 1000
    together = draw(model, "ancestral", 1, n, 2)
    rate = float(world.violations(together).double().mean())
    assert abs(rate - 0.5) < 3 * math.sqrt(0.25 / n)
    apart = draw(model, "ancestral", 2, n, 2, block_length=1)
    assert world.violations(apart).sum() == 0


@pytest.mark.parametrize(
    "process, sampler",
    [("masked", "confidence"), ("gaussian", "ddim"), ("autoregressive", "ar"), ("block", "block")],
)
def test_cdlm_sample_draws_from_a_worlds_exact_denoiser(process, sampler, tmp_path):
    """``cdlm-sample ckpt=world:agreement process=... sampler=...``: records of the world's own
    tokens; AR, one token at a time, never breaks an agreement."""
    from conftest import run_main

    out = tmp_path / "s.jsonl"
    args = [f"process={process}", f"sampler={sampler}", "steps=16", "num_samples=4", "seq_len=32"]
    result = run_main("cdlm-sample", "ckpt=world:agreement", *args, f"out={out}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    world = worlds.load("world:agreement")
    ids = torch.tensor([json.loads(line)["token_ids"] for line in out.read_text().splitlines()])
    assert ids.shape == (4, 32) and int(ids.min()) >= 3  # no special token
    if process == "autoregressive":
        assert not world.violations(ids).any()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["ckpt=world:chars"], "ckpt=world:chars needs process="),
        (["ckpt=world:nope", "process=masked"], "unknown world 'nope'"),
        (["ckpt=model.safetensors", "process=masked"], "process= applies to ckpt=world:<name>"),
    ],
)
def test_cdlm_sample_names_a_bad_world_request_in_one_line(args, fragment, tmp_path):
    from conftest import run_main

    result = run_main("cdlm-sample", *args, cwd=tmp_path)
    lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
    assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0], result.stderr


def test_a_fim_oracle_leaves_the_cached_world_as_it_was_and_impossible_evidence_is_named():
    """FIM sentinels go to the model's own tokenizer copy; jointly impossible hard evidence
    (A ... B in one segment) raises instead of returning NaN."""
    world = worlds.load("world:agreement")
    before = len(world.tokenizer)
    fim = process_cfg("autoregressive", "process.fim_rate=0.5")
    with pytest.raises(ValueError, match="vocabulary"):  # its sentinels are not the world's
        oracle_model(world, fim)
    assert len(world.tokenizer) == before
    oracle_model(world, process_cfg("masked"))  # still builds
    small = Agreement(names=2, period=3, length=3)
    evidence = torch.zeros(1, 3, small.vocab_size)
    evidence[0, 0] = evidence[0, 2] = -math.inf
    evidence[0, 0, small.tokenizer.convert_tokens_to_ids("A")] = 0.0
    evidence[0, 2, small.tokenizer.convert_tokens_to_ids("B")] = 0.0
    with pytest.raises(worlds.ImpossibleObservation, match="jointly impossible"):
        small.posterior(evidence)
