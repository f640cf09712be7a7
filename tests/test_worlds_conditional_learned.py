"""The learned rows of the conditional worlds study (experiments/worlds_conditional_learned.py):
each model's eval grid has the jobs it says, and the two goals are read off rows by hand."""

from __future__ import annotations

import math

import pytest
from conftest import experiment_module
from test_studies import grid

MODELS = [
    {"world": w, "recipe": r, "folder": f"/m/{w}/{r}"}
    for w in ("chars", "agreement")
    for r in ("gaussian_noised_prompt", "gaussian_clean_prompt", "masked", "block_default", "autoregressive",
              "autoregressive_fim")
]  # fmt: skip


def test_each_models_grid_has_the_jobs_it_counts(tmp_path):
    conditional = experiment_module("worlds_conditional")
    learned = experiment_module("worlds_conditional_learned")
    files = conditional.prompt_files(tmp_path)
    total = {}
    for model in MODELS:
        for cmd, group, jobs in learned.commands(tmp_path, model, files[model["world"]],
                                                 (16, 64, 128), 8):  # fmt: skip
            sweep = dict(a.split("=", 1) for a in cmd[2:] if not a.startswith("hydra."))
            assert len(grid(sweep)) == jobs, (model, group)
            if group.name.endswith("_goal"):  # spaced for the old seed + i
                assert sweep["seed"] == "0,8,16,24"
            total[(model["world"], model["recipe"], group.name)] = jobs
    # plain AR: the continuation once; the continuation at every step count, a gap at the
    # first; every seed on gaussian's continuation and on the bridge
    assert total[("chars", "autoregressive", "autoregressive_continuation")] == 1
    assert ("chars", "autoregressive", "autoregressive_infill") not in total
    assert not any(k[0] == "chars" and k[2].endswith("_goal") and "gaussian" not in k[1]
                   for k in total)  # fmt: skip
    assert total[("chars", "masked", "masked_continuation")] == 3
    assert total[("chars", "masked", "masked_infill")] == 1
    noised = "gaussian_noised_prompt"
    assert total[("agreement", noised, f"{noised}_continuation_goal")] == 3 * 4
    assert total[("agreement", noised, f"{noised}_bridge_goal")] == 4
    assert total[("agreement", noised, f"{noised}_infill")] == 1
    assert total[("agreement", "autoregressive_fim", "autoregressive_fim_bridge_goal")] == 4
    assert total[("agreement", "autoregressive_fim", "autoregressive_fim_continuation")] == 1
    cmd, _, jobs = learned.infill_command(tmp_path, "agreement", MODELS, 32, 64, (1, 4))
    assert jobs == 5 and len(grid(dict(a.split("=", 1) for a in cmd[2:4]))) == 5


def rows(world, task, recipe, values, key, steps=64, **extra):
    process = {"gaussian_clean_prompt": "gaussian"}.get(recipe, recipe.split("_")[0])
    return [
        {"world": world, "task": task, "recipe": recipe, "process": process, "steps": steps,
         "seed": s, key: v} | extra
        for s, v in enumerate(values)
    ]  # fmt: skip


def test_the_prompt_view_goal_by_hand():
    learned = experiment_module("worlds_conditional_learned")
    clean = rows("chars", "continuation", "gaussian_clean_prompt", [0.10, 0.12, 0.11, 0.13],
                 "kl_rate", prompt_view="clean", violation_rate=0.0)  # fmt: skip
    noised = rows("chars", "continuation", "gaussian", [0.14, 0.16, 0.15, 0.17], "kl_rate",
                  prompt_view="noised", violation_rate=0.0)  # fmt: skip
    (found,) = learned.view_goal(clean + noised)
    se = math.sqrt(0.0005 / 3 / 4)  # each view: squares of (-.015, .005, -.005, .015) sum to .0005
    assert found["gap"] == pytest.approx(0.04)
    assert found["gap_se"] == pytest.approx(math.hypot(se, se), rel=1e-5)
    assert found["met"]  # 0.04 against 2 x 0.0091
    close = [r | {"kl_rate": r["kl_rate"] - 0.03} for r in noised]
    assert not learned.view_goal(clean + close)[0]["met"]  # 0.01 < 2 x 0.0091
    # an infinite KL in one set: the KL over the samples the conditional allows decides
    ruled_out = [r | {"kl_rate_possible": r["kl_rate"] - 0.1} for r in clean + noised]
    ruled_out[0]["kl_rate"] = None
    (found,) = learned.view_goal(ruled_out)
    assert found["metric"] == "kl_rate_possible" and found["gap"] == pytest.approx(0.04)
    for r in ruled_out:  # none allowed in one set: the violation rates decide
        r["violation_rate"] = 0.5 if r["prompt_view"] == "noised" else 0.1 + 0.01 * r["seed"]
    ruled_out[1]["kl_rate_possible"] = None
    (found,) = learned.view_goal(ruled_out)
    assert found["metric"] == "violation_rate" and found["met"]
    assert found["gap"] == pytest.approx(0.5 - 0.115)
    for r in ruled_out:  # every sample ruled out in both views: no gap, no goal
        r["violation_rate"] = 1.0
    assert not learned.view_goal(ruled_out)[0]["met"]


def test_the_violation_goal_by_hand():
    learned = experiment_module("worlds_conditional_learned")
    masked = rows("agreement", "bridge", "masked", [0.0, 0.02, 0.0, 0.02], "violation_rate")
    # block cannot see the closing name: never the best, however few its violations
    block = rows("agreement", "bridge", "block_default", [0.0, 0.0, 0.0, 0.0], "violation_rate")
    fim = rows("agreement", "bridge", "autoregressive_fim", [0.2, 0.3, 0.2, 0.3],
               "violation_rate", steps=None)  # fmt: skip
    found = learned.violation_goal(masked + block + fim)
    assert found["best"]["recipe"] == "masked" and found["best"]["mean"] == pytest.approx(0.01)
    assert found["gap"] == pytest.approx(0.24) and found["met"]
    se_masked, se_fim = math.sqrt(0.0004 / 3 / 4), math.sqrt(0.01 / 3 / 4)  # sum of squares
    assert found["gap_se"] == pytest.approx(math.hypot(se_masked, se_fim))
    worse = [r | {"violation_rate": 0.0} for r in fim]
    assert not learned.violation_goal(masked + block + worse)["met"]


def test_learned_infill_rows_stand_beside_their_oracle_and_the_ceiling():
    learned = experiment_module("worlds_conditional_learned")
    figures = {"cases": 64, "token_accuracy_se": 0.02, "best_token_accuracy": 0.5,
               "span_exact": 0.1, "span_exact_se": 0.01, "exact_span_exact": 0.2}  # fmt: skip
    mine = [{"world": "agreement", "process": "masked", "recipe": "masked", "sampler": "ancestral",
             "span": 1, "token_accuracy": 0.1, "exact_token_accuracy": 0.4} | figures]  # fmt: skip
    oracle = [{"world": w, "process": "masked", "span": 1, "token_accuracy": a,
               "token_accuracy_se": 0.05, "span_exact": a} for w, a in (("agreement", 0.375),
                                                                        ("chars", 0.9))]  # fmt: skip
    (row,) = learned.infill_lines(mine, oracle)[-1].splitlines()[2:]
    cells = [c.strip() for c in row.strip("|").split("|")]
    # a quarter of what an exact sampler averages (0.1 / 0.4, s.e. 0.02 / 0.4), its own world's
    # oracle beside it
    assert cells[5:8] == ["0.100 ± 0.020", "0.25 ± 0.05", "0.375 ± 0.050"]
    assert cells[11] == "0.375"


def test_a_set_with_an_infinite_kl_keeps_its_row():
    """The report writes an infinite figure as null, which the table's metrics leave out: the
    row stays, with that figure infinite (every set of a model that breaks every agreement)."""
    learned = experiment_module("worlds_conditional_learned")
    model = {"world": "agreement", "recipe": "masked", "folder": "/m/agreement/masked",
             "prompt_view": None}  # fmt: skip
    figures = {"kl_floor": 0.1, "kl_floor_se": 0.01, "violation_rate": 1.0, "entropy_cond": 2.0,
               "tv_rate": 0.3, "free": 30}  # fmt: skip
    job = {"status": "finished", "folder": "/e/0",
           "overrides": {"ckpt": model["folder"], "prompts": "/p/agreement_bridge.jsonl",
                         "steps": "16", "seed": "0"},
           "metrics": {f"rows/0/{k}": v for k, v in figures.items()} | {"nfe": 16}}  # fmt: skip
    (row,) = learned.learned_rows({"rows": [job]}, [model])
    assert row["task"] == "bridge" and row["violation_rate"] == 1.0
    assert row["kl_rate"] == row["nll_cond"] == row["kl_rate_possible"] == math.inf
