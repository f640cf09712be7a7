"""Checkpoints a killed run resumes from as if it had never stopped (docs/guide/reliability.md).

Four pieces: ``Checkpoint`` writes Lightning checkpoints atomically (``AtomicCheckpointIO``),
by step count and by wall clock as well as at validation, never with non-finite weights;
``StepSeed`` makes each training step's randomness a function of the run's seed and the step's
place in the data, so a resumed run draws the noise the uninterrupted one would have;
``find_resume`` picks the newest checkpoint of a run folder that is whole (``cdlm-train
resume=auto``); and SIGTERM ends a fit between two steps (Lightning's own handler, asked by the
long callbacks too: ``stop_if_terminated``) with exit status 143 (``SIGTERM_STATUS``). The data order's position is saved by the dataloader itself
(``cdlm.data.order``). Only Lightning's public API is used (issue 42,
tests/test_lightning_public.py): a private member changes without notice on an upgrade.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sys
import time
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from cdlm.io import atomic_path


def weights_finite(module: torch.nn.Module) -> bool:
    """Whether every parameter and buffer of ``module`` is finite (one host sync)."""
    tensors = [t for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()]
    if not tensors:
        return True
    return bool(torch.stack([t.isfinite().all() for t in tensors]).all())


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, but each file goes to a temporary name in its folder, is
    flushed to disk and renamed over the old one (``cdlm.io.atomic_path``). Lightning's own
    writes the bytes in place, so a kill during the write leaves a torn file where the previous
    checkpoint was."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        with atomic_path(path) as tmp:
            torch.save(checkpoint, tmp)


class AtEnd(L.Callback):
    """A callback whose end-of-training work (``at_end``) every finished run must have done: in
    ``on_train_end``, or in ``on_fit_end`` for a run resumed from a checkpoint at its last step
    (a kill came between that checkpoint and this work): Lightning skips the training loop there,
    and its ``on_train_end`` with it."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        self.ended = False

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.ended = True
        self.at_end(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.ended:
            self.ended = True
            self.at_end(trainer, pl_module)
        super().on_fit_end(trainer, pl_module)

    def at_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        raise NotImplementedError


class Checkpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` (at every validation, plus ``last.ckpt`` if asked) with
    three additions. It also saves every ``every_n_train_steps`` optimizer steps and once
    ``every_minutes`` of wall clock have passed since the last save, both together if given
    (Lightning allows one trigger, and none beside the validation one). Files are written
    through ``AtomicCheckpointIO``, which it installs in place of Lightning's default writer.
    And a module with non-finite weights is not saved at all: the check comes before Lightning's
    bookkeeping, which would otherwise delete the previous top-k file for a new one that is then
    not written, so the last good checkpoints stay.

    Lightning's own triggers are left at their default (once per validation, or per epoch
    without validation); the extra saves call that same save (``on_validation_end`` /
    ``on_train_epoch_end``: exactly one of the two saves, once per step), so top-k and
    ``last.ckpt`` keep Lightning's bookkeeping."""

    def __init__(
        self,
        *,
        every_n_train_steps: int | None = None,
        every_minutes: float | None = None,
        **kwargs: Any,
    ) -> None:
        for name in ("every_n_epochs", "train_time_interval"):
            if kwargs.get(name) is not None:
                raise ValueError(
                    f"checkpoint.{name} is not supported: checkpoints come at every validation, "
                    "and also by checkpoint.every_n_train_steps and checkpoint.every_minutes"
                )
        super().__init__(**kwargs)
        if every_n_train_steps is not None and every_n_train_steps < 1:
            raise ValueError(
                f"checkpoint.every_n_train_steps must be >= 1, got {every_n_train_steps}"
            )
        if every_minutes is not None and not every_minutes > 0:
            raise ValueError(f"checkpoint.every_minutes must be > 0, got {every_minutes}")
        self.every_n_train_steps = every_n_train_steps or 0
        self.every = timedelta(minutes=every_minutes) if every_minutes else None
        self._last_save = time.monotonic()
        self._checked: tuple[int | None, bool] = (None, True)  # (global step, weights finite)

    @property
    def state_key(self) -> str:
        """The key Lightning gave this callback's state when it ran the step trigger itself:
        checkpoints written then keep their bookkeeping (else ``last.ckpt`` would look like
        another run's and a ``last-v1.ckpt`` be written beside it), and two checkpoint
        callbacks with different step triggers stay apart."""
        steps = self.every_n_train_steps
        triggers = {
            "monitor": self.monitor,
            "mode": self.mode,
            "every_n_train_steps": steps,
            "every_n_epochs": 0 if steps else 1,
            "train_time_interval": None,
        }
        return f"{type(self).__qualname__}{triggers!r}"

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        io = trainer.strategy.checkpoint_io
        if type(io) is TorchCheckpointIO:  # Lightning's default
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        elif not isinstance(io, AtomicCheckpointIO):
            rank_zero_warn(f"checkpoints are written by {type(io).__name__}, maybe not atomically")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        self.trained = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self.trained = True
        self._last_save = time.monotonic()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A run resumed at its last step trains nothing (Lightning skips the loop) and saves
        no ``last.ckpt``; resumed from another file (a kill came mid-write of ``last.ckpt``), it
        makes ``last.ckpt`` a copy of that whole checkpoint, the run's final state."""
        super().on_fit_end(trainer, pl_module)
        if self.trained or not (self.save_last and trainer.ckpt_path and trainer.is_global_zero):
            return
        last = Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"
        if Path(trainer.ckpt_path).resolve() != last.resolve():
            with atomic_path(last) as tmp:
                shutil.copyfile(trainer.ckpt_path, tmp)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Every save restarts the wall clock, whichever trigger (or caller) made it. And the
        epoch a save falls in is counted as started: a run resumed from a checkpoint of an
        epoch's last batch begins the next epoch without Lightning counting it ready and started
        (its restart-at-epoch-end branch), so its own checkpoints read as taken between epochs,
        and a second resume from one of them repeated the epoch's data (found by
        scripts/crash_kills.py; tests/test_resume.py)."""
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        self._last_save = time.monotonic()
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress")
        if trainer.state.fn == "fit" and progress is not None:
            for counts in (progress["total"], progress["current"]):
                if counts["ready"] == counts["completed"]:  # an epoch under way, uncounted
                    counts["ready"] = counts["started"] = counts["completed"] + 1
                    counts["processed"] = counts["completed"]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        due = bool(self.every_n_train_steps) and trainer.global_step % self.every_n_train_steps == 0
        if self.every is not None:
            late = time.monotonic() - self._last_save >= self.every.total_seconds()
            due = trainer.strategy.broadcast(due or late)  # rank 0's clock decides for every rank
        if due and self._finite(trainer):
            super().on_validation_end(trainer, pl_module)
            super().on_train_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._finite(trainer):
            super().on_validation_end(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._finite(trainer):
            super().on_train_epoch_end(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._finite(trainer):
            super().on_train_end(trainer, pl_module)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # only when it would save: the check is a collective, and one rank may fail alone
        if not self.save_on_exception or self._finite(trainer):
            super().on_exception(trainer, pl_module, exception)

    def _finite(self, trainer: L.Trainer) -> bool:
        """Whether the module's weights are finite on every rank (a sharded module's shards
        differ, and the ranks must agree on whether to save); checked once per step."""
        if self._checked[0] != trainer.global_step:
            ok = trainer.strategy.reduce_boolean_decision(
                weights_finite(trainer.lightning_module), all=True
            )
            if not ok:
                rank_zero_warn(
                    f"step {trainer.global_step}: the model has non-finite weights; no checkpoint "
                    "written, the previous ones stay"
                )
            self._checked = (trainer.global_step, ok)
        return self._checked[1]


class StepSeed(L.Callback):
    """Reseeds torch's global generator before every training batch from (seed, process rank,
    epoch, batch index), all of which a checkpoint restores. Noise draws, label dropout and
    dropout then depend on where the step falls in the data, not on what ran before it in this
    process (validation, sample logging, a dataloader's start), so a resumed run repeats the
    uninterrupted one exactly."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        key = f"train-step:{self.seed}:{trainer.global_rank}:{trainer.current_epoch}:{batch_idx}"
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
        torch.manual_seed(int.from_bytes(digest, "little") >> 1)


def is_whole_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a complete Lightning checkpoint (torch's zip format, every member's
    checksum intact); reads the file but unpickles nothing."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            return any(n.endswith("data.pkl") for n in names) and archive.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return False


def find_resume(folder: str | Path) -> Path | None:
    """The newest whole ``.ckpt`` in ``folder`` (a run's checkpoints folder), or None. Temporary
    files of interrupted writes and torn files are passed over."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    found = [p for p in folder.glob("*.ckpt") if not p.name.startswith(".") and p.is_file()]
    for path in sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True):
        if is_whole_checkpoint(path):
            return path
    return None


SIGTERM_STATUS = 128 + signal.SIGTERM  # what a shell reports for a process SIGTERM ended


def stop_if_terminated(trainer: L.Trainer) -> None:
    """Ends the fit (``SIGTERMException``, as Lightning's loops do) where the run got SIGTERM.
    Lightning's handler only sets ``trainer.received_sigterm``, which its loops read between
    training steps and validation batches; a callback that works for minutes (the world
    excess's oracle, sample logging, the final bound) asks before it starts."""
    if trainer.received_sigterm:
        raise SIGTERMException


def report_sigterm(trainer: L.Trainer) -> None:
    """After a fit that SIGTERM stopped (between two steps: no checkpoint half-written), says
    on stderr (rank 0) where the run can resume. The caller then exits with ``SIGTERM_STATUS``:
    Lightning's ``SIGTERMException`` exits with 0, and a killed sweep job would read as done."""
    saver = trainer.checkpoint_callback
    last = find_resume(saver.dirpath) if saver is not None and saver.dirpath else None
    where = f"resume=auto continues from {last}" if last else "no checkpoint was written yet"
    if trainer.is_global_zero:
        step = trainer.global_step
        print(f"cdlm-train: stopped by SIGTERM at step {step}; {where}", file=sys.stderr)
