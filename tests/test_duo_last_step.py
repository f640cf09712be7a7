"""experiments/duo_last_step.py's own figures, by hand: the share of forbidden pairs, the mean and
SE over sample sets (an infinite set makes the mean infinite), and the configs each process
gets (uniform both last steps, masked none)."""

import math

import pytest
import torch
from conftest import experiment_module

from cdlm.worlds.reference import as_reference

duo = experiment_module("duo_last_step")


def test_forbidden_pairs_are_counted_over_adjacent_pairs():
    q = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    ref = as_reference(q)
    tokens = torch.tensor([[0, 1, 0, 2], [1, 1, 0, 0]])  # pairs: 01 10 02 | 11 10 00
    assert duo.forbidden_pair_share(tokens, ref) == pytest.approx(2 / 6)  # 02 and 11


def test_mean_and_se_over_sets():
    mean, se = duo.mean_se([1.0, 2.0, 3.0])
    assert mean == 2.0 and se == pytest.approx(1 / math.sqrt(3))
    mean, se = duo.mean_se([1.0, math.inf])
    assert math.isinf(mean) and math.isnan(se)


def test_uniform_draws_both_last_steps_and_masked_none():
    assert duo.configs("uniform") == [(last, s) for s in duo.STEPS for last in ("draw", "greedy")]
    assert duo.configs("masked") == [("-", s) for s in duo.STEPS]
