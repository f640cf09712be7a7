"""Resume loses nothing (docs/guide/reliability.md).

A run SIGKILLed at a random point after its first checkpoint and resumed with ``resume=auto``
trains on the same batches with the same noise as the uninterrupted run: equal per-step losses
and equal final weights (CPU, fp32). The killed run is a real subprocess; the uninterrupted and
resumed runs are the real CLI in-process (a fresh interpreter costs seconds). The runs cross
epochs (``limit_train_batches``), the AR phase and attention annealing.
"""

from __future__ import annotations

import csv
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY_TRAIN
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.utilities.exceptions import SIGTERMException
from reliability_helpers import one_thread  # noqa: F401 (autouse)
from reliability_helpers import train_in_process as run
from safetensors.torch import load_file

from cdlm.data.order import ResumableLoader, ResumableSampler
from cdlm.training.callbacks import LogSamples
from cdlm.training.excess import WorldExcess
from cdlm.training.lr_schedules import wallclock_cosine
from cdlm.training.model_folder import ModelFolder
from cdlm.training.phases import budget_progress
from cdlm.training.resume import (
    AtomicCheckpointIO,
    Checkpoint,
    find_resume,
    is_whole_checkpoint,
    stop_if_terminated,
)

TESTS = Path(__file__).parent
SUBPROCESS_PATH = os.pathsep.join([str(TESTS), str(TESTS.parent)])  # this checkout's cdlm
STEPS = 12
RUN = [
    *TINY_TRAIN,
    "process.embed_dim=8",
    f"trainer.max_steps={STEPS}",
    "trainer.val_check_interval=5",
    "+trainer.limit_train_batches=4",  # an epoch is 4 steps: resumes land on epoch ends too
    "+trainer.enable_progress_bar=false",
    "phases.ar=0.25",
    "phases.anneal=0.25",
    "callbacks.samples.num_samples=0",
    "callbacks.checkpoint.every_n_train_steps=2",
    "callbacks.checkpoint.save_top_k=-1",
    "callbacks.model_folder.bound_sequences=0",
]


def train_in_process(folder: Path, corpus: Path, *extra: str, monkeypatch) -> None:
    run([f"data.path={corpus}", *RUN, *extra, f"hydra.run.dir={folder}"], monkeypatch)


def losses(folder: Path) -> dict[int, float]:
    """{step: train/loss} of the newest CSV log in a run folder (a resumed run's own log)."""
    logs = sorted((folder / "csv").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    with open(logs[-1] / "metrics.csv") as f:
        return {
            int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r["train/loss"]
        }


def live_weights(path: Path) -> dict[str, torch.Tensor]:
    """The trained (not EMA) weights of a Lightning checkpoint."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    return ckpt.get("current_model_state", ckpt["state_dict"])


def assert_same_run(resumed: Path, reference: Path, from_step: int) -> None:
    got, want = losses(resumed), losses(reference)
    assert min(got) <= from_step + 1 and max(got) == max(want), (sorted(got), sorted(want))
    for step, loss in got.items():
        assert abs(loss - want[step]) <= 1e-6, (step, loss, want[step])
    for name in ("model.safetensors",):
        a, b = load_file(resumed / name), load_file(reference / name)
        for key in b:
            torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=0)
    a = live_weights(resumed / "checkpoints" / "last.ckpt")
    b = live_weights(reference / "checkpoints" / "last.ckpt")
    for key in b:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_corpus) -> Path:
    folder = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as mp:
        train_in_process(folder, tiny_corpus, monkeypatch=mp)
    return folder


def test_sigkill_then_resume_auto_repeats_the_uninterrupted_run(
    reference, tiny_corpus, tmp_path, monkeypatch
):
    folder = tmp_path / "killed"
    args = [
        sys.executable,
        "-m",
        "cdlm.cli.train",
        f"data.path={tiny_corpus}",
        *RUN,
        "+callbacks.pace._target_=reliability_helpers.Pace",
        "+callbacks.pace.seconds=0.25",
        f"hydra.run.dir={folder}",
    ]
    env = os.environ | {
        "PYTHONPATH": SUBPROCESS_PATH,
        "PYTHONWARNINGS": "ignore",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    first = folder / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 120
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    delay = random.uniform(0.0, 1.5)  # a random point after the first checkpoint
    time.sleep(delay)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    stderr = proc.communicate()[1].decode()
    assert alive and proc.returncode == -signal.SIGKILL, (delay, proc.returncode, stderr[-2000:])

    start = find_resume(folder / "checkpoints")
    step = int(torch.load(start, map_location="cpu", weights_only=False)["global_step"])
    assert 2 <= step < STEPS, (delay, step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_in_process(folder, tiny_corpus, "resume=auto", monkeypatch=monkeypatch)
    assert not [w for w in caught if "not resumable" in str(w.message)]
    assert_same_run(folder, reference, step)


@pytest.mark.slow
def test_sigterm_stops_between_steps_then_resume_auto_repeats_the_run(
    reference, tiny_corpus, tmp_path, monkeypatch
):
    """SIGTERM (a sweep's kill) ends a real ``cdlm-train`` within seconds, with status 143 (not
    Lightning's 0, which reads as finished) and one line naming the checkpoint; that checkpoint
    is whole, and ``resume=auto`` from it repeats the uninterrupted run."""
    folder = tmp_path / "terminated"
    args = [sys.executable, "-m", "cdlm.cli.train", f"data.path={tiny_corpus}", *RUN]
    args += ["+callbacks.pace._target_=reliability_helpers.Pace", "+callbacks.pace.seconds=0.25"]
    env = os.environ | {
        "PYTHONPATH": SUBPROCESS_PATH,
        "PYTHONWARNINGS": "ignore",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        [*args, f"hydra.run.dir={folder}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    first = folder / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 120
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(random.uniform(0.0, 1.0))
    alive = proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    stderr = proc.communicate(timeout=60)[1].decode()
    assert alive and time.monotonic() - sent < 10, stderr[-2000:]
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, stderr[-2000:])
    last = stderr.strip().splitlines()[-1]
    start = find_resume(folder / "checkpoints")
    step = int(torch.load(start, map_location="cpu", weights_only=False)["global_step"])
    assert last.startswith("cdlm-train: stopped by SIGTERM at step") and str(start) in last, last
    assert 2 <= step < STEPS and not (folder / "run.json").exists(), step
    train_in_process(folder, tiny_corpus, "resume=auto", monkeypatch=monkeypatch)
    assert_same_run(folder, reference, step)


@pytest.mark.parametrize("step", [4, 6])  # the end of epoch 0, and mid-epoch 1
def test_resume_from_a_checkpoint_repeats_the_rest(
    step, reference, tiny_corpus, tmp_path, monkeypatch
):
    """Deterministic: resuming from each kept checkpoint of the reference run reproduces it."""
    path = reference / "checkpoints" / f"step-{step}.ckpt"
    folder = tmp_path / "resumed"
    train_in_process(folder, tiny_corpus, f"resume={path}", monkeypatch=monkeypatch)
    assert_same_run(folder, reference, step)


def test_a_second_resume_from_an_epoch_end_checkpoint_repeats_the_run(
    reference, tiny_corpus, tmp_path, monkeypatch
):
    """Found by scripts/crash_kills.py: a run resumed from an epoch's last batch (step 4) wrote
    checkpoints that Lightning's counters placed between epochs, and resuming from its step-8
    checkpoint (again an epoch's last batch) repeated epoch 1's data: losses off from step 8."""
    first = tmp_path / "first"
    step_4 = reference / "checkpoints" / "step-4.ckpt"
    train_in_process(first, tiny_corpus, f"resume={step_4}", monkeypatch=monkeypatch)
    second = tmp_path / "second"
    step_8 = first / "checkpoints" / "step-8.ckpt"
    train_in_process(second, tiny_corpus, f"resume={step_8}", monkeypatch=monkeypatch)
    assert_same_run(second, reference, 8)


def test_a_run_killed_after_its_last_checkpoint_finishes_its_end_on_resume(
    reference, tiny_corpus, tmp_path, monkeypatch
):
    """Found by scripts/crash_kills.py: a kill after the last step's checkpoint but before the
    end of training (mid-write of last.ckpt, or of the final model.safetensors) left a run that
    resumed at its last step, where Lightning skips the loop and its on_train_end: the model
    file stayed the previous export and last.ckpt the previous step's. Now the end's work runs
    in on_fit_end: EMA into the module, the export, the model folder, last.ckpt."""
    import shutil

    from safetensors.torch import save_file

    folder = tmp_path / "killed"
    shutil.copytree(reference, folder)
    (folder / "run.json").unlink()
    stale = {k: v * 0.5 for k, v in load_file(folder / "model.safetensors").items()}
    save_file(stale, str(folder / "model.safetensors"))  # an export the kill did not replace
    checkpoints = folder / "checkpoints"
    last, final = checkpoints / "last.ckpt", checkpoints / f"step-{STEPS}.ckpt"
    shutil.copyfile(checkpoints / f"step-{STEPS - 2}.ckpt", last)  # its write was killed
    os.utime(last, ns=(final.stat().st_mtime_ns - 10**9,) * 2)  # written before the final one
    train_in_process(folder, tiny_corpus, "resume=auto", monkeypatch=monkeypatch)
    a, b = load_file(folder / "model.safetensors"), load_file(reference / "model.safetensors")
    for key in b:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=0)
    a = live_weights(checkpoints / "last.ckpt")
    b = live_weights(reference / "checkpoints" / "last.ckpt")
    for key in b:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=0)
    assert (folder / "run.json").is_file()


def _slow_save(folder: Path) -> None:
    """In a forked child: overwrite last.ckpt through ``AtomicCheckpointIO`` with a ``torch.save``
    that takes seconds, as a large checkpoint does (only Python file writes run in the child)."""

    def slow_save(obj, path):
        with open(path, "wb") as f:
            for _ in range(200):
                f.write(b"\0" * 65536)
                f.flush()
                time.sleep(0.02)

    torch.save = slow_save  # this child's own torch: it exits when the write would end
    AtomicCheckpointIO().save_checkpoint({"global_step": 7}, folder / "last.ckpt")
    os._exit(0)


def test_a_kill_during_a_checkpoint_write_keeps_the_previous_one(tmp_path):
    import multiprocessing

    previous = tmp_path / "last.ckpt"
    torch.save({"global_step": 6, "state_dict": {"w": torch.ones(3)}}, previous)
    before = previous.read_bytes()
    child = multiprocessing.get_context("fork").Process(target=_slow_save, args=(tmp_path,))
    child.start()
    deadline = time.monotonic() + 30
    partial = []
    while not (partial and partial[0].stat().st_size > 65536) and time.monotonic() < deadline:
        partial = list(tmp_path.glob(".last.ckpt.*.tmp"))
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert child.exitcode == -signal.SIGKILL and partial and partial[0].exists()  # mid-write
    assert previous.read_bytes() == before
    assert torch.load(previous, weights_only=True)["global_step"] == 6
    assert not is_whole_checkpoint(partial[0]) and find_resume(tmp_path) == previous


def test_find_resume_takes_the_newest_whole_checkpoint(tmp_path):
    assert find_resume(tmp_path / "none") is None and find_resume(tmp_path) is None
    old, new, torn = tmp_path / "a.ckpt", tmp_path / "b.ckpt", tmp_path / "c.ckpt"
    torch.save({"step": 1}, old)
    torch.save({"step": 2}, new)
    torn.write_bytes(new.read_bytes()[:-40])  # cut short: no central directory
    for i, path in enumerate((old, new, torn)):
        os.utime(path, ns=(i * 10**9, i * 10**9))
    (tmp_path / "empty.ckpt").write_bytes(b"")
    assert find_resume(tmp_path) == new


def test_non_finite_weights_are_never_checkpointed(tmp_path):
    """Nothing is written, and the previous checkpoints (top-k and last) stay."""
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    class Break(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            if trainer.global_step == 3:
                next(pl_module.parameters()).data[0] = torch.nan

    checkpoint = Checkpoint(
        dirpath=str(tmp_path),
        filename="step-{step}",
        auto_insert_metric_name=False,
        save_last=True,
        every_n_train_steps=2,
    )
    trainer = L.Trainer(
        max_steps=4,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Break(), checkpoint],
        default_root_dir=tmp_path,
    )
    trainer.fit(BoringModel())
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["last.ckpt", "step-2.ckpt"]
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 2


def test_the_data_order_resumes_mid_epoch_and_at_its_end():
    data = list(range(10))

    def loader(state=None):
        out = ResumableLoader(data, batch_size=3, drop_last=True, sampler=ResumableSampler(10, 7))
        if state is not None:
            out.load_state_dict(state)
        return out

    whole = loader()
    epoch0 = [b.tolist() for b in whole]
    whole.sampler.set_epoch(1)
    epoch1 = [b.tolist() for b in whole]
    assert epoch0 != epoch1 and sorted(sum(epoch0, [])) == sorted(sum(epoch0, []))

    first = loader()
    first.sampler.taken = 3  # one batch trained (the datamodule counts them)
    assert [b.tolist() for b in loader(first.state_dict())] == epoch0[1:]
    first.sampler.taken = 9  # every full batch of the epoch: the next epoch is next
    resumed = loader(first.state_dict())
    assert resumed.sampler.epoch == 1 and [b.tolist() for b in resumed] == epoch1
    with pytest.raises(ValueError, match="same data and seed"):
        ResumableSampler(11, 7).load_state_dict(first.state_dict())


def test_wallclock_schedule_resumes_its_clock():
    now = [0.0]

    def schedule():
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        return opt, wallclock_cosine(opt, 100.0, warmup=0.1, clock=lambda: now[0])

    opt, sched = schedule()
    now[0] = 40.0
    opt.step()
    sched.step()
    state, lr = sched.state_dict(), opt.param_groups[0]["lr"]
    assert "clock" not in state and state["elapsed"] == 40.0

    now[0] = 5000.0  # a new process: its clock reads anything
    opt, sched = schedule()
    sched.load_state_dict(state)
    now[0] = 5030.0  # 30 s later: 70 s of the budget spent
    opt.step()
    sched.step()
    assert sched.elapsed() == 70.0 and opt.param_groups[0]["lr"] < lr
    now[0] = 0.0  # the uninterrupted schedule, 70 s in
    fresh_opt, fresh = schedule()
    now[0] = 70.0
    fresh_opt.step()
    fresh.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(fresh_opt.param_groups[0]["lr"])


def test_time_budget_phases_resume_from_the_timer_state():
    """Phases read Lightning's Timer, whose state a checkpoint restores."""
    timer = Timer(duration={"seconds": 100})
    timer.load_state_dict({"time_elapsed": {"train": 40.0}})
    trainer = SimpleNamespace(max_steps=-1, global_step=0, callbacks=[timer])
    assert budget_progress(trainer) == pytest.approx(0.4)
    timer.on_train_start(trainer, None)
    assert 0.4 <= budget_progress(trainer) < 0.41


def test_step_budget_phases_resume_from_the_global_step():
    trainer = SimpleNamespace(max_steps=12, global_step=9, callbacks=[])
    assert budget_progress(trainer) == 0.75


# without a step trigger Lightning also saves when the (last) epoch ends: step 8
@pytest.mark.parametrize("every_n_train_steps, saved", [(None, [3, 6, 8]), (4, [3, 4, 7, 8])])
def test_time_based_checkpoints_as_well_as_step_based(
    every_n_train_steps, saved, tmp_path, monkeypatch
):
    """A fake clock advancing 25 s per step and every_minutes=1: a save once 60 s have passed
    since the last one, whichever trigger made it."""
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    import cdlm.training.resume as resume

    clock = [0.0]
    monkeypatch.setattr(resume, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    class Tick(L.Callback):
        def on_train_batch_end(self, *args) -> None:
            clock[0] += 25.0

    checkpoint = Checkpoint(
        dirpath=str(tmp_path),
        filename="step-{step}",
        auto_insert_metric_name=False,
        save_top_k=-1,
        every_n_train_steps=every_n_train_steps,
        every_minutes=1,
    )
    trainer = L.Trainer(
        max_steps=8,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Tick(), checkpoint],
        default_root_dir=tmp_path,
    )
    trainer.fit(BoringModel())
    steps = sorted(int(p.stem.split("-")[1]) for p in tmp_path.glob("step-*.ckpt"))
    assert steps == saved
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)  # installed by setup
    assert all(is_whole_checkpoint(p) for p in tmp_path.glob("*.ckpt"))
    assert not list(tmp_path.glob(".*.tmp"))


def test_checkpoints_at_validation_as_well_as_by_steps(tmp_path):
    """Validation at steps 3 and 6, a step trigger of 4: saves at 3, 4, 6 and 8, each once."""
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    checkpoint = Checkpoint(
        dirpath=str(tmp_path),
        filename="step-{step}",
        auto_insert_metric_name=False,
        save_top_k=-1,
        save_last=True,
        every_n_train_steps=4,
    )
    trainer = L.Trainer(
        max_steps=8,
        val_check_interval=3,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoint],
        default_root_dir=tmp_path,
    )
    trainer.fit(BoringModel())
    steps = sorted(int(p.stem.split("-")[1]) for p in tmp_path.glob("step-*.ckpt"))
    assert steps == [3, 4, 6, 8] and not list(tmp_path.glob("*-v*.ckpt"))
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 8


@pytest.mark.parametrize("every_n_train_steps", [None, 50])
def test_the_state_key_is_lightnings_for_the_same_triggers(every_n_train_steps):
    """Checkpoints written while Lightning ran the step trigger itself keep their bookkeeping."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    ours = Checkpoint(every_n_train_steps=every_n_train_steps, every_minutes=10)
    lightnings = ModelCheckpoint(every_n_train_steps=every_n_train_steps)
    assert ours.state_key == lightnings.state_key.replace("ModelCheckpoint", "Checkpoint", 1)
    with pytest.raises(ValueError, match="every_n_epochs is not supported"):
        Checkpoint(every_n_epochs=2)


def test_long_callbacks_stop_a_terminated_run_before_their_work():
    """Lightning reads ``trainer.received_sigterm`` between steps and validation batches only:
    the callbacks that work for minutes (the world excess's oracle, sample logging, the final
    bound) end the fit before they start once SIGTERM came, and not before."""
    fit = SimpleNamespace(fn="fit")
    trainer = SimpleNamespace(received_sigterm=True, sanity_checking=False, state=fit)
    trainer.global_step = 7
    hooks = [
        lambda: WorldExcess(world="chars").on_validation_epoch_start(trainer, None),
        lambda: LogSamples(num_samples=1).on_train_end(trainer, None),
        lambda: ModelFolder(folder=".").on_train_end(trainer, None),
    ]
    for hook in hooks:
        with pytest.raises(SIGTERMException):
            hook()
    trainer.received_sigterm = False
    stop_if_terminated(trainer)
