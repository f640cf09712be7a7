"""The ``cdlm-train`` run folder: known, checked and locked before Hydra writes into it, kept to
one training at a time, and left as it was found when the input is refused."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cdlm import config_dir
from cdlm.cli.common import UsageError, hydra_args, require, unwritable
from cdlm.io import FolderInUse, folder_lock

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


def hold(folder: Path):
    """The run folder's lock, taken by the job's first process only (``launched_as_rank_zero``):
    the other ranks of a distributed run write into the folder it holds."""
    return folder_lock(folder) if launched_as_rank_zero() else nullcontext()


def run_dir(overrides: list[str]) -> tuple[Path | None, bool]:
    """(``hydra.run.dir`` as Hydra will resolve it, whether it is fixed): fixed unless it is
    time-stamped (``${now:...}``) or a multirun (one folder per job); None if unknown."""
    args = hydra_args()
    if args.multirun or args.cfg or args.info or args.help:  # no run folder is made
        return None, False
    try:
        with initialize_config_dir(str(config_dir()), version_base="1.3"):
            cfg = compose("train", overrides=overrides, return_hydra_config=True)
        raw = str(OmegaConf.to_container(cfg.hydra.run, resolve=False)["dir"])
        return Path(str(cfg.hydra.run.dir)), "${now:" not in raw
    except (HydraException, OmegaConfBaseException):
        return None, False


def claim(overrides: list[str], locks: ExitStack) -> None:
    """Refuses an output folder that cannot be written or that another run holds; a fixed one is
    locked (in ``locks``) before Hydra writes its ``.hydra/`` files into it. A time-stamped
    folder is new, and ``train`` locks it once Hydra has made it."""
    folder, fixed = run_dir(overrides)
    if folder is None or not launched_as_rank_zero():
        return
    problem = unwritable(folder)
    require(problem is None, f"output folder hydra.run.dir={folder}: {problem}")
    if not fixed:
        return
    if folder.exists():
        _EXISTED.add(folder.resolve())
    try:
        locks.enter_context(folder_lock(folder))
    except FolderInUse as e:
        raise UsageError(str(e)) from None
