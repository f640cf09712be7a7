"""The conditional table's reading (experiments/worlds_conditional*.py, issue 50): the goal is
judged on the samplers that decide exactly one token per call, an infinite KL is null in the
JSON, and a block infill is reported as not supported, not as a miss."""

from __future__ import annotations

import json
import math

from conftest import experiment_module

conditional = experiment_module("worlds_conditional")
doc = experiment_module("worlds_conditional_doc")


def row(**fields) -> dict:
    base = {
        "world": "chars", "task": "continuation", "process": "masked", "sampler": "ancestral",
        "steps": 128, "free": 16, "tokens_per_call": 0.9, "exact_rule": False, "supported": True,
        "kl_rate": 0.05, "kl_floor": 0.04, "kl_floor_se": 0.001, "violation_rate": 0.0,
        "nll_cond": 3.3, "nll_cond_se": 0.01, "entropy_cond": 3.3, "tv_rate": 0.07,
    }  # fmt: skip
    r = conditional.finite(base | fields)
    return r | {"at_floor": conditional.at_floor(r)}


def test_an_infinite_kl_is_null_and_named_and_never_at_the_floor():
    r = row(kl_rate=math.inf, violation_rate=0.5)
    assert r["kl_rate"] is None and r["infinite"] == ["kl_rate"] and not r["at_floor"]
    json.dumps(r, allow_nan=False)  # valid JSON
    assert row()["infinite"] == [] and row()["kl_rate"] == 0.05


def test_the_goal_counts_exact_samplers_apart_from_on_average_ones_and_unsupported_rows():
    rows = [
        row(sampler="exact_k", exact_rule=True, tokens_per_call=1.0, kl_rate=0.041),
        row(
            process="block",
            sampler="exact_k",
            exact_rule=True,
            tokens_per_call=1.0,
            kl_rate=0.2,
            layout="unshifted",
        ),  # fmt: skip
        row(process="autoregressive", sampler="ar", exact_rule=True, steps=None, kl_rate=0.04),
        row(kl_rate=0.3),  # ancestral, on average: off, but not judged
        row(sampler="confidence", kl_rate=2.0),  # greedy: neither
        row(
            process="block",
            sampler="exact_k",
            exact_rule=True,
            task="infill",
            supported=False,
            kl_rate=math.inf,
        ),  # fmt: skip
        row(process="gaussian", sampler="euler", prompt_view="clean", steps=16, kl_rate=0.04),
    ]
    found = doc.goals(rows, {"chars": {"continuation": {}, "infill": {}}})
    assert len(found["exact"]) == 3 and [r["sampler"] for r in found["exact_off"]] == ["exact_k"]
    assert found["exact_off"][0]["layout"] == "unshifted"
    assert len(found["on_average"]) == 1 and len(found["on_average_off"]) == 1
    assert len(found["unsupported"]) == 1
    assert found["ode"][0]["first_steps_at_floor"]["euler clean"] == 16
    lines = "\n".join(doc.goal_lines(found, (16, 64, 128)))
    assert "3 rows): 2 at the floor:" in lines and "KL 0.2000 against 0.0400" in lines
    table = doc.task_table([rows[5]])
    assert "∞ (not supported: block sees only earlier blocks)" in table
    assert doc.per_call(rows[0]) == "exactly" and doc.per_call(rows[3]) == "on average"


def test_an_earlier_runs_gaussian_and_infill_rows_fill_only_what_the_folder_lacks(tmp_path):
    """``--previous``: a world's gaussian rows and task=infill rows come from the earlier JSON
    only where the folder has none, marked with its commits (an infinite KL made null)."""
    old_rows = [
        row(world=w, process="gaussian", sampler="ddpm", prompt_view="clean", kl_rate=k)
        for w, k in (("chars", 0.9), ("agreement", math.inf))
    ]
    old_infill = [{"world": w, "process": "masked", "span": 1} for w in ("chars", "agreement")]
    for r, k in zip(old_rows, (0.9, math.inf), strict=True):
        r.pop("infinite")
        r["kl_rate"] = k  # the earlier JSON's Infinity
    previous = tmp_path / "old.json"
    previous.write_text(json.dumps({"commits": ["abc"], "rows": old_rows,
                                    "task_infill": old_infill}))  # fmt: skip
    here = [row(group="gaussian", process="gaussian", sampler="ddpm", prompt_view="clean",
                exact_rule=False)]  # fmt: skip
    infill = [{"world": "chars", "process": "masked", "span": 1}]
    rows, infill = conditional.carried(previous, here, infill)
    (new,) = [r for r in rows if "carried_from" in r]
    assert new["world"] == "agreement" and new["carried_from"] == ["abc"]
    assert new["kl_rate"] is None and new["infinite"] == ["kl_rate"] and not new["at_floor"]
    assert [r["world"] for r in infill if "carried_from" in r] == ["agreement"]
    table = doc.carried_note({"rows": rows, "task_infill": infill})
    assert "`abc`" in "".join(table)
