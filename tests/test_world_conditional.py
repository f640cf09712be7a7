"""The exact conditional of a world given fixed text (``cdlm.worlds.conditional``) and the scores
it gives conditional samples (``cdlm.evaluation.world_conditional``), checked against brute-force
enumeration of a tiny hidden chain in float64."""

import itertools
import json
import math

import pytest
import torch
from conftest import run_main
from test_cli import assert_one_line_error

from cdlm import worlds
from cdlm.evaluation.world_conditional import free_pairs, score_conditional
from cdlm.worlds import ImpossibleObservation
from cdlm.worlds.base import World
from cdlm.worlds.conditional import condition
from cdlm.worlds.transition import Transition

LENGTH = 6


def tiny_world() -> World:
    """Four states over three tokens; states 2 and 3 both emit token 2 (3: "after a 0"), so the
    chain is hidden but unifilar; two alternating steps with zeros (impossible pairs)."""
    g = torch.Generator().manual_seed(3)
    steps = []
    for _ in range(2):
        p = torch.rand(4, 4, dtype=torch.float64, generator=g) + 0.1
        p[0, 2] = 0.0  # after a 0, token 2 is state 3
        p[1:, 3] = 0.0  # otherwise state 2
        p[1, 0] = 0.0  # a pair the world never makes: (1, 0)
        steps.append(Transition(p / p.sum(-1, keepdim=True)))
    initial = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    return World("tiny", None, torch.tensor([0, 1, 2, 2]), initial, steps, LENGTH, vocab_size=3)


def enumerate_world(world: World) -> dict[tuple, float]:
    """p(tokens) of every token sequence, summed over every state path (no forward-backward)."""
    out: dict[tuple, float] = {}
    for path in itertools.product(range(4), repeat=LENGTH):
        p = float(world.initial[path[0]])
        for i in range(1, LENGTH):
            p *= float(world.step(i).dense[path[i - 1], path[i]])
        if p > 0:
            key = tuple(int(world.emit[s]) for s in path)
            out[key] = out.get(key, 0.0) + p
    return out


@pytest.fixture(scope="module")
def tiny():
    world = tiny_world()
    ids = torch.tensor([0, 0, 2, 1, 0, 0])  # positions 1, 2, 4, 5 free: a span and a tail
    free = torch.tensor([False, True, True, False, True, True])
    truth = {k: p for k, p in enumerate_world(world).items() if k[0] == 0 and k[3] == 1}
    evidence = sum(truth.values())
    return world, condition(world, ids, free), {k: p / evidence for k, p in truth.items()}, evidence


def test_the_conditional_is_the_enumerated_one(tiny):
    world, cond, truth, evidence = tiny
    assert cond.log_evidence == pytest.approx(math.log(evidence), rel=1e-12)
    seqs = torch.tensor(list(truth))
    got = cond.log_prob(seqs).exp()
    want = torch.tensor(list(truth.values()), dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-10, atol=0)
    assert got.sum().item() == pytest.approx(1.0, abs=1e-12)
    entropy = -sum(p * math.log(p) for p in truth.values())
    assert cond.entropy() == pytest.approx(entropy, rel=1e-10)
    pairs = torch.zeros(3, 3, dtype=torch.float64)
    for seq, p in truth.items():
        for i in (1, 2, 4, 5):  # the transitions into free positions
            pairs[seq[i - 1], seq[i]] += p
    assert torch.allclose(cond.figures.pairs, pairs, rtol=1e-10, atol=1e-15)
    marginals = cond.marginals()
    assert torch.allclose(marginals.sum(-1), torch.ones(LENGTH, dtype=torch.float64))
    tok = torch.zeros(LENGTH, 3, dtype=torch.float64).index_add_(1, world.emit, marginals)
    for i in range(LENGTH):
        want_i = [sum(p for s, p in truth.items() if s[i] == v) for v in range(3)]
        assert torch.allclose(tok[i], torch.tensor(want_i, dtype=torch.float64), atol=1e-12)


def test_a_sample_the_conditional_rules_out_has_probability_zero(tiny):
    _, cond, truth, _ = tiny
    ruled_out = torch.tensor([[0, 1, 0, 1, 0, 0]])  # (1, 0) never happens
    assert tuple(ruled_out[0].tolist()) not in truth
    assert cond.log_prob(ruled_out).item() == -math.inf
    with pytest.raises(ValueError, match="changed a fixed position"):
        cond.log_prob(torch.tensor([[1, 0, 2, 1, 0, 0]]))


def test_exact_conditional_draws_follow_the_enumeration(tiny):
    _, cond, truth, _ = tiny
    n = 20000
    draws = cond.sample(n, torch.Generator().manual_seed(0))
    assert (draws[:, 0] == 0).all() and (draws[:, 3] == 1).all()
    counts: dict[tuple, int] = {}
    for row in draws.tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    assert set(counts) <= set(truth)
    chi2 = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in truth.items())
    dof = len(truth) - 1
    assert chi2 < dof + 5 * math.sqrt(2 * dof), (chi2, dof)  # about 5 sd above its mean


def test_kl_and_tv_of_a_known_sample_set_by_hand(tiny):
    world, cond, truth, _ = tiny
    samples = torch.tensor([[0, 0, 2, 1, 1, 2], [0, 2, 2, 1, 1, 1], [0, 0, 0, 1, 2, 2]])
    scores = score_conditional(cond, samples, floor_repeats=2, generator=torch.Generator())
    q = torch.zeros(3, 3, dtype=torch.float64)
    for seq, p in truth.items():
        for i in (1, 2, 4, 5):
            q[seq[i - 1], seq[i]] += p
    q = q / q.sum(-1, keepdim=True)
    counts = torch.zeros(3, 3, dtype=torch.float64)
    for row in samples.tolist():
        for i in (1, 2, 4, 5):
            counts[row[i - 1], row[i]] += 1
    w, p = counts.sum(-1) / counts.sum(), counts / counts.sum(-1, keepdim=True).clamp_min(1)
    kl = (w[:, None] * torch.where(p > 0, p * (p / q).log(), 0)).sum()
    tv = (w * 0.5 * (p - q).abs().sum(-1)).sum()
    assert scores["kl_rate"] == pytest.approx(float(kl) / math.log(2), rel=1e-10)
    assert scores["tv_rate"] == pytest.approx(float(tv), rel=1e-10)
    nll = [-math.log(truth[tuple(r)]) / 4 / math.log(2) for r in samples.tolist()]
    assert scores["nll_cond"] == pytest.approx(sum(nll) / 3, rel=1e-10)
    assert scores["free"] == 4 and scores["violation_rate"] == 0.0
    assert free_pairs(samples, cond.free).shape == (12, 2)


def test_impossible_fixed_text_is_named():
    world = tiny_world()
    with pytest.raises(ImpossibleObservation, match="nothing at position 0 leads"):  # (1, 0) never
        condition(world, torch.tensor([1, 0, 0, 0, 0, 0]), torch.tensor([False] * 2 + [True] * 4))
    with pytest.raises(ImpossibleObservation, match="never makes"):
        condition(world, torch.tensor([0, 7, 0, 0, 0, 0]), torch.tensor([False] * 2 + [True] * 4))


@pytest.fixture(scope="module")
def chars():
    return worlds.load("world:chars")


def test_exact_conditional_samples_score_at_the_floor_and_a_prompt_blind_set_does_not(chars):
    """An infill (a span between fixed text): exact conditional samples sit at the KL floor and
    average the entropy; the world's own unconditional draws, the fixed text pasted over them (a
    sampler that ignores the right end), are far above it."""
    tok = chars.tokenizer
    left, right = tok("it is a truth ")["input_ids"], tok(" acknowledged")["input_ids"]
    span, n = 8, 256
    ids = torch.tensor(left + [tok.mask_token_id] * span + right)
    free = torch.tensor([False] * len(left) + [True] * span + [False] * len(right))
    cond = condition(chars, ids, free)
    g = torch.Generator().manual_seed(0)
    exact = score_conditional(cond, cond.sample(n, g), generator=g)
    spread = exact["kl_floor_se"] * math.sqrt(8)  # one set's sd: the floor averages 8 sets
    assert abs(exact["kl_rate"] - exact["kl_floor"]) < 4 * spread
    assert abs(exact["nll_cond"] - exact["entropy_cond"]) < 4 * exact["nll_cond_se"]
    assert exact["violation_rate"] == 0.0
    blind = chars.sample(n, len(ids), generator=g)
    blind[:, ~free] = ids[~free]
    scores = score_conditional(cond, blind, generator=g)
    assert scores["kl_rate"] > scores["kl_floor"] + 10 * spread
    assert scores["nll_cond"] > scores["entropy_cond"] + 4 * scores["nll_cond_se"]


def test_agreement_violations_are_spans_that_disagree_with_a_fixed_end():
    world = worlds.load("world:agreement")
    tok = world.tokenizer
    filler = tok("it is a truth ")["input_ids"]  # 14 characters: period 16 with its two names
    a, b = tok("A")["input_ids"][0], tok("B")["input_ids"][0]
    ids = torch.tensor([tok.mask_token_id] + filler + [b])
    free = torch.tensor([True] + [False] * 15)
    cond = condition(world, ids, free)
    assert cond.log_prob(ids.clone().index_fill_(0, torch.tensor([0]), b)[None]).item() == 0.0
    g = torch.Generator().manual_seed(1)
    assert (cond.sample(64, g)[:, 0] == b).all()
    names = torch.tensor([a, b] * 32)  # half of them disagree with the fixed closing name
    samples = ids.expand(64, -1).clone()
    samples[:, 0] = names
    scores = score_conditional(cond, samples, generator=g)
    assert scores["violation_rate"] == 0.5 and scores["constraint_rate"] == 0.5


def test_cdlm_eval_scores_an_ar_oracles_continuations_and_infills_at_the_floor(tmp_path):
    """One token per call on the oracle is exact: every row at its floor, from a prompts file."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "it is a truth", "max_new_tokens": 24}\n{"prompt": "the "}\n')
    out = tmp_path / "cond.json"
    result = run_main(
        "cdlm-eval",
        "ckpt=world:chars",
        "process=autoregressive",
        "scorer=world",
        f"prompts={prompts}",
        "num_samples=64",
        "wandb=false",
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    first, second = report["rows"]
    assert first["task"] == "continuation" and first["free"] == 24 and first["length"] == 37
    assert second["free"] == 124 and len(second["texts"]) == 64
    for row in report["rows"]:
        spread = row["kl_floor_se"] * math.sqrt(8)
        assert abs(row["kl_rate"] - row["kl_floor"]) < 4 * spread, row
        assert row["violation_rate"] == 0.0
    assert "| 2 | continuation | 124 |" in out.with_suffix(".md").read_text()


def test_cdlm_eval_writes_an_infinite_kl_as_null_and_names_it(tmp_path):
    """Block diffusion bridging to a name in a later block breaks agreements the world never
    breaks: an infinite KL, which JSON cannot hold as a number."""
    out = tmp_path / "cond.json"
    result = run_main(
        "cdlm-eval",
        "ckpt=world:agreement",
        "process=block",
        "scorer=world",
        'infill="Ait is a truth AB[[30]]A"',
        "num_samples=16",
        "steps=16",
        "wandb=false",
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.loads(out.read_text(), parse_constant=pytest.fail)["rows"]
    assert row["violation_rate"] > 0 and row["kl_rate"] is None and row["infinite"] == ["kl_rate"]
    assert "| 1 | infill |" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["prompt=ab", 'infill="a[[2]]"'], "give at most one of prompt=, infill=, prompts="),
        (["prompt=ab", "scorer=none"], "give scorer=world"),
        (["prompt=ab", "metric=elbo"], "not another metric"),
        (["max_new_tokens=4"], "max_new_tokens= counts the tokens after prompt="),
        (["prompt=AB"], "the fixed token 0 at position 0 is one it never makes"),  # <pad>,
    ],
)
def test_cdlm_eval_conditional_bad_input_is_one_line(tmp_path, args, fragment):
    out = tmp_path / "cond.json"
    base = ["ckpt=world:chars", "process=masked", "scorer=world", "wandb=false", f"out={out}"]
    result = run_main("cdlm-eval", *base, *args, cwd=tmp_path)
    assert_one_line_error(result, fragment)
    assert not out.exists()
