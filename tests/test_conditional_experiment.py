"""scripts/plan_data.py's pairs output and experiments/conditional.py's reading of its rows:
the same puzzles in both formats, held-out puzzles from their shared validation split, and the
goals on hand-made rows."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import experiment_module as _script

from cdlm.tasks import games

conditional = _script("conditional", "experiments")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def plan_files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("plan")
    for name, kind in (("plan.txt", "text"), ("plan.jsonl", "pairs")):
        cmd = [sys.executable, str(ROOT / "scripts" / "plan_data.py"), str(folder / name)]
        subprocess.run([*cmd, "--count", "60", "--format", kind], check=True)
    return folder


def test_pairs_hold_the_text_lines_puzzles_in_the_same_order(plan_files):
    lines = (plan_files / "plan.txt").read_text().strip().split("\n\n")
    pairs = [json.loads(r) for r in (plan_files / "plan.jsonl").read_text().splitlines()]
    assert len(lines) == len(pairs) == 120
    assert [p["prompt"] + p["response"] for p in pairs] == lines
    assert all(games.solved(games.parse(p["prompt"]), p["response"]) for p in pairs)


def test_held_puzzles_come_from_the_shared_validation_split(plan_files):
    lines = (plan_files / "plan.txt").read_text().strip().split("\n\n")
    held = conditional.held_puzzles(plan_files / "plan.txt", 1, seed=0)
    tail = lines[len(lines) - round(len(lines) * conditional.VAL_SHARE) :]  # 2 of 120
    assert [p.game for p in held] == list(games.GAMES)
    assert all(p.line in tail for p in held)
    assert held == conditional.held_puzzles(plan_files / "plan.txt", 1, seed=0)


def test_mean_se_by_hand():
    mean, se = conditional.mean_se([1.0, 2.0, 3.0, 6.0])
    assert mean == 3.0 and se == pytest.approx((14 / 3) ** 0.5 / 2)
    assert conditional.mean_se([5.0]) == (5.0, 0.0)


def _plan(model: str, solved: int) -> dict:
    return {"model": model, "solved": solved, "cases": 10}


def _austen(dropout: float, deps: list[float]) -> list[dict]:
    name = f"masked, prompt dropout {dropout:g}"
    return [
        {"model": name, "scale": s, "dependence": d, "dependence_se": 0.01}
        for s, d in zip((0.0, 1.0, 2.0), deps, strict=True)
    ]


def test_goals_are_met_only_when_the_figures_say_so():
    plan = [
        _plan("ar, prompt→answer", 3),
        _plan("ar, whole line", 3),  # a tie is not "more"
        _plan("masked, prompt→answer", 5),
        _plan("masked, whole line", 1),
    ]
    austen = _austen(0.0, [0.1, 0.2, 0.3]) + _austen(0.1, [0.1, 0.3, 0.2])
    said = conditional.goals(plan, austen)
    assert "ar: prompt→answer solved 3/10 held-out puzzles, whole line 3/10" in said[0]
    assert said[0].endswith("missed.") and said[1].endswith("met.")
    assert said[2].endswith("met.") and said[3].endswith("missed.")  # 5 > 3; 1 < 3
    assert "rises monotonically (no goal without dropout)" in said[4]
    assert said[5].endswith("goal (rises monotonically 0 → 2) missed.")


def test_a_jobs_row_name_comes_from_its_overrides():
    plan = {"overrides": {"process": "autoregressive", "data.format": "pairs"}}
    assert conditional.name_of(plan) == ("plan", "ar, prompt→answer")
    text = {"overrides": {"process": "masked", "data.format": "text"}}
    assert conditional.name_of(text) == ("plan", "masked, whole line")
    austen = {"overrides": {"experiment": "conditional_austen", "condition.prompt_dropout": "0.1"}}
    assert conditional.name_of(austen) == ("austen", "masked, prompt dropout 0.1")
