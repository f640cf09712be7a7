"""``cdlm-train``: build data, process, network, module, callbacks and trainer from the Hydra
config, then fit. Everything is chosen by ``_target_`` (conf/); this file only wires the
vocabulary facts of the data into the process and the process's widths into the network."""

from __future__ import annotations

from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from cdlm.checkpoint import load_checkpoint, load_network_weights
from cdlm.cli.common import default_wandb_mode, require, run
from cdlm.distillation.module import student_of


def _given(overrides: list[str] | None, key: str) -> bool:
    """Whether the command line chose ``key`` (a group or a value)."""
    return any(o.split("=", 1)[0].lstrip("+~") == key for o in overrides or [])


def validate(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    require(cfg.data.seq_len >= 2, f"data.seq_len must be >= 2, got {cfg.data.seq_len}")
    require(cfg.data.batch_size >= 1, f"data.batch_size must be >= 1, got {cfg.data.batch_size}")
    p = cfg.condition.dropout
    require(0.0 <= p <= 1.0, f"condition.dropout must be in [0, 1], got {p}")
    steps = cfg.trainer.max_steps
    require(
        steps is None or steps == -1 or steps >= 1,
        f"trainer.max_steps must be >= 1 (or -1 for no limit), got {steps}",
    )
    ar, anneal = cfg.phases.ar, cfg.phases.anneal
    require(
        0.0 <= ar < 1.0 and 0.0 <= anneal and ar + anneal <= 1.0,
        f"phases.ar and phases.anneal are shares of the budget (ar < 1, ar + anneal <= 1), got "
        f"ar={ar}, anneal={anneal}",
    )
    # Each process reads the schedule group that fits it; a choice it ignores is a mistake.
    uses = OmegaConf.to_container(cfg.process).get("schedule")
    for group in ("schedule", "mask_schedule"):
        ignored = uses != f"${{{group}}}"
        require(
            not (_given(overrides, group) and ignored),
            f"{group}= does not apply to process={cfg.process._target_.rsplit('.', 1)[-1]}; "
            f"it reads {uses.strip('${}') if isinstance(uses, str) else 'no schedule'}=",
        )


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
        teacher = load_checkpoint(cfg.teacher)
        data = instantiate(cfg.data, seq_len=teacher.config["seq_len"])
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
    data = instantiate(cfg.data)
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
    logger = instantiate(cfg.logger) if cfg.logger else False
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=logger)
    n_params = sum(p.numel() for p in module.parameters())
    print(
        f"cdlm-train: {n_params / 1e6:.2f}M parameters, vocab {data.vocab_size}, "
        f"{len(data.train_set)} train / {len(data.val_set)} val sequences, output "
        f"{HydraConfig.get().runtime.output_dir}"
    )
    trainer.fit(module, datamodule=data, ckpt_path=cfg.resume)


def main() -> None:
    run("cdlm-train", "train", train, validate)


if __name__ == "__main__":
    main()
