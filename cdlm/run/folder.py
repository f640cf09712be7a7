"""The ``cdlm-train`` run folder: known, checked and locked before Hydra writes into it, kept to
one training at a time, left as it was found when the input is refused, and searched for the
checkpoint that ``resume=auto`` continues from."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cdlm.configs import compose
from cdlm.io import FolderInUse, folder_lock, remove_temporaries
from cdlm.training.resume import find_resume
from cdlm.validation import UsageError, require, unwritable

_EXISTED: set[Path] = set()  # fixed run folders that were there before this command


@contextmanager
def discard_if_unused(folder: Path) -> Iterator[None]:
    """On an error before training starts, removes what Hydra and the lock put in a run folder
    that holds nothing else (and the folder, if this command made it), so that refused input
    leaves no output behind."""
    try:
        yield
    except BaseException:
        ours = {".hydra", ".cdlm.lock", f"{HydraConfig.get().job.name}.log"}
        if folder.is_dir() and {p.name for p in folder.iterdir()} <= ours:
            for name in ours:
                path = folder / name
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
            if folder.resolve() not in _EXISTED:
                folder.rmdir()
        raise


def launched_as_rank_zero() -> bool:
    """Whether this process is the job's first: the one that owns the run folder. The others are
    Lightning's relaunched copies of the command (``LOCAL_RANK``, and ``NODE_RANK`` on other
    nodes) or processes a launcher started with a global rank (``RANK``: torchrun,
    ``SLURM_PROCID``: srun); they share the folder that rank 0 holds."""
    for var in ("RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var]) == 0
    return int(os.environ.get("LOCAL_RANK", 0)) == 0 and int(os.environ.get("NODE_RANK", 0)) == 0


def hold(folder: Path) -> AbstractContextManager:
    """The run folder's lock, taken by the job's first process only (``launched_as_rank_zero``):
    the other ranks of a distributed run write into the folder it holds."""
    return folder_lock(folder) if launched_as_rank_zero() else nullcontext()


@dataclass(frozen=True)
class RunDir:
    """``hydra.run.dir`` as Hydra will resolve it; ``fixed`` unless it is time-stamped
    (``${now:...}``), when it is new each time."""

    path: Path
    fixed: bool


def run_dir(overrides: list[str]) -> RunDir | None:
    """The run folder of a single run with these overrides; None if it cannot be known."""
    try:
        cfg = compose("train", overrides, hydra=True)
        raw = str(OmegaConf.to_container(cfg.hydra.run, resolve=False)["dir"])
        return RunDir(Path(str(cfg.hydra.run.dir)), "${now:" not in raw)
    except (HydraException, OmegaConfBaseException):
        return None


def claim(overrides: list[str], locks: ExitStack) -> None:
    """Refuses an output folder that cannot be written or that another run holds; a fixed one is
    locked (in ``locks``) before Hydra writes its ``.hydra/`` files into it. A time-stamped
    folder is new, and the training locks it once Hydra has made it. Only for a command that
    makes a run folder (not a multirun, ``--cfg``, ``--info`` or ``--help``)."""
    folder = run_dir(overrides)
    if folder is None or not launched_as_rank_zero():
        return
    problem = unwritable(folder.path)
    require(problem is None, f"output folder hydra.run.dir={folder.path}: {problem}")
    if not folder.fixed:
        return
    if folder.path.exists():
        _EXISTED.add(folder.path.resolve())
    try:
        locks.enter_context(folder_lock(folder.path))
    except FolderInUse as e:
        raise UsageError(str(e)) from None


@dataclass(frozen=True)
class Resume:
    """What ``fit`` resumes from (``ckpt``; None: a fresh start) and, for ``resume=auto``, the
    folder that was searched for it (``searched``)."""

    ckpt: str | None
    searched: Path | None = None

    def describe(self) -> str | None:
        """What ``resume=auto`` found, in a line (None for ``resume`` as given)."""
        if self.searched is None:
            return None
        if self.ckpt:
            return f"resume=auto: resuming from {self.ckpt}"
        return (
            f"resume=auto: no checkpoint in {self.searched}, starting fresh (resume=auto "
            "continues the run of the same hydra.run.dir)"
        )


def resume_point(cfg: DictConfig, folder: Path) -> Resume:
    """``resume`` as given, or for ``resume=auto`` the newest whole checkpoint of this run (whose
    folder, held by this run, loses the temporaries of writes a kill interrupted)."""
    if cfg.resume != "auto":
        return Resume(cfg.resume)
    if launched_as_rank_zero():
        remove_temporaries(folder)
    where = Path(OmegaConf.select(cfg, "callbacks.checkpoint.dirpath") or folder / "checkpoints")
    found = find_resume(where)
    return Resume(str(found) if found else None, where)
