"""Randomised crash-consistency (docs/guide/reliability.md): ``scripts/crash_kills.py`` SIGKILLs
real ``cdlm-train`` runs at 20 random instants (steps, atomic writes, the CSV and W&B loggers,
start-up) and resumes each with ``resume=auto``; no kill may leave a torn file, and every chain
must repeat the uninterrupted run exactly; and each rank of a 2-process DDP run, killed in
turn. The seed is drawn anew each run (``CDLM_CRASH_SEED`` replays one) and named in the
failure."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "crash_kills.py"


@pytest.mark.slow
def test_twenty_random_kills_tear_nothing_and_resume_to_the_same_run(tmp_path):
    seed = int(os.environ.get("CDLM_CRASH_SEED", random.randrange(2**31)))
    report = tmp_path / "report.json"
    args = [sys.executable, str(SCRIPT), "--kills", "20", "--seed", str(seed)]
    result = subprocess.run(
        [*args, "--report", str(report), "--work", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=1500,
        env=os.environ | {"PYTHONPATH": str(SCRIPT.parents[1])},
    )
    assert report.is_file(), (seed, result.stderr[-3000:])
    found = json.loads(report.read_text())
    summary = found["summary"]
    torn = [k for k in found["kills"] if k["torn"]]
    differing = [c for c in found["chains"] if c["differences"] or c["leftovers_after"]]
    assert not torn and not differing, (seed, torn[:3], differing[:3])
    assert summary["kills"] >= 20 and len(summary["by_target"]) >= 3, (seed, summary)
    assert result.returncode == 0, (seed, result.stderr[-3000:])


@pytest.mark.slow  # three 2-process DDP runs and two resumes: ~3 min on 2 cores
def test_a_killed_ddp_rank_ends_its_peer_in_one_line_and_resumes_to_the_same_run(tmp_path):
    """Each rank of a 2-process CPU DDP run is SIGKILLed in turn at a random step: the survivor
    exits within 60 s with one error line and no traceback, no file is torn, and resume=auto on
    both ranks repeats the uninterrupted DDP run (``crash_kills.py --ddp``)."""
    seed = int(os.environ.get("CDLM_CRASH_SEED", random.randrange(2**31)))
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--ddp", "--seed", str(seed), "--report", str(report)]
        + ["--work", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=1200,
        env=os.environ | {"PYTHONPATH": str(SCRIPT.parents[1])},
    )
    assert report.is_file(), (seed, result.stderr[-3000:])
    chains = json.loads(report.read_text())["ddp"]
    assert sorted(c["killed_rank"] for c in chains) == [0, 1], (seed, chains)
    assert not [c for c in chains if c["failures"]], (seed, chains)
    assert result.returncode == 0, (seed, result.stderr[-3000:])


@pytest.mark.slow  # a three-job grid and its table, killed 6 times and rerun: ~2 min
def test_a_killed_eval_grid_or_table_reruns_to_the_same_result(tmp_path):
    """``cdlm-eval -m`` and ``cdlm-table`` SIGKILLed at random instants: no torn file, the grid's
    rerun (``resume=auto``) leaves finished jobs untouched and ends with the uninterrupted
    reports, the table's rerun writes the uninterrupted table (``crash_kills.py --eval``)."""
    seed = int(os.environ.get("CDLM_CRASH_SEED", random.randrange(2**31)))
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--eval", "--kills", "6", "--seed", str(seed)]
        + ["--report", str(report), "--work", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=1200,
        env=os.environ | {"PYTHONPATH": str(SCRIPT.parents[1])},
    )
    assert report.is_file(), (seed, result.stderr[-3000:])
    found = json.loads(report.read_text())
    torn = [k for k in found["kills"] if k["torn"]]
    differing = [c for c in found["chains"] if c["differences"] or c["leftovers_after"]]
    assert not torn and not differing, (seed, torn[:3], differing[:3])
    assert found["summary"]["kills"] == 6, (seed, found["summary"])
    assert result.returncode == 0, (seed, result.stderr[-3000:])
