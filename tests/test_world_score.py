"""Exact scoring (``cdlm.evaluation.world_score``, ``cdlm-eval scorer=world``): Tang et al.'s
transition rates by hand, exact samples at the floor, collapse and violations caught, and the
report of a world's oracle model end to end."""

import json
import math

import pytest
import torch
from conftest import run_main
from test_cli import assert_one_line_error

from cdlm import worlds
from cdlm.evaluation.report import summary_markdown
from cdlm.evaluation.world_score import (
    canvas,
    score_samples,
    transition_rates,
    world_quality,
    world_spec,
)

LENGTH = 64  # shorter than the worlds' own 128: the figures hold at any length, and it is faster


@pytest.fixture(scope="module")
def chars():
    return worlds.load("world:chars")


def draws(world, n, seed, length=LENGTH):
    return world.sample(n, length, generator=torch.Generator().manual_seed(seed))


def test_transition_rates_by_hand():
    q = torch.tensor([[0.5, 0.5, 0.0], [0.25, 0.25, 0.5], [1.0, 0.0, 0.0]], dtype=torch.float64)
    # pairs (0,1) (1,0) (0,0) (0,1): from 0 three times, p = (1/3, 2/3, 0); from 1 once, (1, 0, 0)
    rates = transition_rates(torch.tensor([[0, 1, 0], [0, 0, 1]]), q)
    kl_0 = 1 / 3 * math.log(2 / 3) + 2 / 3 * math.log(4 / 3)
    assert rates.kl == pytest.approx(3 / 4 * kl_0 + 1 / 4 * math.log(4), rel=1e-12)
    # TV from 0: (1/6 + 1/6 + 0) / 2; from 1: (3/4 + 1/4 + 1/2) / 2, the unseen 2 included
    assert rates.tv == pytest.approx(3 / 4 * 1 / 6 + 1 / 4 * 3 / 4, rel=1e-12)
    # a pair the world never makes: KL infinite, TV still measured
    never = transition_rates(torch.tensor([[0, 2, 0]]), q)
    assert never.kl == math.inf and never.tv == pytest.approx(0.5 * 1.0 + 0.5 * 0.0)
    assert math.isnan(transition_rates(torch.tensor([[0], [1]]), q).kl)


def test_transition_rates_match_the_dense_definition():
    g = torch.Generator().manual_seed(0)
    v = 5
    q = torch.rand(v, v, dtype=torch.float64, generator=g)
    q /= q.sum(-1, keepdim=True)
    tokens = torch.randint(v, (7, 9), generator=g)
    counts = torch.zeros(v, v, dtype=torch.float64)
    pairs = (tokens[:, :-1].flatten(), tokens[:, 1:].flatten())
    counts.index_put_(pairs, torch.tensor(1.0, dtype=torch.float64), accumulate=True)
    w = counts.sum(-1) / counts.sum()
    p = counts / counts.sum(-1, keepdim=True).clamp_min(1)
    kl = (w[:, None] * torch.where(p > 0, p * (p / q).log(), 0)).sum()
    tv = (w * 0.5 * (p - q).abs().sum(-1)).sum()
    rates = transition_rates(tokens, q)
    assert rates.kl == pytest.approx(float(kl), rel=1e-12)
    assert rates.tv == pytest.approx(float(tv), rel=1e-12)


def test_exact_samples_score_at_the_floor(chars):
    repeats = 8
    scores = score_samples(
        chars,
        draws(chars, 64, 1),
        floor_repeats=repeats,
        generator=torch.Generator().manual_seed(2),
    )
    assert scores["samples"] == 64 and scores["length"] == LENGTH
    assert scores["entropy_rate"] == pytest.approx(chars.entropy_rate(LENGTH) / math.log(2))
    assert abs(scores["nll_truth"] - scores["entropy_rate"]) < 3 * scores["nll_truth_se"]
    # one set's spread is sqrt(repeats) times the floor mean's standard error
    spread = math.sqrt(repeats + 1)
    assert abs(scores["kl_rate"] - scores["kl_floor"]) < 4 * spread * scores["kl_floor_se"]
    assert abs(scores["tv_rate"] - scores["tv_floor"]) < 4 * spread * scores["tv_floor_se"]
    assert scores["kl_floor"] > 10 * scores["kl_floor_se"]  # the plug-in bias the floor exists for
    assert scores["violation_rate"] == scores["constraint_rate"] == 0.0


def test_the_floor_is_reproduced_by_an_independent_estimate(chars):
    tokens = draws(chars, 32, 3)
    a, b = (
        score_samples(chars, tokens, generator=torch.Generator().manual_seed(s)) for s in (4, 5)
    )
    for key in ("kl_floor", "tv_floor"):
        assert a[key] != b[key]  # independent draws
        se = math.hypot(a[f"{key}_se"], b[f"{key}_se"])
        assert abs(a[key] - b[key]) < 4 * se, key


def test_collapse_onto_the_mode_is_below_the_rate_and_far_from_the_floor(chars):
    pool = draws(chars, 256, 6)
    mode = pool[chars.log_prob(pool).argmax()]
    scores = score_samples(chars, mode.expand(32, -1), generator=torch.Generator().manual_seed(7))
    assert scores["nll_truth"] < scores["entropy_rate"] - 0.3
    assert scores["kl_rate"] > scores["kl_floor"] + 50 * scores["kl_floor_se"]
    assert scores["tv_rate"] > 2 * scores["tv_floor"]
    assert scores["distinct_3"] < 0.1


def test_impossible_samples_are_violations(chars):
    tokens = draws(chars, 8, 8)
    eos = chars.tokenizer.eos_token_id
    broken = canvas([row[:40] for row in tokens[:4].tolist()] + tokens[4:].tolist(), LENGTH, eos)
    assert (broken[:4, 40:] == eos).all() and torch.equal(broken[4:], tokens[4:])
    scores = score_samples(chars, broken, floor_repeats=2)
    assert scores["violation_rate"] == scores["constraint_rate"] == 0.5
    assert scores["kl_rate"] == math.inf and 0 < scores["tv_rate"] < 1
    alone = score_samples(chars, tokens[4:], floor_repeats=2)  # the possible half on its own
    assert scores["kl_rate_possible"] == alone["kl_rate"] == alone["kl_rate_possible"]
    assert scores["tv_rate_possible"] == alone["tv_rate"] < scores["tv_rate"]
    possible = -chars.log_prob(tokens[4:]).mean() / LENGTH / math.log(2)
    assert scores["nll_truth"] == pytest.approx(float(possible))
    impossible = score_samples(chars, broken[:4], floor_repeats=2)
    assert math.isnan(impossible["nll_truth"]) and math.isnan(impossible["kl_rate_possible"])


def test_a_broken_agreement_is_a_violation_and_a_broken_constraint():
    world = worlds.load("world:agreement")
    tokens = draws(world, 4, 9, length=128)
    names = tokens[:, 0].unique()
    flipped = tokens.clone()
    end = world.period - 1  # the first segment's closing name, in the first two rows
    flipped[:2, end] = torch.where(tokens[:2, end] == names[0], names[-1], names[0])
    scores = score_samples(world, flipped, floor_repeats=2)
    assert scores["violation_rate"] == 0.5
    assert scores["constraint_rate"] == pytest.approx(0.5 / world.segments(128))


def test_world_spec_names_the_world_or_the_fix():
    assert world_spec("world", {"world": "world:chars"}) == "world:chars"
    assert world_spec("world:agreement", {"world": "world:chars"}) == "world:agreement"
    assert world_spec("default", {}) is None and world_spec("hf:gpt2", {}) is None
    with pytest.raises(ValueError, match=r"records none; name one: scorer=world:<name> \("):
        world_spec("world", {"seq_len": 8})
    with pytest.raises(ValueError, match="unknown world 'world:nope'"):
        world_spec("world:nope", {})


def test_the_quality_section_sets_samples_beside_exact_ones(chars):
    tokens = draws(chars, 16, 10)
    q = world_quality(chars, "world:chars", tokens, generator=torch.Generator().manual_seed(11))
    assert q["scorer"] == "world:chars" and q["world"]["name"] == chars.name
    assert q["samples"]["nll_truth"] != q["reference"]["nll_truth"]  # a fresh exact set beside
    assert q["reference"]["violation_rate"] == 0.0
    for side in ("samples", "reference"):
        assert {"nll_truth", "kl_rate", "kl_floor", "token_entropy_bits"} <= set(q[side])


def test_cdlm_eval_scores_a_world_oracle_by_its_world(tmp_path):
    out = tmp_path / "eval.json"
    result = run_main(
        "cdlm-eval",
        "ckpt=world:chars",
        "process=masked",
        "scorer=world",
        "num_samples=4",
        "steps=8",
        "repeats=1",
        "num_batches=1",
        "batch_size=8",
        "wandb=false",
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    quality, bound = report["quality"], report["likelihood"]
    assert quality["scorer"] == "world:chars" and "gen_ppl" not in quality["samples"]
    assert quality["samples"]["samples"] == 4 and quality["samples"]["violation_rate"] == 0.0
    assert bound["sequences"] == 8 and bound["data"] == "8 exact world:chars samples"
    assert bound["excess_bits"] == pytest.approx(
        bound["bits_per_token"] - bound["entropy_rate_bits"]
    )
    summary = summary_markdown(report)
    assert "| NLL under the world (bits/token, ± s.e.) |" in summary
    assert "exact world:chars samples" in summary and "excess" in summary
    assert out.with_suffix(".md").read_text() == summary


@pytest.mark.parametrize(
    "scorer, message",
    [
        ("world:nope", "unknown world 'world:nope'; valid: agreement, chars"),
        ("world:agreement", "the model's vocabulary is not world:agreement's"),
    ],
)
def test_cdlm_eval_names_a_wrong_world_in_one_line(tmp_path, scorer, message):
    args = ("ckpt=world:chars", "process=masked", f"scorer={scorer}", "num_samples=2", "steps=2")
    out = f"out={tmp_path / 'eval.json'}"
    result = run_main("cdlm-eval", *args, "repeats=1", "wandb=false", out, cwd=tmp_path)
    assert_one_line_error(result, message)


def test_a_world_report_goes_to_a_file_named_by_world_and_process():
    from cdlm.evaluation.report import default_path

    target = "cdlm.processes.masked.MaskedProcess"
    assert str(default_path("world:chars", "report", target)) == ("world-chars-masked.eval.json")
