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


def test_an_infinite_kl_rate_reaches_the_json_as_null_and_named(tmp_path):
    """The results JSON keeps one convention (``study.write``): an infinite KL rate is null,
    its key named in the row's ``infinite``, never the string "Infinity"."""
    import json

    found = {"rows": [{"commit": "abc123", "cost": {"parallel_jobs": 1}}]}
    row = {"recipe": "uniform", "kl_rate": math.inf, "kl_rate_se": math.nan, "kl_floor": 0.04}
    duo.publish({"rows": [row]}, "body\n", ["sweep"], found, tmp_path)
    text = (tmp_path / "duo_last_step.json").read_text()
    record = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    written = record["rows"][0]
    assert written["kl_rate"] is None and written["kl_rate_se"] is None
    assert written["kl_floor"] == 0.04 and written["infinite"] == ["kl_rate", "kl_rate_se"]
    assert "recipe=uniform hydra" in record["command"]  # the one recipe trained
    back = duo.restored(written)  # read back for --reuse
    assert back["kl_rate"] == math.inf and math.isnan(back["kl_rate_se"]) and "infinite" not in back
    old = {"kl_rate": "Infinity", "kl_rate_se": "NaN", "sets": [{"kl_rate": "Infinity"}]}
    back = duo.restored(old)  # a file written before the convention
    assert math.isinf(back["kl_rate"]) and math.isnan(back["kl_rate_se"])
    assert math.isinf(back["sets"][0]["kl_rate"])


def test_two_recipes_retrained_give_a_command_hydra_accepts(tmp_path):
    """Two of the three recipes retrained: the training command sweeps them as one quoted
    string (Hydra refuses a bare comma list under hydra.sweeper.params), and --reuse carries
    the reused model's last-step check over."""
    import json

    from cdlm.configs import compose

    found = {"rows": [{"commit": "abc123", "cost": {"parallel_jobs": 1}}]}
    rows = [{"recipe": r, "kl_rate": 0.5} for r in ("masked", "masked_no_ar_phase")]
    duo.publish({"rows": rows}, "body\n", ["sweep"], found, tmp_path)
    command = json.loads((tmp_path / "duo_last_step.json").read_text())["command"]
    override = command.split()[3].strip("'")
    assert override == 'hydra.sweeper.params.recipe="masked,masked_no_ar_phase"'
    cfg = compose("train", ["experiment=duo_last_step", override], hydra=True)
    assert cfg.hydra.sweeper.params.recipe == "masked,masked_no_ar_phase"
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"last_step_check": {"chars-uniform": [1], "chars-x": [2]}}))
    assert duo.reused_checks(earlier, ["uniform"]) == {"chars-uniform": [1]}
