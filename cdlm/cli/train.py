"""``cdlm-train``: build data, process, network and trainer from the Hydra config, then fit."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from cdlm.checkpoint import load_network_weights
from cdlm.cli.common import default_wandb_mode, require, run
from cdlm.generate import default_sampler
from cdlm.training.callbacks import ExportModel, LogSamples
from cdlm.training.module import DiffusionLM


def validate(cfg: DictConfig) -> None:
    require(cfg.data.seq_len >= 2, f"data.seq_len must be >= 2, got {cfg.data.seq_len}")
    require(cfg.data.batch_size >= 1, f"data.batch_size must be >= 1, got {cfg.data.batch_size}")
    p = cfg.condition.dropout
    require(0.0 <= p <= 1.0, f"condition.dropout must be in [0, 1], got {p}")
    steps = cfg.trainer.max_steps
    require(
        steps is None or steps == -1 or steps >= 1,
        f"trainer.max_steps must be >= 1 (or -1 for no limit), got {steps}",
    )
    warm = cfg.process.get("ar_steps", 0) + cfg.process.get("anneal_steps", 0)
    require(
        not (steps and steps > 0 and warm >= steps),
        f"process.ar_steps + process.anneal_steps = {warm} leave no diffusion training in "
        f"trainer.max_steps={steps}; lower them (process.ar_steps=0 process.anneal_steps=0 "
        "trains the diffusion objective from the first step)",
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


def train(cfg: DictConfig) -> None:
    default_wandb_mode()
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    data = instantiate(cfg.data)
    data.setup("fit")
    process_kwargs = token_ids(cfg.process, data.tokenizer)
    process = instantiate(cfg.process, **process_kwargs)
    network_kwargs = process.network_kwargs | {
        "max_seq_len": cfg.data.seq_len + 1,  # + 1: a BOS for shifted masked prediction
        "num_classes": len(data.labels) if cfg.condition.labels else 0,
    }
    network = instantiate(cfg.network, **network_kwargs)
    if cfg.init_from:
        load_network_weights(network, cfg.init_from)
    module = DiffusionLM(
        process,
        network,
        optimizer=instantiate(cfg.optimizer),
        lr_scheduler=instantiate(cfg.get("lr_scheduler")),
        label_dropout=cfg.condition.dropout,
        eval_times=cfg.eval_times,
        log_prior=data.log_unigram(),
    )
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    callbacks = [instantiate(c) for c in cfg.callbacks.values() if c is not None]
    callbacks += [
        ExportModel(
            out_dir / "model.safetensors",
            model_config(cfg, process_kwargs, network_kwargs, data.labels),
            data.tokenizer,
        ),
        LogSamples(
            data.tokenizer,
            cfg.data.seq_len,
            instantiate(cfg.log_samples.sampler) or default_sampler(process),
            cfg.log_samples.every_n_steps,
            cfg.log_samples.num_samples,
            cfg.log_samples.steps,
        ),
    ]
    logger = instantiate(cfg.logger) if cfg.logger else False
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=logger)
    n_params = sum(p.numel() for p in module.parameters())
    print(
        f"cdlm-train: {n_params / 1e6:.2f}M parameters, vocab {data.vocab_size}, "
        f"{len(data.train_set)} train / {len(data.val_set)} val sequences, output {out_dir}"
    )
    trainer.fit(module, datamodule=data, ckpt_path=cfg.resume)


def main() -> None:
    run("cdlm-train", "train", train, validate)


if __name__ == "__main__":
    main()
