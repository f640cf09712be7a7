"""The NaN/inf guard: a poisoned batch is skipped, counted and logged, and the run finishes; a run
that stays non-finite stops with one line naming the step, and what it leaves on disk loads.
Real ``cdlm-train`` runs in-process, poisoned by ``reliability_helpers.Poison``."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY_TRAIN
from reliability_helpers import one_thread  # noqa: F401 (autouse)
from reliability_helpers import train_in_process as run

from cdlm.model_file import load_model
from cdlm.training.guard import Diverged, NonFiniteGuard
from cdlm.training.resume import find_resume, weights_finite

RUN = [
    *TINY_TRAIN,
    "process.embed_dim=8",
    "trainer.max_steps=8",
    "trainer.val_check_interval=2",
    "+trainer.enable_progress_bar=false",
    "callbacks.samples.num_samples=0",
    "callbacks.checkpoint.every_n_train_steps=2",
    "callbacks.model_folder.bound_sequences=0",
    "callbacks.guard.max_consecutive=3",
    "+callbacks.poison._target_=reliability_helpers.Poison",
]


def train(folder: Path, corpus: Path, *extra: str, monkeypatch) -> None:
    run([f"data.path={corpus}", *RUN, *extra, f"hydra.run.dir={folder}"], monkeypatch)


def logged(folder: Path, key: str) -> list[float]:
    with open(next((folder / "csv").glob("version_*")) / "metrics.csv") as f:
        return [float(r[key]) for r in csv.DictReader(f) if r.get(key)]


def test_one_poisoned_batch_is_skipped_logged_and_the_run_finishes(
    tiny_corpus, tmp_path, monkeypatch
):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # every step observed by the warped time sampler, whose loss curve must not see the NaN
        train(
            tmp_path,
            tiny_corpus,
            "+callbacks.poison.steps=[3]",
            "process.token_noise=0",
            "phases=none",
            "time_sampler@process.time_sampler=warped",
            monkeypatch=monkeypatch,
        )
    messages = [str(w.message) for w in caught if "non-finite" in str(w.message)]
    assert messages == [
        "step 3: non-finite loss, step skipped (1 in a row, 1 so far; 3 in a row stop the run)"
    ], messages
    assert logged(tmp_path, "train/skipped_steps")[-1] == 1.0
    ckpt = torch.load(
        tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False
    )
    assert ckpt["global_step"] == 8
    adam = ckpt["optimizer_states"][0]["state"]
    # 8 steps, one of them skipped by AdamW too (parameters used on some steps only count fewer)
    assert max(int(s["step"]) for s in adam.values()) == 7
    assert ckpt["callbacks"]["NonFiniteGuard"] == {"skipped": 1, "in_a_row": 0}
    # the warped time sampler's loss curve never saw the NaN (the guard put it back)
    assert "process.time_sampler.loss" in ckpt["current_model_state"]
    assert all(v.isfinite().all() for v in ckpt["current_model_state"].values())
    assert weights_finite(load_model(tmp_path / "model.safetensors").network)


def test_a_persistent_nan_stops_the_run_and_the_last_good_checkpoint_loads(
    tiny_corpus, tmp_path, monkeypatch, capsys
):
    with pytest.raises(SystemExit) as stop:
        train(tmp_path, tiny_corpus, "+callbacks.poison.start=5", monkeypatch=monkeypatch)
    assert stop.value.code == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        "cdlm-train: error: training diverged: non-finite loss at 3 steps in a row, the last at "
        "step 7; the last good checkpoint is kept (resume=auto, or lower optimizer.lr)"
    )
    good = find_resume(tmp_path / "checkpoints")
    ckpt = torch.load(good, map_location="cpu", weights_only=False)
    assert ckpt["global_step"] <= 7
    assert all(v.isfinite().all() for v in ckpt["current_model_state"].values())
    assert weights_finite(load_model(tmp_path / "model.safetensors").network)


def fake_step(guard: NonFiniteGuard, loss: float, grad: float, scaler=None) -> torch.nn.Parameter:
    """One optimizer step's hooks on a one-parameter model, without Lightning."""
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.full((2,), grad)
    optimizer = torch.optim.SGD([p], lr=1.0)
    trainer = SimpleNamespace(
        global_step=11,
        precision_plugin=SimpleNamespace(scaler=scaler),
        strategy=SimpleNamespace(reduce_boolean_decision=lambda d, all=True: d),
    )
    module = SimpleNamespace(log=lambda *a, **k: None, process=None)
    guard.on_train_batch_start(trainer, module, None, 0)
    guard.on_before_backward(trainer, module, torch.tensor(loss))
    guard.on_before_optimizer_step(trainer, module, optimizer)
    return p


def test_a_non_finite_gradient_with_a_finite_loss_is_skipped_too():
    guard = NonFiniteGuard(max_consecutive=2)
    assert fake_step(guard, 1.0, 2.0).grad is not None and guard.skipped == 0
    assert fake_step(guard, 1.0, float("inf")).grad is None and guard.in_a_row == 1
    assert fake_step(guard, 1.0, 2.0).grad is not None and guard.in_a_row == 0
    # with a gradient scaler, overflowing gradients are its business; a NaN loss is not
    assert fake_step(guard, 1.0, float("inf"), scaler=object()).grad is not None
    fake_step(guard, float("nan"), 1.0)
    with pytest.raises(Diverged, match="non-finite loss at 2 steps in a row, the last at step 11"):
        fake_step(guard, float("nan"), 1.0)
    with pytest.raises(ValueError, match="max_consecutive must be an integer >= 1"):
        NonFiniteGuard(0)
