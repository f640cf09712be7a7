"""``cdlm-train``: check the config, claim the run folder, build the run (``cdlm.run.build``) and
fit it; SIGTERM ends the fit between two steps with exit status 143 (docs/guide/reliability.md)."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from cdlm.cli.common import default_wandb_mode, hydra_args, run
from cdlm.data.datamodule import FORMATS
from cdlm.run import record
from cdlm.run.build import setup
from cdlm.run.folder import claim, discard_if_unused, hold, resume_point
from cdlm.training.guard import Diverged
from cdlm.training.lr_schedules import parse_duration
from cdlm.training.peers import PeerLost, peer_loss_named
from cdlm.training.resume import SIGTERM_STATUS, is_whole_checkpoint, report_sigterm
from cdlm.validation import (
    COUNT,
    FLAG,
    FRACTION,
    POSITIVE,
    SEED,
    Choice,
    Number,
    UsageError,
    check,
    require,
    require_model_file,
)

NO_LIMIT = "(or -1 for no limit)"
RULES = {
    "seed": SEED,
    "data.seq_len": Number(integer=True, at_least=2),
    "data.batch_size": COUNT,
    "data.vocab_size": COUNT,
    "data.val_fraction": FRACTION,
    "data.packing": FLAG,
    "data.streaming": FLAG,
    "data.format": Choice(FORMATS),
    "condition.dropout": Number(at_least=0, at_most=1),
    "condition.labels": FLAG,
    "condition.prompt_dropout": Number(at_least=0, at_most=1),
    "trainer.max_steps": Number(integer=True, nullable=True, note=NO_LIMIT),
    "optimizer.lr": POSITIVE,
    "phases.ar": Number(at_least=0, below=1),
    "phases.anneal": Number(at_least=0, at_most=1),
    # the reliability options (conf/callbacks/default.yaml), where those callbacks are on
    "callbacks.checkpoint.every_n_train_steps": Number(integer=True, at_least=1, nullable=True),
    "callbacks.checkpoint.every_minutes": Number(above=0, nullable=True),
    "callbacks.guard.max_consecutive": COUNT,
}


def _given(overrides: list[str] | None, key: str) -> bool:
    """Whether the command line chose ``key`` (a group or a value)."""
    return any(o.split("=", 1)[0].lstrip("+~") == key for o in overrides or [])


def validate(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """Every option's type and range, and the files it names, before any work."""
    check(cfg, RULES)
    steps = cfg.trainer.max_steps
    require(
        steps in (None, -1) or steps >= 1, f"trainer.max_steps must be >= 1 {NO_LIMIT}, got {steps}"
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
        POSITIVE.check("trainer.val_check_interval", every)
    ar, anneal = cfg.phases.ar, cfg.phases.anneal
    require(
        ar + anneal <= 1.0,
        f"phases.ar and phases.anneal are shares of the budget (ar < 1, ar + anneal <= 1), got "
        f"ar={ar}, anneal={anneal}",
    )
    rows_with_prompts = cfg.data.get("format") == "pairs" or bool(cfg.data.get("prompt_rate"))
    require(
        not cfg.condition.prompt_dropout or rows_with_prompts,
        "condition.prompt_dropout applies to rows with prompts (data.format=pairs, or a world's "
        "data.prompt_rate > 0)",
    )
    validate_files(cfg)
    # Each process reads the schedule group that fits it; a choice it ignores is a mistake.
    uses = OmegaConf.to_container(cfg.process).get("schedule")
    for group in ("schedule", "mask_schedule"):
        require(
            not (_given(overrides, group) and uses != f"${{{group}}}"),
            f"{group}= does not apply to process={cfg.process._target_.rsplit('.', 1)[-1]}; "
            f"it reads {uses.strip('${}') if isinstance(uses, str) else 'no schedule'}=",
        )


def validate_files(cfg: DictConfig) -> None:
    """resume= is auto or a whole Lightning checkpoint; init_from= and teacher= are model files."""
    for key in ("init_from", "teacher"):
        if cfg.get(key):
            require_model_file(cfg[key], base_ok=key == "init_from")
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


def validate_module(cfg: DictConfig) -> None:
    """A distillation module needs a teacher, and only a distillation module takes one."""
    needs_teacher = getattr(instantiate(cfg.module, _partial_=True).func, "needs_teacher", False)
    require(
        needs_teacher == bool(cfg.get("teacher")),
        f"module={HydraConfig.get().runtime.choices.get('module')} "
        + ("needs teacher=PATH (a model.safetensors)" if needs_teacher else "takes no teacher=")
        + "; distillation modules (module=distill_progressive|distill_consistency|distill_sdtt"
        "|distill_dcd) take one, module=diffusion does not",
    )


def train(cfg: DictConfig) -> None:
    folder = Path(HydraConfig.get().runtime.output_dir)
    with hold(folder):  # held since main() when the folder was known up front
        if cfg.resume == "auto" and (done := record.finished(folder)) is not None:
            print(
                f"cdlm-train: resume=auto: {folder} holds this run, finished ({done.steps} steps); skipped"
            )
            return  # a rerun of a study skips what finished; other overrides resume as before
        with discard_if_unused(folder):
            validate_module(cfg)
            default_wandb_mode()
            training = setup(cfg)
            print(f"cdlm-train: {training.describe()}, output {folder}")
        resume = resume_point(cfg, folder)
        if (found := resume.describe()) is not None:
            print(f"cdlm-train: {found}")
        try:
            with record.measured(record.launcher_jobs()) as cost, peer_loss_named(training.trainer):
                training.trainer.fit(
                    training.module, datamodule=training.data, ckpt_path=resume.ckpt
                )
        except (Diverged, PeerLost) as e:  # not bad input: exit status 1
            print(f"cdlm-train: error: {e}", file=sys.stderr)
            sys.exit(1)
        except SIGTERMException:
            report_sigterm(training.trainer)
            sys.exit(SIGTERM_STATUS)
        if training.trainer.is_global_zero and not training.trainer.interrupted:
            steps = training.trainer.global_step
            record.write(folder, record.of_this_job("cdlm-train", cost, steps))


def main() -> None:
    with ExitStack() as locks:

        def checked(cfg: DictConfig, overrides: list[str]) -> None:
            validate(cfg, overrides)
            args = hydra_args()
            if not (args.multirun or args.cfg or args.info or args.help):  # no run folder made
                claim(overrides, locks)

        run("cdlm-train", "train", train, checked)


if __name__ == "__main__":
    main()
