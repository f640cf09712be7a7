"""Checkpoints a killed run resumes from as if it had never stopped (docs/reliability.md).

Three pieces: ``Checkpoint`` writes Lightning checkpoints atomically, by step count and by wall
clock as well as at validation, never with non-finite weights; ``StepSeed`` makes each training
step's randomness a function of the run's seed and the step's place in the data, so a resumed
run draws the noise the uninterrupted one would have; ``find_resume`` picks the newest checkpoint
of a run folder that is whole (``cdlm-train resume=auto``). The data order's position is saved by
the dataloader itself (``cdlm.data.order``).
"""

from __future__ import annotations

import hashlib
import os
import time
import zipfile
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_warn


def weights_finite(module: torch.nn.Module) -> bool:
    """Whether every parameter and buffer of ``module`` is finite (one host sync)."""
    tensors = [t for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()]
    if not tensors:
        return True
    return bool(torch.stack([t.isfinite().all() for t in tensors]).all())


class Checkpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` (by default: at every validation, plus ``last.ckpt``) with
    two additions. ``every_minutes`` also saves after that much wall clock since the last save,
    together with ``every_n_train_steps`` if both are given (Lightning allows only one trigger).
    Every file is written to a temporary name and renamed over the old one, so a kill during the
    write leaves the previous checkpoint whole; and a module with non-finite weights is not saved
    at all, so the last good checkpoint is never replaced by a broken one."""

    def __init__(self, *args, every_minutes: float | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if every_minutes is not None and not every_minutes > 0:
            raise ValueError(f"checkpoint.every_minutes must be > 0, got {every_minutes}")
        self.every = timedelta(minutes=every_minutes) if every_minutes else None
        self._last_save = time.monotonic()
        self._checked: tuple[int | None, bool] = (None, True)  # (global step, weights finite)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._last_save = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.every is None or self._should_skip_saving_checkpoint(trainer):
            return
        due = time.monotonic() - self._last_save >= self.every.total_seconds()
        if trainer.strategy.broadcast(due):  # rank 0's clock decides for every rank
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)

    def _finite(self, trainer: L.Trainer) -> bool:
        """Checked before Lightning's bookkeeping, which would otherwise delete the previous
        top-k file for a new one that is then not written."""
        if self._checked[0] != trainer.global_step:
            ok = weights_finite(trainer.lightning_module)
            if not ok:
                rank_zero_warn(
                    f"step {trainer.global_step}: the model has non-finite weights; no checkpoint "
                    "written, the previous ones stay"
                )
            self._checked = (trainer.global_step, ok)
        return self._checked[1]

    def _save_topk_checkpoint(self, trainer: L.Trainer, candidates: dict) -> None:
        if self._finite(trainer):
            super()._save_topk_checkpoint(trainer, candidates)

    def _save_last_checkpoint(self, trainer: L.Trainer, candidates: dict) -> None:
        if self._finite(trainer):
            super()._save_last_checkpoint(trainer, candidates)

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        if not self._finite(trainer):  # e.g. a save on exception
            return
        path = Path(filepath)
        tmp = path.with_name(f".{path.name}.tmp")  # the same name on every rank
        super()._save_checkpoint(trainer, str(tmp))
        if trainer.is_global_zero:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        trainer.strategy.barrier("Checkpoint.replace")
        self._last_checkpoint_saved = filepath
        self._last_save = time.monotonic()


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
