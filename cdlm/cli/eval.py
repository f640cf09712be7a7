"""``cdlm-eval``: the full report of a checkpoint and sampler (quality beside real text, the val
bound, speed and work), or its held-out likelihood alone (ELBO or ODE NLL), or ``--compare``
several JSON reports in one table."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from cdlm.checkpoint import load_checkpoint
from cdlm.cli.common import (
    default_wandb_mode,
    fail,
    require,
    require_bool,
    require_choice,
    require_model_file,
    require_number,
    run,
)
from cdlm.cli.sample import resolve_device
from cdlm.evaluation import harness
from cdlm.evaluation.quality import load_scorer
from cdlm.evaluation.report import compare_markdown, summary_markdown
from cdlm.io import atomic_write_text
from cdlm.likelihood.evaluate import evaluate, validation_tokens
from cdlm.samplers.grids import GRIDS


def validate(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """Every option's type and range, before any work; ``overrides`` is not needed here."""
    require(cfg.ckpt is not None, "ckpt=PATH is required (a .safetensors file from cdlm-train)")
    require_number("batch_size", cfg.batch_size, integer=True, at_least=1)
    require_number(
        "num_batches",
        cfg.num_batches,
        integer=True,
        at_least=1,
        nullable=True,
        note="(or null for all)",
    )
    require_number("data.val_fraction", cfg.data.val_fraction, above=0, below=1)
    require_bool("data.packing", cfg.data.packing)
    for key in ("rtol", "atol"):
        if key in cfg.metric:
            require_number(f"metric.{key}", cfg.metric[key], above=0)
    for key in ("t_samples", "probes"):
        if key in cfg.metric:
            require_number(f"metric.{key}", cfg.metric[key], integer=True, at_least=1)
    require_number("steps", cfg.steps, integer=True, at_least=1, nullable=True)
    for key in ("num_samples", "repeats", "likelihood_draws"):
        require_number(key, cfg[key], integer=True, at_least=1)
    require_number("seed", cfg.seed, integer=True)
    require_number("temperature", cfg.temperature, above=0)
    require_choice("grid", cfg.grid, GRIDS)
    for key in ("cut_at_eos", "wandb"):
        require_bool(key, cfg[key])
    resolve_device(cfg.device)
    require_model_file(cfg.ckpt)


def full_report(cfg: DictConfig) -> None:
    """The full evaluation; prints the markdown summary, writes JSON + .md, logs to W&B."""
    device = resolve_device(cfg.device)
    scorer = (
        None
        if cfg.scorer == "none"
        else load_scorer(None if cfg.scorer == "default" else cfg.scorer, device)
    )
    result = harness.evaluate_checkpoint(
        cfg.ckpt,
        instantiate(cfg.get("sampler")),
        steps=cfg.steps,
        num_samples=cfg.num_samples,
        seed=cfg.seed,
        repeats=cfg.repeats,
        grid=cfg.grid,
        scorer=scorer,
        device=device,
        data_path=cfg.data.path,
        likelihood_sequences=None if cfg.num_batches is None else cfg.num_batches * cfg.batch_size,
        likelihood_draws=cfg.likelihood_draws,
        cut_at_eos=cfg.cut_at_eos,
        temperature=cfg.temperature,
    )
    summary = summary_markdown(result)
    print(summary)
    if cfg.out:
        atomic_write_text(Path(cfg.out), json.dumps(result, indent=2) + "\n")
        atomic_write_text(Path(cfg.out).with_suffix(".md"), summary)
        print(f"cdlm-eval: wrote {cfg.out} and {Path(cfg.out).with_suffix('.md')}")
    if cfg.wandb:
        log_to_wandb(result)


def log_to_wandb(result: dict) -> None:
    """The report as a W&B run summary plus a samples table."""
    import wandb

    default_wandb_mode()
    run_ = wandb.init(
        project="cdlm",
        job_type="eval",
        config={k: result[k] for k in ("model", "sampler", "batch_size", "seed", "environment")},
    )
    flat = {
        f"quality/{side}/{k}": v
        for side in ("samples", "reference")
        for k, v in result["quality"][side].items()
    }
    flat |= {f"speed/{k}": v["median"] for k, v in result["speed"]["steady"].items() if v}
    flat["val/bits_per_token"] = result["likelihood"]["bits_per_token"]
    run_.summary.update(flat)
    run_.log({"samples": wandb.Table(columns=["text"], data=[[t] for t in result["samples"]])})
    run_.finish()


def evaluate_checkpoint(cfg: DictConfig) -> None:
    if instantiate(cfg.metric).func is harness.evaluate_checkpoint:
        return full_report(cfg)
    model = load_checkpoint(cfg.ckpt, resolve_device(cfg.device))
    metric = instantiate(cfg.metric)
    fits = metric.func.processes  # each likelihood says which processes it scores
    require(
        model.process.kind in fits,
        f"metric={metric.func.__name__} scores {', '.join(fits)} models, not "
        f"{model.process.kind!r}; metric=report scores any model",
    )
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
    if sys.argv[1:2] == ["--compare"]:
        paths = sys.argv[2:]
        missing = [p for p in paths if not Path(p).is_file()]
        if not paths or missing:
            fail("cdlm-eval", f"--compare needs report files; not found: {missing or 'none given'}")
        print(compare_markdown(paths))
        return
    run("cdlm-eval", "eval", evaluate_checkpoint, validate)


if __name__ == "__main__":
    main()
