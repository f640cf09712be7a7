"""``task=infill`` in an exact world (issue 50, item 5): the passages are the world's own exact
samples, and each row carries the ceiling the world's exact conditional sets, checked against
brute-force enumeration of a tiny hidden chain and on worlds whose answers are known in closed
form (a deterministic cycle: every span is fixed by its left side; fair coins: 1/2 a token)."""

import pytest
import torch
from test_world_conditional import enumerate_world
from test_world_conditional import tiny_world as hidden_world

from cdlm import worlds
from cdlm.configs import compose
from cdlm.evaluation.world_conditional import infill_ceiling
from cdlm.generation import named_sampler
from cdlm.model_file import oracle_model
from cdlm.processes import fim
from cdlm.tasks import suite
from cdlm.tasks.base import named_task
from cdlm.worlds.base import World
from cdlm.worlds.chain import symbol_tokenizer
from cdlm.worlds.conditional import condition
from cdlm.worlds.transition import Transition

LENGTH = 24  # a passage: the world's length less the FIM sentinels


def test_the_ceiling_is_the_enumerated_one():
    world = hidden_world()
    ids = torch.tensor([0, 0, 2, 1, 0, 0])
    free = torch.tensor([False, True, True, False, True, True])
    truth = {k: p for k, p in enumerate_world(world).items() if k[0] == 0 and k[3] == 1}
    total = sum(truth.values())
    truth = {k: p / total for k, p in truth.items()}
    marginals = torch.zeros(6, 3, dtype=torch.float64)
    for seq, p in truth.items():
        for i, v in enumerate(seq):
            marginals[i, v] += p
    spans = marginals[free]
    got = infill_ceiling(condition(world, ids, free))
    assert got["exact_span_exact"] == pytest.approx(sum(p * p for p in truth.values()), rel=1e-10)
    assert got["exact_token_accuracy"] == pytest.approx(float((spans**2).sum(-1).mean()), rel=1e-10)
    assert got["best_token_accuracy"] == pytest.approx(
        float(spans.max(-1).values.mean()), rel=1e-10
    )


def chain_world(name: str, symbols: list[str], matrix: torch.Tensor) -> World:
    """A chain over ``symbols`` (ids 3, 4, ...) starting uniformly."""
    k = len(symbols)
    initial = torch.full((k,), 1.0 / k, dtype=torch.float64)
    emit = torch.arange(k) + 3
    tokenizer = symbol_tokenizer(symbols)
    return World(name, tokenizer, emit, initial, [Transition(matrix)], LENGTH + fim.SENTINELS)


def infill_rows(world: World, monkeypatch, process: str = "masked", sampler: str = "ancestral"):
    monkeypatch.setattr(worlds, "load", lambda spec, **kw: world)  # a world conf/world/ lacks
    model = oracle_model(world, compose("train", [f"process={process}"]).process)
    task = named_task("infill", spans=[1, 4, 8])
    found = suite.report(task, model, named_sampler(sampler), steps=8, seed=0, cases=6, scorer=None)
    return found


def test_a_deterministic_world_is_infilled_exactly_by_its_oracle(monkeypatch):
    cycle = torch.tensor([[0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=torch.float64)  # a, b, c, a
    found = infill_rows(chain_world("cycle", ["a", "b", "c"], cycle), monkeypatch)
    assert found["input_length"]["median"] == LENGTH
    for row in found["rows"]:
        assert row["token_accuracy"] == row["span_exact"] == row["fixed_intact"] == 1.0
        for key in ("exact_token_accuracy", "best_token_accuracy", "exact_span_exact"):
            assert row[key] == pytest.approx(1.0, abs=1e-12)


def test_fair_coins_set_the_ceiling_of_one_half_a_token(monkeypatch):
    coins = torch.full((2, 2), 0.5, dtype=torch.float64)
    found = infill_rows(chain_world("coins", ["a", "b"], coins), monkeypatch)
    for row in found["rows"]:
        assert row["exact_token_accuracy"] == pytest.approx(0.5, abs=1e-12)
        assert row["best_token_accuracy"] == pytest.approx(0.5, abs=1e-12)
        assert row["exact_span_exact"] == pytest.approx(0.5 ** row["span"], rel=1e-10)
        assert row["fixed_intact"] == 1.0
