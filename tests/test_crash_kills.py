"""Randomised crash-consistency (docs/guide/reliability.md): ``scripts/crash_kills.py`` SIGKILLs
real ``cdlm-train`` runs at 20 random instants (steps, atomic writes, the CSV and W&B loggers,
start-up) and resumes each with ``resume=auto``; no kill may leave a torn file, and every chain
must repeat the uninterrupted run exactly. The seed is drawn anew each run (``CDLM_CRASH_SEED``
replays one) and named in the failure."""

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
