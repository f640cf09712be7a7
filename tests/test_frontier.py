"""The temperature frontier (cdlm/evaluation/frontier.py): gen-PPL read at an entropy by hand on
three points; a temperature reaches each kind of sampler where it draws; ``cdlm-eval
metric=frontier`` gives one point per temperature, colder ones less diverse, on a masked model
(the sampler's rule) and a gaussian one (the x0 softmax)."""

from __future__ import annotations

import json
import math

import pytest
from conftest import run_main
from test_pretrained import tiny_base  # noqa: F401  a fixture: the tiny local scorer

from cdlm.evaluation.frontier import at_entropy
from cdlm.generation import named_sampler, with_temperature


def test_gen_ppl_at_an_entropy_is_log_linear_between_the_points_that_bracket_it():
    points = [(7.0, 100.0), (8.0, 1000.0), (9.0, 10.0)]
    assert at_entropy(points, 7.5) == pytest.approx(math.sqrt(100.0 * 1000.0))  # not 550
    assert at_entropy(points, 8.25) == pytest.approx(10**2.5)  # 1000^0.75 * 10^0.25
    assert at_entropy(points, 7.0) == pytest.approx(100.0)
    assert at_entropy(points, 9.0) == pytest.approx(10.0)
    assert at_entropy(points, 6.99) is None and at_entropy(points, 9.01) is None


def test_a_temperature_reaches_a_masked_samplers_rule_and_any_other_sampler_itself():
    masked = with_temperature(named_sampler("ancestral", block_length=4), 0.5)
    assert masked.keywords["rule"].temperature == 0.5 and "temperature" not in masked.keywords
    assert masked.keywords["block_length"] == 4  # the other options kept
    ar = with_temperature(named_sampler("ar", stop_at_eos=False), 0.7)
    assert ar.keywords["temperature"] == 0.7 and ar.keywords["stop_at_eos"] is False
    assert with_temperature(named_sampler("duo_ancestral"), 0.8).keywords["temperature"] == 0.8
    with pytest.raises(ValueError, match="no temperature"):
        with_temperature(named_sampler("euler"), 0.5)  # an ODE solver draws nothing


def frontier(ckpt, temperatures: str, scorer: str, corpus, tmp_path):
    """``cdlm-eval metric=frontier`` on a tiny model: (the finished command, its JSON report)."""
    out = tmp_path / "frontier.json"
    result = run_main(
        "cdlm-eval",
        f"ckpt={ckpt}",
        "metric=frontier",
        f"metric.temperatures={temperatures}",
        "num_samples=8",
        "steps=4",
        f"scorer={scorer}",
        f"data.path={corpus}",
        "wandb=false",
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result, json.loads(out.read_text())


def test_cdlm_eval_frontier_gives_a_point_per_temperature_colder_ones_less_diverse(
    tiny_masked_checkpoint,
    tiny_corpus,
    tiny_base,  # noqa: F811
    tmp_path,
):
    result, report = frontier(
        tiny_masked_checkpoint, "[1.0,0.05,0.5]", f"hf:{tiny_base}", tiny_corpus, tmp_path
    )
    points = report["points"]
    assert [p["temperature"] for p in points] == [0.05, 0.5, 1.0]
    entropies = [p["entropy"] for p in points]
    assert entropies == sorted(entropies) and entropies[0] < entropies[-1]
    assert all(p["gen_ppl"] > 1 for p in points)
    real = report["reference"]
    assert real["lengths_of_temperature"] == 1.0 and real["gen_ppl"] > 1
    curve = sorted((p["entropy"], p["gen_ppl"]) for p in points)
    read = at_entropy(curve, real["token_entropy_bits"])
    assert report["gen_ppl_at_reference_entropy"] == read
    assert "T=0.05" in result.stdout and "real val text" in result.stdout


def test_a_gaussian_frontier_tempers_the_x0_softmax_and_without_a_scorer_gives_entropies(
    tiny_checkpoint, tiny_corpus, tmp_path
):
    _, report = frontier(tiny_checkpoint, "[0.05,1.0]", "none", tiny_corpus, tmp_path)
    cold, warm = report["points"]
    assert cold["entropy"] < warm["entropy"]  # measured: 1.65 against 6.44 bits
    assert cold["gen_ppl"] is None and report["gen_ppl_at_reference_entropy"] is None
