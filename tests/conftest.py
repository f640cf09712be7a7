"""Shared fixtures: a tiny corpus, tiny trained checkpoints (one per process, trained once a
session), the entry points run in-process or as commands, and a quiet environment."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from cdlm.data.corpus import BUNDLED

TINY_TRAIN = [
    "data.vocab_size=300",
    "data.seq_len=16",
    "data.batch_size=4",
    "network.d_model=32",
    "network.n_layers=1",
    "network.n_heads=2",
    "trainer.max_steps=3",
    "trainer.val_check_interval=3",
    "trainer.limit_val_batches=1",
    "trainer.precision=32-true",
    "logger=csv",
    "trainer.log_every_n_steps=1",
    "lr_scheduler.warmup_steps=1",
    "callbacks.samples.num_samples=1",
    "callbacks.samples.steps=2",
]
# Two distillation steps of a tiny teacher, validated once.
TINY_DISTIL = [
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=1",
    "trainer.precision=32-true",
    "data.batch_size=2",
    "logger=csv",
]


@pytest.fixture(scope="session", autouse=True)
def quiet_env(tmp_path_factory):
    """No W&B network, a tokenizer cache private to the test session, and one thread: the
    suite's tensors are tiny, and on a busy machine (2 cores, other jobs) several threads per
    op spin against each other, tens of times slower (tests/reliability_helpers.py)."""
    os.environ["WANDB_MODE"] = "disabled"
    os.environ["CDLM_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """Two real text files (the opening of two bundled novels), labels = file names."""
    folder = tmp_path_factory.mktemp("corpus")
    for name in ("emma", "persuasion"):
        with gzip.open(BUNDLED / f"{name}.txt.gz", "rt", encoding="utf-8") as f:
            (folder / f"{name}.txt").write_text(f.read()[:30_000], encoding="utf-8")
    return folder


def experiment_module(name: str, folder: str = "experiments"):
    """A study (or script) module of the repository, imported as its folder's scripts import
    their neighbours (``import study``)."""
    import importlib

    where = str(Path(__file__).resolve().parents[1] / folder)
    sys.path.insert(0, where)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(where)


def run_cli(prog: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    module = {
        "cdlm-train": "cdlm.cli.train",
        "cdlm-sample": "cdlm.cli.sample",
        "cdlm-eval": "cdlm.cli.eval",
    }[prog]
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"PYTHONWARNINGS": "ignore"},
    )


def run_main(prog: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``run_cli`` in this process, which saves the seconds a fresh interpreter spends importing
    torch and Lightning: the entry point's ``main`` with ``args`` in ``cwd``, its exit status
    and what it printed. For what a real command adds (its start-up, its warnings filter),
    ``run_cli``."""
    from hydra.core.global_hydra import GlobalHydra

    from cdlm.cli import eval, sample, train

    main = {"cdlm-train": train.main, "cdlm-sample": sample.main, "cdlm-eval": eval.main}[prog]
    out, err, status = io.StringIO(), io.StringIO(), 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [prog, *args])
        patch.chdir(cwd)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                main()
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else int(e.code is not None)
        finally:
            GlobalHydra.instance().clear()  # hydra.main leaves itself initialised
    return subprocess.CompletedProcess([prog, *args], status, out.getvalue(), err.getvalue())


def train_tiny(tmp_path_factory, corpus: Path, *overrides: str) -> Path:
    """A 3-step model trained through the real entry point (in-process) on the tiny corpus."""
    run_dir = tmp_path_factory.mktemp("run")
    result = run_main(
        "cdlm-train",
        f"data.path={corpus}",
        *TINY_TRAIN,
        *overrides,
        "+trainer.enable_progress_bar=false",
        f"hydra.run.dir={run_dir}",
        cwd=run_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    path = run_dir / "model.safetensors"
    assert path.is_file()
    return path


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, tiny_corpus) -> Path:
    # the default recipe with every phase run: one AR batch, one annealing batch, one diffusion
    return train_tiny(
        tmp_path_factory, tiny_corpus, "process.embed_dim=8", "phases.ar=0.3", "phases.anneal=0.3"
    )


@pytest.fixture(scope="session")
def tiny_masked_checkpoint(tmp_path_factory, tiny_corpus) -> Path:
    # one AR batch, one annealing batch, one masked batch: every phase of the recipe runs
    return train_tiny(
        tmp_path_factory, tiny_corpus, "process=masked", "phases.ar=0.3", "phases.anneal=0.3"
    )


@pytest.fixture(scope="session")
def tiny_ar_checkpoint(tmp_path_factory, tiny_corpus) -> Path:
    return train_tiny(tmp_path_factory, tiny_corpus, "process=autoregressive")


@pytest.fixture(scope="session")
def tiny_fim_checkpoint(tmp_path_factory, tiny_corpus) -> Path:
    """The AR baseline trained to fill in the middle (every row FIM-formatted)."""
    return train_tiny(
        tmp_path_factory, tiny_corpus, "process=autoregressive", "process.fim_rate=1.0"
    )


def draw(model, *, sampler=None, callback=None, **plan):
    """``cdlm.generation.generate`` on a loaded ``Model``: its process's default sampler (unless
    ``sampler``), its own sequence length (unless ``seq_len``), and a ``Plan`` of ``plan``
    (``temperature``/``clamp`` go to the plan's ``denoising``; ``guidance=None``: unguided)."""
    from cdlm.generation import Plan, default_sampler, generate

    for key in ("temperature", "clamp"):
        if key in plan:
            plan.setdefault("denoising", {})[key] = plan.pop(key)
    if plan.get("guidance", 0) is None:
        del plan["guidance"]
    plan.setdefault("seq_len", model.config.get("seq_len"))
    sampler = sampler or default_sampler(model.process)
    return generate(model, sampler, Plan(**plan), callback)


def draw_from(process, network, tokenizer, sampler, **plan):
    """``draw`` on bare parts (a process, a network, a tokenizer) instead of a loaded model."""
    from cdlm.model_file import Model

    return draw(Model(process, network, tokenizer, {}), sampler=sampler, **plan)


def train_in_process(monkeypatch, *args: str) -> None:
    """``cdlm-train *args`` in this process (its exceptions propagate)."""
    from hydra.core.global_hydra import GlobalHydra

    from cdlm.cli import train

    monkeypatch.setattr(sys, "argv", ["cdlm-train", *args])
    try:
        train.main()
    finally:
        GlobalHydra.instance().clear()


class Batches(L.Callback):
    """Records every training batch's tokens by step (``+callbacks.batches._target_=
    conftest.Batches``)."""

    seen: dict[int, list] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        Batches.seen[trainer.global_step] = batch["tokens"].tolist()


def resumed_batches(monkeypatch, run: list[str], tmp_path: Path) -> dict[int, list]:
    """Trains ``run`` (which records ``Batches``, checkpoints every 3 steps) 5 steps whole, then
    3 steps and a resume to 5; checks that the resume trains steps 3 and 4 on the uninterrupted
    run's batches, and returns that run's batches by step."""
    record = [*run, "+callbacks.batches._target_=conftest.Batches"]
    Batches.seen = {}
    train_in_process(
        monkeypatch, *record, "trainer.max_steps=5", f"hydra.run.dir={tmp_path / 'whole'}"
    )
    reference, Batches.seen = Batches.seen, {}
    cut = f"hydra.run.dir={tmp_path / 'cut'}"
    train_in_process(monkeypatch, *record, "trainer.max_steps=3", cut)
    assert sorted(Batches.seen) == [0, 1, 2]
    Batches.seen = {}
    train_in_process(monkeypatch, *record, "trainer.max_steps=5", "resume=auto", cut)
    assert Batches.seen == {step: reference[step] for step in (3, 4)}
    return reference
