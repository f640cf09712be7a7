"""``cdlm-train``: build data, process, network, module, callbacks and trainer from the Hydra
config, then fit. Everything is chosen by ``_target_`` (conf/); this file only wires the
vocabulary facts of the data into the process and the process's widths into the network."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger, WandbLogger
from omegaconf import DictConfig, OmegaConf

from cdlm.cli.common import (
    UsageError,
    default_wandb_mode,
    require,
    require_bool,
    require_model_file,
    require_number,
    run,
)
from cdlm.cli.run_folder import claim, discard_if_unused, hold
from cdlm.distillation.module import student_of
from cdlm.model_file import load_model, load_network_weights
from cdlm.training.guard import Diverged
from cdlm.training.module import parse_duration
from cdlm.training.resume import find_resume, is_whole_checkpoint


def _given(overrides: list[str] | None, key: str) -> bool:
    """Whether the command line chose ``key`` (a group or a value)."""
    return any(o.split("=", 1)[0].lstrip("+~") == key for o in overrides or [])


def validate(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """Every option's type and range, and the files it names, before any work."""
    require_number("seed", cfg.seed, integer=True)
    require_number("data.seq_len", cfg.data.seq_len, integer=True, at_least=2)
    require_number("data.batch_size", cfg.data.batch_size, integer=True, at_least=1)
    require_number("data.vocab_size", cfg.data.vocab_size, integer=True, at_least=1)
    require_number("data.val_fraction", cfg.data.val_fraction, above=0, below=1)
    require_bool("data.packing", cfg.data.packing)
    require_bool("data.streaming", cfg.data.get("streaming", False))
    require_number("condition.dropout", cfg.condition.dropout, at_least=0, at_most=1)
    require_bool("condition.labels", cfg.condition.labels)
    steps, limit = cfg.trainer.max_steps, "(or -1 for no limit)"
    require_number("trainer.max_steps", steps, integer=True, nullable=True, note=limit)
    require(
        steps is None or steps == -1 or steps >= 1,
        f"trainer.max_steps must be >= 1 {limit}, got {steps}",
    )
    max_time = cfg.trainer.get("max_time")
    if isinstance(max_time, str):  # Lightning also takes {minutes: 10}; it checks those itself
        try:
            seconds = parse_duration(max_time)
        except ValueError:
            raise UsageError(f"trainer.max_time must be 'DD:HH:MM:SS', got {max_time!r}") from None
        require(seconds > 0, f"trainer.max_time must be > 0, got {max_time!r}")
    every = cfg.trainer.get("val_check_interval")
    if isinstance(every, int | float):  # or a time string, which Lightning checks
        require_number("trainer.val_check_interval", every, above=0)
    if "lr" in cfg.optimizer:
        require_number("optimizer.lr", cfg.optimizer.lr, above=0)
    ar, anneal = cfg.phases.ar, cfg.phases.anneal
    require_number("phases.ar", ar, at_least=0, below=1)
    require_number("phases.anneal", anneal, at_least=0, at_most=1)
    require(
        ar + anneal <= 1.0,
        f"phases.ar and phases.anneal are shares of the budget (ar < 1, ar + anneal <= 1), got "
        f"ar={ar}, anneal={anneal}",
    )
    validate_callbacks(cfg)
    validate_files(cfg)
    # Each process reads the schedule group that fits it; a choice it ignores is a mistake.
    uses = OmegaConf.to_container(cfg.process).get("schedule")
    for group in ("schedule", "mask_schedule"):
        ignored = uses != f"${{{group}}}"
        require(
            not (_given(overrides, group) and ignored),
            f"{group}= does not apply to process={cfg.process._target_.rsplit('.', 1)[-1]}; "
            f"it reads {uses.strip('${}') if isinstance(uses, str) else 'no schedule'}=",
        )


def validate_callbacks(cfg: DictConfig) -> None:
    """The reliability options (conf/callbacks/default.yaml), where those callbacks are on."""
    checkpoint, guard = cfg.callbacks.get("checkpoint"), cfg.callbacks.get("guard")
    if checkpoint is not None:
        for key, options in (
            ("every_n_train_steps", {"integer": True, "at_least": 1}),
            ("every_minutes", {"above": 0}),
        ):
            if key in checkpoint:
                require_number(
                    f"callbacks.checkpoint.{key}", checkpoint[key], nullable=True, **options
                )
    if guard is not None:
        name = "callbacks.guard.max_consecutive"
        require_number(name, guard.max_consecutive, integer=True, at_least=1)


def validate_files(cfg: DictConfig) -> None:
    """resume= is auto or a whole Lightning checkpoint; init_from= and teacher= are model files."""
    for key in ("init_from", "teacher"):
        if cfg.get(key):
            require_model_file(cfg[key])
    resume = cfg.resume
    if resume is None or resume == "auto":
        return
    path = Path(str(resume))
    require(path.is_file(), f"resume={resume}: no such file (or resume=auto: this run folder's)")
    if not is_whole_checkpoint(path):
        kind = (
            "a cdlm model file: start from its weights with init_from="
            if path.suffix == ".safetensors"
            else "not a whole Lightning checkpoint (empty, truncated or another format)"
        )
        raise UsageError(f"resume={resume} is {kind}")


def token_ids(process_cfg: DictConfig, tokenizer) -> dict[str, int]:
    """The vocabulary facts a process config asks for (its keys left null), from the tokenizer."""
    known = {
        "vocab_size": len(tokenizer),
        "mask_id": tokenizer.mask_token_id,
        "eos_id": tokenizer.eos_token_id,
        "bos_id": tokenizer.eos_token_id,  # the AR baseline starts every sequence at EOS
    }
    return {k: v for k, v in known.items() if k == "vocab_size" or k in process_cfg}


def model_config(
    cfg: DictConfig, process_kwargs: dict, network_kwargs: dict, labels: list[str]
) -> dict:
    """The resolved configs a checkpoint needs to rebuild the model without this run's files."""
    return {
        "process": OmegaConf.to_container(cfg.process, resolve=True) | process_kwargs,
        "network": OmegaConf.to_container(cfg.network, resolve=True) | network_kwargs,
        "seq_len": cfg.data.seq_len,
        "labels": labels,
    }


def build(cfg: DictConfig) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(data, process, network, module keywords): from the config, or with ``teacher=PATH`` the
    teacher's tokenizer, sequence length and process and a student copy of its network
    (distillation modules)."""
    if cfg.get("teacher"):
        teacher = load_model(cfg.teacher)
        data = instantiate(cfg.data, seq_len=teacher.config["seq_len"], seed=cfg.seed)
        data.use_tokenizer(teacher.tokenizer)
        data.setup("fit")
        network = student_of(teacher.network)
        return (
            data,
            teacher.process.train(),
            network,
            {
                "teacher": teacher.network,
                "model_config": teacher.config,
            },
        )
    data = instantiate(cfg.data, seed=cfg.seed)
    data.setup("fit")
    process_kwargs = token_ids(cfg.process, data.tokenizer)
    process = instantiate(cfg.process, **process_kwargs)
    network_kwargs = process.network_kwargs | {
        "max_seq_len": cfg.data.seq_len + 1,  # + 1: a BOS for shifted prediction
        "num_classes": len(data.labels) if cfg.condition.labels else 0,
    }
    network = instantiate(cfg.network, **network_kwargs)
    if cfg.init_from:
        load_network_weights(network, cfg.init_from)
    return (
        data,
        process,
        network,
        {
            "log_prior": data.log_unigram(),
            "model_config": model_config(cfg, process_kwargs, network_kwargs, data.labels),
        },
    )


def train(cfg: DictConfig) -> None:
    folder = Path(HydraConfig.get().runtime.output_dir)
    with hold(folder):  # held since main() when the folder was known up front
        with discard_if_unused(folder):
            trainer, module, data = setup(cfg, folder)
        try:
            trainer.fit(module, datamodule=data, ckpt_path=resume_path(cfg, folder))
        except Diverged as e:  # not bad input: exit status 1
            print(f"cdlm-train: error: {e}", file=sys.stderr)
            sys.exit(1)


def setup(cfg: DictConfig, folder: Path) -> tuple[L.Trainer, L.LightningModule, Any]:
    """Everything ``fit`` needs, built from the config; writes nothing."""
    default_wandb_mode()
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    factory = instantiate(cfg.module, _partial_=True)
    needs_teacher = getattr(factory.func, "needs_teacher", False)
    require(
        needs_teacher == bool(cfg.get("teacher")),
        f"module={HydraConfig.get().runtime.choices.get('module')} "
        + ("needs teacher=PATH (a model.safetensors)" if needs_teacher else "takes no teacher=")
        + "; distillation modules (module=distill_progressive|distill_consistency|distill_sdtt) "
        "take one, module=diffusion does not",
    )
    data, process, network, extra = build(cfg)
    # A partial, called with the built objects: Hydra would turn them into configs.
    module = factory(
        process=process,
        network=network,
        optimizer=instantiate(cfg.optimizer),
        lr_scheduler=instantiate(cfg.get("lr_scheduler")),
        **extra,
    )
    callbacks = [instantiate(c) for c in cfg.callbacks.values() if c is not None]
    logger = build_logger(cfg, process)
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=logger)
    n_params = sum(p.numel() for p in module.parameters())
    print(
        f"cdlm-train: {n_params / 1e6:.2f}M parameters, vocab {data.vocab_size}, "
        f"{_count(data.train_set)} train / {_count(data.val_set)} val sequences, output {folder}"
    )
    return trainer, module, data


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


def _count(dataset) -> str:
    """A dataset's size, or "streamed" for an iterable one (``data.streaming=true``)."""
    return str(len(dataset)) if hasattr(dataset, "__len__") else "streamed"


def resume_path(cfg: DictConfig, folder: Path) -> str | None:
    """``resume`` as given, or for ``resume=auto`` the newest whole checkpoint of this run."""
    if cfg.resume != "auto":
        return cfg.resume
    where = Path(OmegaConf.select(cfg, "callbacks.checkpoint.dirpath") or folder / "checkpoints")
    found = find_resume(where)
    print(
        f"cdlm-train: resume=auto: resuming from {found}"
        if found
        else f"cdlm-train: resume=auto: no checkpoint in {where}, starting fresh (resume=auto "
        "continues the run of the same hydra.run.dir)"
    )
    return str(found) if found else None


def main() -> None:
    with ExitStack() as locks:

        def checked(cfg: DictConfig, overrides: list[str]) -> None:
            validate(cfg, overrides)
            claim(overrides, locks)

        run("cdlm-train", "train", train, checked)


if __name__ == "__main__":
    main()
