"""Callbacks the reliability tests add to real ``cdlm-train`` runs (``+callbacks.NAME._target_=
reliability_helpers.X``): importable from a subprocess with ``tests/`` on PYTHONPATH."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import lightning as L
import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

from cdlm.cli import train as train_cli


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models train several times faster on one thread, above all on a busy machine (a
    killed subprocess gets OMP_NUM_THREADS=1 too, so every run computes alike). Autouse in the
    modules that import it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def train_in_process(args: list[str], monkeypatch) -> None:
    """``cdlm-train ARGS`` in this process (a real run, Hydra and all, minus the start-up)."""
    monkeypatch.setattr(sys, "argv", ["cdlm-train", *args])
    try:
        train_cli.main()
    finally:
        GlobalHydra.instance().clear()


class Pace(L.Callback):
    """Sleeps after every training step, so that a killer has time to strike mid-run."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.seconds:
            time.sleep(self.seconds)


class Poison(L.Callback):
    """Makes the network's output NaN at the given optimizer steps (``global_step`` before the
    step), or at every step from ``start`` on: a bad batch, or a run that has diverged."""

    def __init__(self, steps: Sequence[int] = (), start: int | None = None) -> None:
        self.steps, self.start = set(steps), start
        self.handle = None

    def _due(self, step: int) -> bool:
        return step in self.steps or (self.start is not None and step >= self.start)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._due(trainer.global_step):
            self.handle = pl_module.network.register_forward_hook(
                lambda module, args, out: out * torch.nan
            )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
