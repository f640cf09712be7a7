"""Randomised crash-consistency of ``cdlm-train`` (issue 61, docs/guide/reliability.md).

Real ``cdlm-train`` runs of a tiny model are SIGKILLed at seeded random instants and resumed with
``resume=auto`` until they finish; each chain of kills must end with the uninterrupted run's
per-step losses and final weights (CPU, fp32, one thread), and after every kill each file of the
run folder must parse (checkpoints, the model file, JSON, JSONL, CSV, YAML, text) or be absent.

A kill is aimed at one of the run's phases, and lands at a random instant inside or after it:
``clock`` (the parent kills at a uniform instant of the run's lifetime, start-up included),
``step`` (a delay into a training step), ``write`` (into the n-th atomic file write: checkpoints,
the model file, the model folder, ``run.json``), ``csv`` (the CSV logger's flush) and ``wandb``
(a W&B offline log call; those chains log to W&B, not CSV). The child side is ``KillAt``, a
callback this file adds to the run (``+callbacks.kill._target_=crash_kills.KillAt``); it traces
what the run does, so the report says where each kill landed: mid-write of which file, or after
which event.

    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/crash_kills.py --kills 200 --seed 0 \\
        --report docs/results/crash_kills.json

``--ddp`` kills each rank of a 2-process CPU DDP run in turn instead (``ddp_run``), and ``--eval``
kills ``cdlm-eval -m`` and ``cdlm-table`` (``eval_run``):

    PYTHONPATH=. python scripts/crash_kills.py --ddp --seed 0 --report ddp.json
    PYTHONPATH=. python scripts/crash_kills.py --eval --kills 20 --seed 0 --report eval.json

Exits 1 when any kill left a torn file or a chain did not repeat the uninterrupted run.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import lightning as L

TARGETS = ("clock", "step", "write", "csv", "wandb")
STEPS = 12
RUN = [
    "data.vocab_size=300",
    "data.seq_len=16",
    "data.batch_size=4",
    "network.d_model=32",
    "network.n_layers=1",
    "network.n_heads=2",
    "process.embed_dim=8",
    f"trainer.max_steps={STEPS}",
    "trainer.val_check_interval=5",
    "trainer.limit_val_batches=1",
    "+trainer.limit_train_batches=4",
    "+trainer.enable_progress_bar=false",
    "trainer.precision=32-true",
    "trainer.log_every_n_steps=1",
    "lr_scheduler.warmup_steps=1",
    "phases.ar=0.25",
    "phases.anneal=0.25",
    "callbacks.samples.num_samples=0",
    "callbacks.checkpoint.every_n_train_steps=2",
    "callbacks.model_folder.bound_sequences=8",
    "resume=auto",
]


class KillAt(L.Callback):
    """In the child run: writes one trace line per event (line-buffered, so a kill loses none
    written before it) and SIGKILLs its own process ``delay`` seconds after the ``nth`` event of
    kind ``target``, from a timer thread: the kill lands wherever the run then is."""

    def __init__(
        self, trace: str, target: str = "none", nth: int = 0, delay: float = 0.0, rank: int = -1
    ):
        here = int(os.environ.get("LOCAL_RANK", 0))
        self.trace = open(
            f"{trace}.{here}" if rank >= 0 else trace, "a", buffering=1, encoding="utf-8"
        )
        self.target, self.nth, self.delay = (target if rank in (-1, here) else "none"), nth, delay
        self.counts: Counter = Counter()
        self._instrument()
        self.event("start", f"{os.getpid()} {time.time()}")

    def event(self, kind: str, detail: str = "") -> None:
        self.trace.write(f"{kind} {detail}".rstrip() + "\n")
        self.counts[kind] += 1
        if kind == self.target and self.counts[kind] == self.nth:
            self.trace.write(f"kill {time.time() + self.delay}\n")
            kill = threading.Timer(self.delay, os.kill, (os.getpid(), signal.SIGKILL))
            kill.daemon = True
            kill.start()

    def _instrument(self) -> None:
        """Every atomic write of cdlm (``cdlm.io.atomic_path``, the tokenizer's folder) makes a
        hidden ``.tmp`` name and renames it into place: the two ends of a write."""
        from lightning.pytorch.loggers import CSVLogger, WandbLogger

        mkstemp, mkdtemp, replace = tempfile.mkstemp, tempfile.mkdtemp, os.replace

        def traced_mkstemp(*args, **kwargs):
            made = mkstemp(*args, **kwargs)
            if str(kwargs.get("suffix", args[0] if args else "")).endswith(".tmp"):
                self.event("write", Path(made[1]).name)
            return made

        def traced_mkdtemp(*args, **kwargs):
            made = mkdtemp(*args, **kwargs)
            if str(kwargs.get("suffix", args[0] if args else "")).endswith(".tmp"):
                self.event("write", Path(made).name)
            return made

        def traced_replace(src, dst, *args, **kwargs):
            replace(src, dst, *args, **kwargs)
            self.event("written", Path(dst).name)

        tempfile.mkstemp, tempfile.mkdtemp, os.replace = (
            traced_mkstemp,
            traced_mkdtemp,
            traced_replace,
        )
        for logger, name, kind in (
            (CSVLogger, "save", "csv"),
            (WandbLogger, "log_metrics", "wandb"),
        ):
            original = getattr(logger, name)

            def traced(obj, *args, _original=original, _kind=kind, **kwargs):
                self.event(_kind)
                return _original(obj, *args, **kwargs)

            setattr(logger, name, traced)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.event("step", str(trainer.global_step))

    def on_train_end(self, trainer, pl_module) -> None:
        self.event("train_end")


def corpus(folder: Path) -> Path:
    """The opening of two bundled novels (the tests' tiny corpus)."""
    from cdlm.data.corpus import BUNDLED

    folder.mkdir(parents=True, exist_ok=True)
    for name in ("emma", "persuasion"):
        with gzip.open(BUNDLED / f"{name}.txt.gz", "rt", encoding="utf-8") as f:
            (folder / f"{name}.txt").write_text(f.read()[:30_000], encoding="utf-8")
    return folder


def child(
    folder: Path,
    data: Path,
    trace: Path,
    logger: str,
    target: str,
    nth: int,
    delay: float,
    extra: tuple[str, ...] = (),
):
    here = Path(__file__).resolve().parent
    args = [sys.executable, "-m", "cdlm.cli.train", f"data.path={data}", *RUN, *extra]
    args += [
        f"logger={logger}",
        f"hydra.run.dir={folder}",
        "+callbacks.kill._target_=crash_kills.KillAt",
    ]
    args += [f"+callbacks.kill.trace={trace}", f"+callbacks.kill.target={target}"]
    args += [f"+callbacks.kill.nth={nth}", f"+callbacks.kill.delay={delay}"]
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)]),
        "PYTHONWARNINGS": "ignore",
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
    }
    return subprocess.Popen(
        args, cwd=folder.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def torn(folder: Path) -> list[str]:
    """Every file of a run folder that does not read whole, as ``path: why``. Hidden ``.tmp``
    entries are an atomic write's own temporaries, never read, and removed on resume."""
    import yaml
    from safetensors import safe_open

    from cdlm.training.resume import is_whole_checkpoint

    problems = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder)
        if any(part.startswith(".") and part.endswith(".tmp") for part in rel.parts):
            continue
        try:
            if path.suffix == ".ckpt":
                assert is_whole_checkpoint(path), "not a whole checkpoint"
            elif path.suffix == ".safetensors":
                with safe_open(path, "pt") as f:
                    for key in f.keys():
                        f.get_tensor(key)
            elif path.suffix == ".json":
                json.loads(path.read_text(encoding="utf-8"))
            elif path.suffix == ".jsonl":
                for line in path.read_text(encoding="utf-8").splitlines():
                    json.loads(line)
            elif path.suffix == ".csv":
                text = path.read_text(encoding="utf-8")
                rows = list(csv.reader(text.splitlines()))
                assert not text or text.endswith("\n"), "ends mid-line"
                assert all(len(r) == len(rows[0]) for r in rows), "a row of the wrong width"
            elif path.suffix in (".yaml", ".yml"):
                yaml.safe_load(path.read_text(encoding="utf-8"))
            elif path.suffix in (".md", ".txt"):
                path.read_text(encoding="utf-8")
        except Exception as e:  # noqa: BLE001 (every way of not reading counts)
            problems.append(f"{rel}: {type(e).__name__}: {e}"[:300])
    return problems


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(".*.tmp"))


def losses(folder: Path) -> dict[int, float]:
    """{step: train/loss} over a run folder's CSV logs, the newest log winning for a step that
    a resumed run repeated."""
    logs = sorted((folder / "csv").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    out: dict[int, float] = {}
    for log in logs:
        if (log / "metrics.csv").is_file():
            with open(log / "metrics.csv", encoding="utf-8") as f:
                out |= {
                    int(r["step"]): float(r["train/loss"])
                    for r in csv.DictReader(f)
                    if r.get("train/loss")
                }
    return out


def weights(folder: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    ckpt = torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return {
        "model": load_file(folder / "model.safetensors"),
        "live": ckpt.get("current_model_state", ckpt["state_dict"]),
    }


def checkpointed(folder: Path) -> set[int]:
    """The steps of the checkpoints a chain's runs wrote, from their traces."""
    steps = set()
    for trace in folder.parent.glob(f"{folder.name}.*trace*"):
        for line in trace.read_text(encoding="utf-8").splitlines():
            if line.startswith("written step-") and line.endswith(".ckpt"):
                steps.add(int(line.removeprefix("written step-").removesuffix(".ckpt")))
    return steps


def unlogged(folder: Path, reference: Path) -> list[int]:
    """Steps whose loss row is missing from the chain's CSV logs, of the kind a kill between a
    checkpoint and the next CSV flush loses: the last step a checkpoint covers (Lightning logs a
    step's metrics after ``on_train_batch_end``, where the checkpoint is written)."""
    missing = set(losses(reference)) - set(losses(folder))
    return sorted(s for s in missing if s + 1 in checkpointed(folder))


def differences(folder: Path, reference: Path, logger: str) -> list[str]:
    """How a finished chain differs from the uninterrupted run (nothing: the same run), besides
    the ``unlogged`` rows (reported apart)."""
    import torch

    problems = []
    if logger == "csv":
        got, want = losses(folder), losses(reference)
        missing = sorted(set(want) - set(got) - set(unlogged(folder, reference)))
        if missing:
            problems.append(f"lost steps {missing}")
        problems += [
            f"step {s}: loss {got[s]} != {want[s]}"
            for s in sorted(set(got) & set(want))
            if abs(got[s] - want[s]) > 1e-6
        ]
    try:
        a, b = weights(folder), weights(reference)
    except Exception as e:  # noqa: BLE001 (a final file that does not load is the finding)
        return [*problems, f"the final weights do not load: {type(e).__name__}: {e}"[:300]]
    for part in b:
        for key in b[part]:
            if not torch.allclose(a[part][key], b[part][key], atol=1e-6, rtol=0):
                problems.append(f"{part} weights differ at {key}")
    if not (folder / "run.json").is_file():
        problems.append("no run.json")
    return problems


def landed(trace: Path) -> str:
    """Where a kill landed, from the child's trace: inside a file's write (its temporary made,
    not yet renamed into place), or after the last event the run traced."""
    lines = trace.read_text(encoding="utf-8").splitlines() if trace.exists() else []
    lines = [line for line in lines if not line.startswith("kill ")]  # the timer's arming
    if not lines:
        return "start-up (before the run's callbacks)"
    kind, _, detail = lines[-1].partition(" ")
    if kind == "write":
        return "mid-write " + detail[1:].rsplit(".", 2)[0]
    return "after " + ("start" if kind == "start" else lines[-1])


def run(n_kills: int, seed: int, work: Path, max_kills_per_chain: int = 6) -> dict:
    rng = random.Random(seed)
    data = corpus(work / "corpus")
    reference, timelines = {}, {}
    for logger in ("csv", "wandb"):
        folder = work / f"reference_{logger}"
        begin = time.monotonic()
        proc = child(folder, data, work / f"reference_{logger}.trace", logger, "none", 0, 0.0)
        err = proc.communicate()[1].decode()
        if proc.returncode != 0:
            raise SystemExit(f"the uninterrupted {logger} run failed:\n{err[-2000:]}")
        reference[logger], timelines[logger] = folder, time.monotonic() - begin
    counts = Counter(
        line.split()[0]
        for line in (work / "reference_csv.trace").read_text(encoding="utf-8").splitlines()
    )
    kills, chains, missed = [], [], []
    while len(kills) < n_kills:
        logger = "wandb" if rng.random() < 0.2 else "csv"
        folder = work / f"chain_{len(chains)}"
        trace_n, chain_kills, finished = 0, 0, False
        while not finished:
            trace = work / f"chain_{len(chains)}.{trace_n}.trace"
            trace_n += 1
            aim = chain_kills < max_kills_per_chain and len(kills) < n_kills
            target = rng.choice(
                [t for t in TARGETS if t != ("csv" if logger == "wandb" else "wandb")]
            )
            nth, delay = 0, 0.0
            if aim and target != "clock":
                nth = rng.randint(1, max(1, counts[target] if target != "wandb" else 30))
                delay = rng.uniform(0.0, 0.004 if target in ("write", "csv") else 0.03)
            proc = child(folder, data, trace, logger, target if aim else "none", nth, delay)
            if aim and target == "clock":
                delay = rng.uniform(0.0, timelines[logger])
                try:
                    proc.wait(timeout=delay)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
            err = proc.communicate()[1].decode()
            if proc.returncode == 0:
                finished = True
                if aim:  # the aim fell after the run's end (a late clock, an nth never reached)
                    missed.append({"chain": len(chains), "target": target, "nth": nth})
                continue
            if proc.returncode != -signal.SIGKILL:
                raise SystemExit(f"a child failed with {proc.returncode}:\n{err[-3000:]}")
            chain_kills += 1
            kills.append(
                {
                    "chain": len(chains),
                    "target": target,
                    "nth": nth,
                    "delay": round(delay, 4),
                    "landed": landed(trace),
                    "torn": torn(folder),
                    "leftovers": leftovers(folder),
                }
            )
        chains.append(
            {
                "chain": len(chains),
                "logger": logger,
                "kills": chain_kills,
                "differences": differences(folder, reference[logger], logger),
                "unlogged": unlogged(folder, reference[logger]) if logger == "csv" else [],
                "leftovers_after": leftovers(folder),
            }
        )
    return {"seed": seed, "kills": kills, "missed": missed, "chains": chains}


DDP = ("trainer=ddp", "trainer.devices=2", "trainer.accelerator=cpu")
SURVIVOR_LIMIT_S = 60.0


def first_step(trace: Path) -> int | None:
    """The global step a run's first training batch had: 0 for a fresh start."""
    for line in trace.read_text(encoding="utf-8").splitlines() if trace.exists() else []:
        if line.startswith("step "):
            return int(line.split()[1])
    return None


def ddp_run(seed: int, work: Path) -> dict:
    """2-process CPU DDP (Lightning's strategy, gloo): one rank, then the other, SIGKILLed at a
    seeded training step. The survivor must exit within ``SURVIVOR_LIMIT_S`` with one error line
    and no traceback, leave no torn file, and ``resume=auto`` on both ranks must repeat the
    uninterrupted DDP run. The survivor's exit is when the run's stderr closes: every rank
    holds it, the orphaned rank 1 too."""
    rng = random.Random(seed)
    data = corpus(work / "corpus")
    reference = work / "reference_ddp"
    proc = child(reference, data, work / "reference_ddp.trace", "csv", "none", 0, 0.0, DDP)
    err = proc.communicate()[1].decode()
    if proc.returncode != 0:
        raise SystemExit(f"the uninterrupted DDP run failed:\n{err[-3000:]}")
    chains = []
    for rank in (1, 0):
        folder, trace = work / f"ddp_rank{rank}", work / f"ddp_rank{rank}.trace"
        nth, delay = rng.randint(2, STEPS - 1), rng.uniform(0.0, 0.03)
        extra = (*DDP, f"+callbacks.kill.rank={rank}")
        proc = child(folder, data, trace, "csv", "step", nth, delay, extra)
        err = proc.communicate()[1].decode()
        closed = time.time()
        arming = Path(f"{trace}.{rank}").read_text(encoding="utf-8").splitlines()
        killed = next((float(x.split()[1]) for x in arming if x.startswith("kill ")), None)
        errors = [x for x in err.splitlines() if x.startswith("cdlm-train: error:")]
        broken = torn(folder)
        resumed = child(
            folder, data, work / f"ddp_rank{rank}.resume.trace", "csv", "none", 0, 0.0, DDP
        )
        resume_err = resumed.communicate()[1].decode()
        chains.append(
            {
                "killed_rank": rank,
                "nth_step": nth,
                "delay": round(delay, 4),
                "returncode": proc.returncode,
                "survivor_exit_s": None if killed is None else round(closed - killed, 2),
                "error_lines": errors,
                "traceback": "Traceback" in err,
                "torn": broken,
                "resumed_at_step": first_step(work / f"ddp_rank{rank}.resume.trace"),
                "resume_returncode": resumed.returncode,
                "resume_error": resume_err[-2000:] if resumed.returncode else "",
                "differences": differences(folder, reference, "csv")
                if resumed.returncode == 0
                else [],
                "leftovers_after": leftovers(folder),
            }
        )
    return {"seed": seed, "ddp": chains}


EVAL = ("ckpt=world:chars", "process=masked", "scorer=world", "num_samples=4", "wandb=false")
EVAL_GRID = ("steps=2,4,8", "resume=auto")
SAME = ("quality", "likelihood", "samples")  # a report's seeded figures (not its timings)


def command(prog: str, *args: str, cwd: Path) -> subprocess.Popen:
    env = os.environ | {
        "PYTHONWARNINGS": "ignore",
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
    }
    return subprocess.Popen(
        [sys.executable, "-m", prog, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def killed_at(proc: subprocess.Popen, after: float) -> bool:
    """SIGKILLs ``proc`` ``after`` seconds from now unless it ends first; whether it was."""
    try:
        proc.wait(timeout=after)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
    err = proc.communicate()[1].decode()
    if proc.returncode not in (0, -signal.SIGKILL):
        raise SystemExit(f"a command failed with {proc.returncode}:\n{err[-3000:]}")
    return proc.returncode == -signal.SIGKILL


def reports(folder: Path) -> dict[str, dict]:
    """{job: its report's seeded figures} of an evaluation grid's folder."""
    return {
        job.name: {k: v for k, v in json.loads(report.read_text()).items() if k in SAME}
        for job in sorted(p for p in folder.iterdir() if p.is_dir())
        for report in job.glob("*.eval.json")
    }


def eval_run(n_kills: int, seed: int, work: Path, max_kills_per_chain: int = 3) -> dict:
    """``cdlm-eval -m`` over a three-job grid, and ``cdlm-table`` over its folder, SIGKILLed at
    uniform instants of their lifetimes. After each kill no file may be torn; a grid rerun with
    its own command (``resume=auto``) must leave every job that had finished untouched and end
    with the uninterrupted grid's reports; a table rerun must write the uninterrupted table."""
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    reference = work / "reference_eval"
    begin = time.monotonic()
    grid = (*EVAL, *EVAL_GRID)
    killed_at(command("cdlm.cli.eval", "-m", *grid, f"hydra.sweep.dir={reference}", cwd=work), 1e9)
    lifetime = {"eval": time.monotonic() - begin}
    begin = time.monotonic()
    killed_at(command("cdlm.cli.table", str(reference), cwd=work), 1e9)
    lifetime["table"] = time.monotonic() - begin
    want_table = (reference / "table.md").read_text(encoding="utf-8")
    kills, chains = [], []
    while len(kills) < n_kills:
        kind = rng.choice(["eval", "table"])
        folder = work / f"{kind}_{len(chains)}"
        if kind == "table":
            shutil.copytree(reference, folder)
            for name in ("table.json", "table.md"):
                (folder / name).unlink()
        chain_kills, kept = 0, {}
        while True:
            aim = chain_kills < max_kills_per_chain and len(kills) < n_kills
            after = rng.uniform(0.0, lifetime[kind]) if aim else 1e9
            finished = {r.parent: r.read_bytes() for r in folder.glob("*/run.json")}
            kept |= finished
            args = ("-m", *grid, f"hydra.sweep.dir={folder}") if kind == "eval" else (str(folder),)
            proc = command(f"cdlm.cli.{kind}", *args, cwd=work)
            if not killed_at(proc, after):
                break
            chain_kills += 1
            kills.append(
                {
                    "chain": len(chains),
                    "kind": kind,
                    "after_s": round(after, 3),
                    "torn": torn(folder),
                    "jobs_finished_before": len(finished),
                }
            )
        problems = []
        if kind == "eval":
            if reports(folder) != reports(reference):
                problems.append("the reports differ from the uninterrupted grid's")
            problems += [
                f"job {job.name} finished but was redone"
                for job, before in kept.items()
                if (job / "run.json").read_bytes() != before
            ]
        elif (folder / "table.md").read_text(encoding="utf-8") != want_table:
            problems.append("the table differs from the uninterrupted one")
        chains.append(
            {
                "chain": len(chains),
                "kind": kind,
                "kills": chain_kills,
                "differences": problems,
                "leftovers_after": leftovers(folder),
            }
        )
    return {
        "seed": seed,
        "lifetime_s": {k: round(v, 1) for k, v in lifetime.items()},
        "kills": kills,
        "chains": chains,
    }


def ddp_failures(chain: dict) -> list[str]:
    """What a DDP kill chain broke, in words (empty: it kept every promise)."""
    exit_s = chain["survivor_exit_s"]
    checks = {
        "the kill never fired": exit_s is None,
        f"the survivor took {exit_s} s": exit_s is not None and exit_s > SURVIVOR_LIMIT_S,
        f"{len(chain['error_lines'])} error lines": len(chain["error_lines"]) != 1,
        "a traceback": chain["traceback"],
        "torn files": bool(chain["torn"]),
        "the resume failed": chain["resume_returncode"] != 0,
        "the resume started fresh": not chain["resumed_at_step"],
        "the resumed run differs": bool(chain["differences"]),
        "temporaries left": bool(chain["leftovers_after"]),
    }
    return [what for what, failed in checks.items() if failed]


def summary(report: dict) -> dict:
    kills = report["kills"]
    return {
        "kills": len(kills),
        "missed": len(report["missed"]),
        "by_target": dict(Counter(k["target"] for k in kills)),
        "mid_write": sum(k["landed"].startswith("mid-write") for k in kills),
        "torn": sum(bool(k["torn"]) for k in kills),
        "chains": len(report["chains"]),
        "chains_differing": sum(bool(c["differences"]) for c in report["chains"]),
        "chains_with_unlogged_rows": sum(bool(c["unlogged"]) for c in report["chains"]),
        "leftovers_after_resume": sum(bool(c["leftovers_after"]) for c in report["chains"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", type=Path, required=True, help="the JSON report to write")
    parser.add_argument(
        "--work", type=Path, default=None, help="where the runs go (default: a temporary folder)"
    )
    parser.add_argument(
        "--ddp", action="store_true", help="kill each rank of a 2-process DDP run instead"
    )
    parser.add_argument(
        "--eval", action="store_true", help="kill cdlm-eval -m and cdlm-table instead"
    )
    args = parser.parse_args()
    from cdlm.io import atomic_write_text

    with tempfile.TemporaryDirectory(prefix="crash_kills_") as tmp:
        if args.eval:
            report = eval_run(args.kills, args.seed, args.work or Path(tmp))
            kills, chains = report["kills"], report["chains"]
            report = {
                "summary": {
                    "kills": len(kills),
                    "by_kind": dict(Counter(k["kind"] for k in kills)),
                    "torn": sum(bool(k["torn"]) for k in kills),
                    "chains": len(chains),
                    "chains_differing": sum(bool(c["differences"]) for c in chains),
                    "leftovers_after_rerun": sum(bool(c["leftovers_after"]) for c in chains),
                },
                **report,
            }
            bad = report["summary"]
            failed = bad["torn"] or bad["chains_differing"] or bad["leftovers_after_rerun"]
        elif args.ddp:
            report = ddp_run(args.seed, args.work or Path(tmp))
            for chain in report["ddp"]:
                chain["failures"] = ddp_failures(chain)
            failed = any(chain["failures"] for chain in report["ddp"])
            report = {
                "summary": [(c["killed_rank"], c["survivor_exit_s"]) for c in report["ddp"]],
                **report,
            }
        else:
            report = run(args.kills, args.seed, args.work or Path(tmp))
            report = {"summary": summary(report), **report}
            bad = report["summary"]
            failed = bad["torn"] or bad["chains_differing"] or bad["leftovers_after_resume"]
    atomic_write_text(args.report, json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"]))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
