"""Scale-out (docs/guide/scaling.md): DDP on 2 CPU processes (gloo) is the one-process optimisation
and validation, the trainer=ddp|fsdp configs, and the data order's split over ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_TRAIN, run_cli
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from safetensors.torch import load_file

from cdlm import config_dir
from cdlm.data.order import BatchShards, ResumableLoader, ResumableSampler, global_batch_index
from cdlm.run.folder import launched_as_rank_zero

HERE = Path(__file__).parent


def compose_train(*overrides: str):
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        return compose("train", overrides=list(overrides))


# --- the data order over ranks -------------------------------------------------------------


@pytest.mark.parametrize("world, batch", [(2, 3), (4, 2)])
def test_ranks_split_each_one_process_batch(world, batch):
    """Step k on rank r trains on the r-th slice of the one-process run's k-th batch of
    world * batch sequences: the DDP run sees what one process with the global batch sees."""
    one = list(ResumableSampler(50, seed=3))
    ranks = [list(ResumableSampler(50, 3, r, world, batch)) for r in range(world)]
    g = world * batch
    assert all(len(s) == 50 // g * batch for s in ranks)
    for k in range(50 // g):
        together = [i for s in ranks for i in s[k * batch : (k + 1) * batch]]
        assert together == one[k * g : (k + 1) * g]


def test_a_resume_continues_on_another_number_of_processes():
    """The state counts sequences taken over all ranks, so a run checkpointed on 2 processes
    resumes on 1 (or 4) at the same place in the epoch."""
    world, batch = 2, 3
    ddp = ResumableSampler(60, 1, 0, world, batch)
    ddp.taken = 2 * world * batch  # two steps done
    single = ResumableSampler(60, 1)
    single.load_state_dict(ddp.state_dict())
    assert list(single) == list(ResumableSampler(60, 1))[12:]


def test_the_last_partial_global_batch_starts_the_next_epoch_on_resume():
    sampler = ResumableSampler(20, 0, 1, 2, 4)
    loader = ResumableLoader(range(20), sampler=sampler, batch_size=4)
    loader.load_state_dict({"seed": 0, "epoch": 0, "taken": 16, "size": 20})  # 4 left < 8
    assert (sampler.epoch, sampler.taken) == (1, 0)


@pytest.mark.parametrize("size, batch, world", [(10, 3, 2), (9, 3, 3), (7, 4, 2), (2, 4, 3)])
def test_validation_batches_are_dealt_whole_without_repeats(size, batch, world):
    one = [list(range(s, min(s + batch, size))) for s in range(0, size, batch)]
    for r in range(world):
        shard = list(BatchShards(size, batch, r, world))
        mine = [shard[i : i + batch] for i in range(0, len(shard), batch)]
        assert len(BatchShards(size, batch, r, world)) == len(shard)
        for j, b in enumerate(mine):
            assert b == one[global_batch_index(j, r, world)]
    seen = sorted(i for r in range(world) for i in BatchShards(size, batch, r, world))
    assert seen == list(range(size))


@pytest.mark.parametrize(
    "env, zero",
    [
        ({}, True),
        ({"LOCAL_RANK": "1"}, False),
        ({"LOCAL_RANK": "0", "NODE_RANK": "1"}, False),
        ({"RANK": "0", "LOCAL_RANK": "0"}, True),
        ({"RANK": "3", "LOCAL_RANK": "1"}, False),
        ({"SLURM_PROCID": "2"}, False),
    ],
)
def test_only_the_first_process_owns_the_run_folder(monkeypatch, env, zero):
    for var in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert launched_as_rank_zero() is zero


# --- configs ---------------------------------------------------------------------------------


def test_trainer_ddp_is_lightnings_ddp_strategy():
    cfg = compose_train("trainer=ddp")
    strategy = instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, DDPStrategy)
    assert strategy._process_group_backend is None  # Lightning picks gloo on CPU, nccl on GPU
    assert cfg.callbacks.ema is not None


def test_trainer_fsdp_shards_by_block_and_turns_ema_off():
    from cdlm.networks.transformer import Block

    cfg = compose_train("trainer=fsdp")
    strategy = instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {Block}
    assert strategy.sharding_strategy.name == "FULL_SHARD"
    assert cfg.callbacks.ema is None
    assert cfg.trainer.precision == "auto"  # bf16-mixed on a GPU with bf16 (run.build)


# --- 2 gloo processes through the real CLI ---------------------------------------------------

DDP = ["trainer=ddp", "trainer.devices=2", "trainer.accelerator=cpu"]


def _train(tmp_path: Path, corpus: Path, name: str, *overrides: str) -> Path:
    run = tmp_path / name
    result = run_cli(
        "cdlm-train",
        f"data.path={corpus}",
        *TINY_TRAIN,
        "process=autoregressive",
        "condition.labels=false",  # no label dropout draws: the data is the only input
        "trainer.max_steps=4",
        "trainer.val_check_interval=4",
        "trainer.limit_val_batches=1.0",
        "callbacks.samples.num_samples=0",
        "callbacks.model_folder.bound_sequences=0",
        *overrides,
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run


def _last_val(run: Path) -> dict[str, float]:
    import csv

    with open(next((run / "csv").glob("version_*")) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    val = [r for r in rows if r.get("val/loss")]
    return {k: float(v) for k, v in val[-1].items() if k.startswith("val/") and v}


@pytest.mark.slow  # two CLI trainings, one of them on 2 processes: ~40 s on 2 cores
def test_ddp_on_two_processes_is_one_process_with_twice_the_batch(tmp_path, tiny_corpus):
    """Same data order, gradients averaged over ranks: after 4 AdamW steps (with EMA, warmup
    and clipping) the exported weights and the validation loss match to fp32 tolerance."""
    ddp = _train(tmp_path, tiny_corpus, "ddp", "data.batch_size=4", *DDP)
    one = _train(tmp_path, tiny_corpus, "one", "data.batch_size=8")
    a, b = load_file(ddp / "model.safetensors"), load_file(one / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    assert _last_val(ddp)["val/loss"] == pytest.approx(_last_val(one)["val/loss"], rel=1e-5)


def _validate(model: Path, corpus: Path, devices: int, out: Path) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, str(HERE / "distributed_validate.py"), str(model), str(corpus)]
        + [str(devices), "4", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=out.parent,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow  # 3 validation runs, 2 of them on 2 processes: ~30 s on 2 cores
@pytest.mark.parametrize("fixture", ["tiny_masked_checkpoint", "tiny_checkpoint"])
def test_validation_on_two_processes_equals_one_process(tmp_path, tiny_corpus, fixture, request):
    """Every validation figure (noisy losses, per-level CE and accuracy, the no-context
    readout) is the one-process figure: batches dealt whole, noise keyed on the global batch,
    means reduced over ranks."""
    model = request.getfixturevalue(fixture)
    one = _validate(model, tiny_corpus, 1, tmp_path / "one.json")
    two = _validate(model, tiny_corpus, 2, tmp_path / "two.json")
    assert one.keys() == two.keys() and "val/loss" in one and len(one) > 3
    for k in one:
        assert two[k] == pytest.approx(one[k], rel=1e-5, abs=1e-6), k


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FSDP needs a CUDA GPU (none here)")
def test_fsdp_trains_and_exports_a_whole_model(tmp_path, tiny_corpus):
    from cdlm.model_file import load_model

    run = _train(
        tmp_path,
        tiny_corpus,
        "fsdp",
        "trainer=fsdp",
        f"trainer.devices={torch.cuda.device_count()}",
        "trainer.precision=bf16-mixed",
    )
    model = load_model(run / "model.safetensors")
    assert sum(p.numel() for p in model.network.parameters()) > 0


# --- a peer that died ----------------------------------------------------------------------


GLOO = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:2958: "
    "Connection reset by peer. This is typically caused by a remote worker hanging. GLHF!"
)


def test_a_peers_death_is_one_line_naming_the_rank_and_the_way_back():
    from cdlm.training.peers import lost_peer

    line = lost_peer(RuntimeError(GLOO), rank=0, world_size=2)
    assert line.startswith("rank 0 of 2: another process of this run died")
    assert "Read error [127.0.0.1]:2958: Connection reset by peer)" in line
    assert "resume=auto" in line and "\n" not in line
    dist_error = torch.distributed.DistNetworkError("Connection closed by peer [127.0.0.1]:1")
    assert lost_peer(dist_error, rank=1, world_size=2).startswith("rank 1 of 2")


@pytest.mark.parametrize(
    "error, world_size",
    [
        (RuntimeError(GLOO), 1),  # one process has no peer to lose
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), 2),  # a bug keeps its trace
        (ValueError("Connection reset by peer"), 2),
    ],
)
def test_other_errors_keep_their_traceback(error, world_size):
    from cdlm.training.peers import lost_peer

    assert lost_peer(error, rank=0, world_size=world_size) is None
