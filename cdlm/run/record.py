"""What a finished job was and what it cost: the one definition of a run's steps and of its
cost, written by ``cdlm-train`` and ``cdlm-eval`` as ``run.json`` and read by ``cdlm-table``.

Steps are the optimizer steps the run finished (Lightning's ``global_step`` at the end of fit).
Not the CSV log's largest step: the end-of-training rows sit one past the last step's, the
off-by-one that once reached published tables. Cost is this process's CPU seconds (user +
system, every thread, plus any children it waited for) and wall seconds over the job, with how
many jobs the launcher ran at once and the machine's load average over the job: a CPU-second
figure from a shared machine is only comparable with that said beside it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cdlm.io import atomic_write_text

RECORD = "run.json"


@dataclass
class Cost:
    """A job's cost (module docstring): ``cpu_seconds``, ``wall_seconds``, ``parallel_jobs``
    (the launcher's jobs at once, 1 outside a parallel multirun), ``load_average`` (the
    machine's 1-minute load, averaged over samples taken during the job) and ``cpus``."""

    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    parallel_jobs: int = 1
    load_average: float | None = None
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)


def _cpu_seconds() -> float:
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextmanager
def measured(parallel_jobs: int = 1) -> Iterator[Cost]:
    """Measures the block's cost into the yielded ``Cost`` (filled in when the block ends). A
    joblib worker runs several jobs in one process, so CPU time is a difference, not a total."""
    cost = Cost(parallel_jobs=parallel_jobs)
    cpu, wall, load = _cpu_seconds(), time.perf_counter(), os.getloadavg()[0]
    try:
        yield cost
    finally:
        cost.cpu_seconds = round(_cpu_seconds() - cpu, 2)
        cost.wall_seconds = round(time.perf_counter() - wall, 2)
        cost.load_average = round((load + os.getloadavg()[0]) / 2, 2)


def commit(folder: Path | None = None) -> str | None:
    """The git commit of the code the job ran (``folder``, by default the checkout this cdlm is
    imported from, whatever the working directory; ``+dirty`` with uncommitted changes); None
    for an installed wheel or outside git."""
    where = str(folder or Path(__file__).resolve().parents[2])

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "--show-toplevel", "HEAD")
        lines = head.stdout.split()
        # a wheel's site-packages inside some other checkout is not that checkout's code
        if head.returncode or Path(lines[0]).resolve() != Path(where).resolve():
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return None
    return lines[1] + ("+dirty" if dirty.stdout.strip() else "")


@dataclass
class Record:
    """``run.json``: the job's ``command`` (entry point), ``overrides``, ``steps`` (training
    jobs), ``cost``, ``commit`` and ``status`` (``finished``)."""

    command: str
    overrides: list[str]
    cost: Cost
    commit: str | None = None
    steps: int | None = None
    status: str = "finished"


def write(folder: Path, record: Record) -> Path:
    """Writes ``folder/run.json`` atomically; returns its path."""
    path = folder / RECORD
    atomic_write_text(path, json.dumps(asdict(record), indent=2) + "\n")
    return path


def read(folder: Path) -> Record | None:
    """The folder's ``run.json``; None when the job never finished."""
    path = folder / RECORD
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return Record(**raw | {"cost": Cost(**raw["cost"])})


def steps(folder: Path) -> int:
    """The optimizer steps a run finished (module docstring): its ``run.json``, else its model
    card's count, else its newest ``step-<n>.ckpt`` (a run cut short), else 0."""
    record = read(folder)
    if record is not None and record.steps is not None:
        return record.steps
    card = folder / "config.json"
    if card.is_file():
        found = json.loads(card.read_text()).get("card", {}).get("training", {}).get("steps")
        if found is not None:
            return int(found)
    numbered = [int(p.stem.split("-")[1]) for p in folder.glob("checkpoints/step-*.ckpt")]
    return max(numbered, default=0)


def launcher_jobs() -> int:
    """How many jobs this job's Hydra launcher runs at once: ``hydra.launcher.n_jobs`` of a
    parallel launcher in a multirun (-1: one per core), else 1."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return 1
    n = HydraConfig.get().launcher.get("n_jobs")
    if n is None:
        return 1
    return os.cpu_count() or 1 if int(n) < 0 else int(n)


def multirun_job() -> Path | None:
    """This job's own folder in a Hydra multirun; None for a single run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return Path(HydraConfig.get().runtime.output_dir)


def of_this_job(command: str, cost: Cost, steps: int | None = None) -> Record:
    """The record of the Hydra job running now: its overrides, this cost, the code's commit."""
    from hydra.core.hydra_config import HydraConfig

    overrides = list(HydraConfig.get().overrides.task)
    return Record(command, overrides, cost, commit=commit(), steps=steps)


def skip_finished(prog: str) -> bool:
    """Whether this multirun job's folder holds this job, finished (the same overrides), saying
    so: ``resume=auto`` reruns of a killed grid redo only the jobs that wrote no record."""
    job = multirun_job()
    if job is None or finished(job) is None:
        return False
    print(f"{prog}: resume=auto: {job} holds this job, finished; skipped")
    return True


def finished(folder: Path) -> Record | None:
    """The folder's record when it holds a finished run of the Hydra job running now (the same
    overrides), else None."""
    from hydra.core.hydra_config import HydraConfig

    done = read(folder)
    same = done is not None and sorted(done.overrides) == sorted(HydraConfig.get().overrides.task)
    return done if same else None
