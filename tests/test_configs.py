"""Every config file composes, and every group option instantiates."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from cdlm import config_dir
from cdlm.cli.train import token_ids
from cdlm.networks.transformer import Transformer
from cdlm.processes import AutoregressiveProcess, GaussianProcess, MaskedProcess

CONF = config_dir()


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_train(*overrides: str):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def test_config_dir_is_the_repo_conf():
    assert (CONF / "train.yaml").is_file() and (CONF / "sample.yaml").is_file()


class StubTokenizer:
    mask_token_id, eos_token_id = 3, 1

    def __len__(self):
        return 50


@pytest.mark.parametrize(
    "process, schedule_group, expected",
    [
        ("gaussian", "schedule", GaussianProcess),
        ("masked", "mask_schedule", MaskedProcess),
        ("autoregressive", None, AutoregressiveProcess),
    ],
)
def test_processes_and_schedules_instantiate(process, schedule_group, expected):
    for schedule in options(schedule_group) if schedule_group else [None]:
        overrides = [f"process={process}"] + ([f"{schedule_group}={schedule}"] if schedule else [])
        cfg = compose_train(*overrides)
        obj = instantiate(cfg.process, **token_ids(cfg.process, StubTokenizer()))
        assert isinstance(obj, expected) and obj.vocab_size == 50
        if schedule:
            assert type(obj.schedule).__name__.lower().startswith(schedule.replace("_", ""))
        net = instantiate(cfg.network, **obj.network_kwargs, max_seq_len=8)
        assert net.causal == (process == "autoregressive")


@pytest.mark.parametrize("process", ["gaussian", "masked"])
@pytest.mark.parametrize("sampler", options("time_sampler"))
def test_time_samplers_instantiate_inside_each_process(process, sampler):
    cfg = compose_train(f"process={process}", f"time_sampler@process.time_sampler={sampler}")
    obj = instantiate(cfg.process, **token_ids(cfg.process, StubTokenizer()))
    assert type(obj.time_sampler).__name__.lower() == sampler


def test_network_optimizer_scheduler_instantiate():
    cfg = compose_train()
    net = instantiate(cfg.network, in_dim=8, out_dim=10, max_seq_len=16)
    assert isinstance(net, Transformer)
    opt = instantiate(cfg.optimizer)(net.parameters())
    sched = instantiate(cfg.lr_scheduler)(opt)
    assert sched.get_last_lr()[0] > 0


@pytest.mark.parametrize("logger", options("logger"))
def test_loggers_and_callbacks_instantiate(logger, tmp_path):
    cfg = compose_train(f"logger={logger}")
    OmegaConf.update(cfg, "hydra.runtime.output_dir", str(tmp_path), force_add=True)
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(cfg)
    assert instantiate(cfg.logger) is not None
    assert all(instantiate(c) is not None for c in cfg.callbacks.values())
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert trainer_cfg["default_root_dir"] == str(tmp_path)


@pytest.mark.parametrize("experiment", options("experiment"))
def test_experiments_compose(experiment):
    cfg = compose_train(f"experiment={experiment}")
    assert cfg.name == experiment


@pytest.mark.parametrize("sampler", options("sampler"))
def test_sample_config_and_samplers_compose(sampler):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("sample", overrides=[f"sampler={sampler}", "ckpt=x"])
    fn = instantiate(cfg.sampler)
    assert fn.func.sampler_name == sampler


def test_every_yaml_file_is_covered():
    covered = {
        "process",
        "schedule",
        "mask_schedule",
        "metric",
        "network",
        "optimizer",
        "lr_scheduler",
        "logger",
        "callbacks",
        "experiment",
        "sampler",
        "data",
        "trainer",
        "time_sampler",
    }
    groups = {p.parent.name for p in Path(CONF).rglob("*.yaml") if p.parent != Path(CONF)}
    assert groups <= covered, groups - covered
