"""Training in process: a Lightning fast_dev_run, and the EMA model is what gets exported."""

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import EMAWeightAveraging

from cdlm.data import TextDataModule
from cdlm.model_file import load_model
from cdlm.networks.transformer import Transformer
from cdlm.processes.gaussian import GaussianProcess
from cdlm.training.callbacks import ExportModel, LogSamples
from cdlm.training.lr_schedules import wallclock_cosine, warmup_cosine
from cdlm.training.module import DiffusionLM


def build(tiny_corpus):
    torch.manual_seed(0)
    data = TextDataModule(path=str(tiny_corpus), vocab_size=300, seq_len=16, batch_size=4)
    data.setup()
    process = GaussianProcess(vocab_size=data.vocab_size, embed_dim=8)
    network = Transformer(
        in_dim=8, out_dim=data.vocab_size, d_model=32, n_layers=1, n_heads=2, max_seq_len=16
    )
    config = {
        "process": {
            "_target_": "cdlm.processes.gaussian.GaussianProcess",
            "vocab_size": data.vocab_size,
            "embed_dim": 8,
        },
        "network": {
            "_target_": "cdlm.networks.transformer.Transformer",
            "in_dim": 8,
            "out_dim": data.vocab_size,
            "d_model": 32,
            "n_layers": 1,
            "n_heads": 2,
            "max_seq_len": 16,
        },
        "seq_len": 16,
        "labels": data.labels,
    }
    module = DiffusionLM(
        process,
        network,
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2),
        lr_scheduler=lambda o: warmup_cosine(o, 2, 5),
        model_config=config,
    )
    return data, module, config


def test_fast_dev_run(tiny_corpus, tmp_path):
    data, module, _ = build(tiny_corpus)
    before = [p.detach().clone() for p in module.parameters()]
    trainer = L.Trainer(
        fast_dev_run=True,
        logger=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
        precision="bf16-mixed",
    )
    trainer.fit(module, datamodule=data)
    assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=False))


def test_exported_model_holds_the_ema_weights(tiny_corpus, tmp_path, caplog):
    data, module, config = build(tiny_corpus)
    ema = EMAWeightAveraging(decay=0.5)
    samples = LogSamples(every_n_steps=5, num_samples=2, steps=2)  # the process's sampler
    path = tmp_path / "model.safetensors"
    trainer = L.Trainer(
        max_steps=5,
        val_check_interval=5,
        limit_val_batches=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        callbacks=[ema, ExportModel(path), samples],
    )
    with caplog.at_level("INFO"):
        trainer.fit(module, datamodule=data)
    # samples drawn once at step 5 (validation; the end of training adds none at the same step)
    assert [r.message.startswith("[step 5] ") for r in caplog.records].count(True) == 2
    assert samples.last_step == 5
    # the callback reads the configs from the module and the tokenizer from the datamodule
    model = load_model(path)
    assert model.tokenizer.get_vocab() == data.tokenizer.get_vocab()
    assert {k: v for k, v in model.config.items() if k != "process"} == {
        k: v for k, v in config.items() if k != "process"
    }
    assert config["process"].items() <= model.config["process"].items()  # completed on save
    exported = model.network.state_dict()
    averaged = ema._average_model.module.network.state_dict()
    for key, value in exported.items():
        torch.testing.assert_close(value, averaged[key])


def test_warmup_cosine_shape():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_cosine(opt, warmup_steps=4, total_steps=14, min_ratio=0.1)
    lrs = []
    for _ in range(16):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert abs(lrs[9] - 0.55) < 1e-9  # halfway through the decay
    assert abs(lrs[14] - 0.1) < 1e-9 and abs(lrs[15] - 0.1) < 1e-9


def test_warmup_given_as_a_fraction_of_the_step_budget():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_cosine(opt, warmup_steps=0.25, total_steps=16)
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:5] == [0.25, 0.5, 0.75, 1.0, 1.0] and lrs[5] < 1.0


def test_wallclock_schedule_follows_the_clock_not_the_steps():
    now = [100.0]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = wallclock_cosine(opt, "00:00:01:40", warmup=0.1, min_ratio=0.1, clock=lambda: now[0])
    seen = {}
    for elapsed in (5.0, 10.0, 55.0, 100.0, 130.0):
        now[0] = 100.0 + elapsed
        opt.step()
        sched.step()
        seen[elapsed] = opt.param_groups[0]["lr"]
    assert seen[5.0] == pytest.approx(0.5)  # halfway through a 10 s warmup
    assert seen[10.0] == pytest.approx(1.0)
    assert seen[55.0] == pytest.approx(0.55)  # halfway through the decay
    assert seen[100.0] == pytest.approx(0.1) and seen[130.0] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="DD:HH:MM:SS"):
        wallclock_cosine(opt, "10 minutes")


def test_ema_decay_warms_up():
    from torch.optim.swa_utils import AveragedModel

    from cdlm.training.ema import ema_with_warmup

    model = torch.nn.Linear(1, 1, bias=False)
    averaged = AveragedModel(model, avg_fn=ema_with_warmup(0.999))
    seen = []
    for value in (1.0, 2.0, 3.0):
        model.weight.data.fill_(value)
        averaged.update_parameters(model)
        seen.append(averaged.module.weight.item())
    # copy, then decay (1+n)/(10+n): 2/11 and 3/12
    expected2 = 2 / 11 * 1.0 + 9 / 11 * 2.0
    assert seen[0] == 1.0 and abs(seen[1] - expected2) < 1e-6
    assert abs(seen[2] - (0.25 * expected2 + 0.75 * 3.0)) < 1e-6
    late = ema_with_warmup(0.9)(
        torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64), 10_000
    )
    assert abs(late.item() - 0.1) < 1e-9  # the ramp is capped at the configured decay


def test_averaged_copy_is_a_frozen_warmed_up_ema():
    from cdlm.training.ema import averaged_copy, ema_fn

    model = torch.nn.Linear(1, 1, bias=False)
    target = averaged_copy(model, decay=0.999)
    assert not any(p.requires_grad for p in target.parameters())
    for value in (1.0, 2.0, 3.0):
        model.weight.data.fill_(value)
        target.update_parameters(model)
    expected2 = 2 / 11 * 1.0 + 9 / 11 * 2.0  # as ema_with_warmup: copy, then (1+n)/(10+n)
    assert abs(target.module.weight.item() - (0.25 * expected2 + 0.75 * 3.0)) < 1e-6
    fixed = ema_fn(0.9, warmup=False)  # the plain EMA of EMAWeightAveraging
    late = fixed(torch.tensor(0.0), torch.tensor(1.0), torch.tensor(1))
    assert abs(late.item() - 0.1) < 1e-6


def test_precision_auto_picks_bf16_only_where_the_hardware_has_it():
    """A CPU without bf16 matmuls emulates them ~300x slower than fp32: auto must not pick it."""
    import torch

    from cdlm.run.build import precision_for, resolve_precision

    assert precision_for(cuda=False, bf16=False) == "32-true"
    assert precision_for(cuda=False, bf16=True) == "bf16-mixed"
    assert precision_for(cuda=True, bf16=False) == "16-mixed"
    assert precision_for(cuda=True, bf16=True) == "bf16-mixed"
    assert resolve_precision("16-mixed") == "16-mixed"  # an explicit choice is kept
    cpu_bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert resolve_precision("auto", "cpu") == ("bf16-mixed" if cpu_bf16 else "32-true")
