"""What the experiment scripts record of a training run: its CPU seconds are its own child's, even
when another run ends beside it (launch.py; the scripts train two at a time from threads), and its
optimizer steps are the ones it finished (budget.last_step); an evaluation runs each model in a
child process of its own, once (launch.evaluate_children)."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import experiment_module as _script

launch = _script("launch", "experiments")
budget = _script("budget", "experiments")
BUSY = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass"


def test_a_runs_cpu_seconds_exclude_a_neighbour_that_ended_meanwhile():
    with ThreadPoolExecutor(2) as pool:
        sleeper = pool.submit(
            launch.run, [sys.executable, "-c", "import time; time.sleep(1.5)"], os.environ
        )
        busy = pool.submit(launch.run, [sys.executable, "-c", BUSY], os.environ)
        sleeper, busy = sleeper.result(), busy.result()
    assert busy.cpu_seconds >= 0.4
    assert sleeper.cpu_seconds < 0.3  # the interpreter's start-up only
    assert sleeper.wall_seconds >= 1.5


def test_a_failed_run_raises_with_its_exit_code():
    with pytest.raises(subprocess.CalledProcessError) as failed:
        launch.run([sys.executable, "-c", "raise SystemExit(3)"], os.environ)
    assert failed.value.returncode == 3


def test_a_runs_steps_are_the_ones_it_finished(tiny_ar_checkpoint):
    """3 steps, although the end-of-training rows of its CSV log sit at step 3 (one past the
    last step's row, 2)."""
    run_dir = tiny_ar_checkpoint.parent
    logged = {int(r["step"]) for r in budget.metrics(run_dir) if r["step"]}
    assert max(logged) == 3
    assert budget.last_step(run_dir) == 3


def test_a_run_cut_short_counts_its_newest_checkpoint(tmp_path):
    assert budget.last_step(tmp_path) == 0
    (tmp_path / "checkpoints").mkdir()
    for name in ("step-50.ckpt", "step-100.ckpt", "last.ckpt"):
        (tmp_path / "checkpoints" / name).touch()
    assert budget.last_step(tmp_path) == 100


CHILD = """import argparse, json, os
p = argparse.ArgumentParser()
p.add_argument("--evaluate-one")
p.add_argument("--out")
p.add_argument("--scale", type=int)
a = p.parse_args()
spec = json.loads(a.evaluate_one)
rows = [{"name": spec["name"], "value": spec["value"] * a.scale, "pid": os.getpid()}]
open(a.out, "w").write(json.dumps(rows))
"""


def test_each_spec_is_evaluated_once_in_a_child_of_its_own(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    specs = [{"name": f"m{k}", "value": k} for k in range(3)]
    rows = launch.evaluate_children(script, specs, tmp_path / "out", 2, ["--scale", "10"])
    assert [(r["name"], r["value"]) for r in rows] == [("m0", 0), ("m1", 10), ("m2", 20)]
    assert len({r["pid"] for r in rows}) == 3 and os.getpid() not in {r["pid"] for r in rows}
    script.unlink()  # a finished spec is read back, not evaluated again
    again = launch.evaluate_children(script, specs, tmp_path / "out", 2, ["--scale", "10"])
    assert again == rows
