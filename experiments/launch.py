"""``cdlm-train`` runs for the experiment scripts (``import launch`` from experiments/).

Each run is a child Python process, exactly as from the command line, so that Hydra's global
state and Lightning's seeding never leak from one run into the next or into the script's own
measurements; a failed run raises ``subprocess.CalledProcessError``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass
class TrainingRun:
    """What one run cost: ``wall_seconds``, and ``cpu_seconds`` of the child process (user and
    system time, all its threads: the work, whatever else the machine was doing)."""

    wall_seconds: float
    cpu_seconds: float


def train(overrides: list[str], *, wandb: bool = True) -> TrainingRun:
    """``cdlm-train`` with these Hydra ``overrides``; ``wandb=False`` switches W&B off entirely
    (``WANDB_MODE=disabled``) rather than leaving it to the configured logger."""
    env = os.environ if wandb else os.environ | {"WANDB_MODE": "disabled"}
    before, start = os.times(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "cdlm.cli.train", *overrides], check=True, env=env)
    wall, after = time.perf_counter() - start, os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return TrainingRun(wall_seconds=wall, cpu_seconds=cpu)
