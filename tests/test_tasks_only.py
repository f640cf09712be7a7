"""experiments/tasks.py --only: one task's rows re-measured alone (issue 42: the correct rows),
the other tasks not run."""

import argparse
import json
import sys

from test_speed_table import _script


def test_only_keeps_the_named_tasks_of_each_set():
    tasks = _script("tasks", "experiments")
    args = argparse.Namespace(spans=[1], rates=[0.05], samples=2, only=["correct"])
    assert [p[0] for p in tasks.task_plan("masked", "austen", args, None)] == ["correct"]
    assert tasks.task_plan("masked", "code", args, None) == []  # the code set has no correct
    args.only = None
    names = [p[0] for p in tasks.task_plan("masked", "austen", args, None)]
    assert names == ["infill", "correct", "constrain", "write"]


def test_the_script_with_only_correct_writes_only_correct_rows(tiny_masked_checkpoint, tmp_path):
    tasks = _script("tasks", "experiments")
    out = tmp_path / "tasks"
    argv = ["tasks.py", f"--model=masked={tiny_masked_checkpoint}", "--only", "correct"]
    argv += ["--rates", "0.15", "--correct-cases=2", "--scorer=none", f"--out={out}"]
    old, sys.argv = sys.argv, argv
    try:
        tasks.main()
    finally:
        sys.argv = old
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [(r["model"], r["task"], r["rate"]) for r in rows] == [("masked", "correct", 0.15)]
