"""``cdlm-eval``: a checkpoint's held-out likelihood (ELBO or ODE NLL) in bits per token."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from cdlm.checkpoint import load_checkpoint
from cdlm.cli.common import require, run
from cdlm.cli.sample import resolve_device
from cdlm.io import atomic_write_text
from cdlm.likelihood.evaluate import evaluate, validation_tokens


def validate(cfg: DictConfig) -> None:
    require(cfg.ckpt is not None, "ckpt=PATH is required (a .safetensors file from cdlm-train)")
    require(cfg.batch_size >= 1, f"batch_size must be >= 1, got {cfg.batch_size}")
    require(
        cfg.num_batches is None or cfg.num_batches >= 1,
        f"num_batches must be >= 1 (or null for all), got {cfg.num_batches}",
    )
    require(
        0.0 < cfg.data.val_fraction < 1.0,
        f"data.val_fraction must be in (0, 1), got {cfg.data.val_fraction}",
    )
    for key in ("rtol", "atol"):
        value = cfg.metric.get(key)
        require(value is None or value > 0, f"metric.{key} must be > 0, got {value}")


def evaluate_checkpoint(cfg: DictConfig) -> None:
    model = load_checkpoint(cfg.ckpt, resolve_device(cfg.device))
    require(
        model.process.kind == "gaussian",
        f"cdlm-eval scores gaussian models, not {model.process.kind!r}",
    )
    metric = instantiate(cfg.metric)
    tokens = validation_tokens(model, cfg.data.path, cfg.data.val_fraction, cfg.data.packing)
    start = time.perf_counter()
    report = evaluate(
        model, metric, tokens, batch_size=cfg.batch_size, num_batches=cfg.num_batches, seed=cfg.seed
    )
    name = metric.func.__name__
    report = {
        "metric": name,
        "ckpt": str(cfg.ckpt),
        **report,
        "options": OmegaConf.to_container(cfg.metric) | {"seed": cfg.seed},
        "wall_seconds": round(time.perf_counter() - start, 3),
    }
    terms = ", ".join(f"{k}={v:.4f}" for k, v in report["bits_per_token"].items())
    print(f"cdlm-eval: {name} on {report['sequences']} sequences, bits/token: {terms}")
    if cfg.out:
        atomic_write_text(Path(cfg.out), json.dumps(report, indent=2) + "\n")
        print(f"cdlm-eval: wrote {cfg.out}")


def main() -> None:
    run("cdlm-eval", "eval", evaluate_checkpoint, validate)


if __name__ == "__main__":
    main()
