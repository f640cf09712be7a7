"""What the Hydra entry points share: the command line, up-front validation, one-line errors.

The overrides are composed and checked once before Hydra runs (``cdlm.configs``,
``cdlm.validation``), so a bad key or option fails before any work (and before any output file
exists); errors inside the run are reported in one line too.
"""

from __future__ import annotations

import argparse
import netrc
import os
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
import torch
from hydra._internal.utils import get_args_parser
from hydra.errors import InstantiationException
from omegaconf import DictConfig

from cdlm import config_dir
from cdlm.configs import compose_checked, one_line
from cdlm.validation import (
    UsageError,
    require,
    require_model_file,
    require_output_file,
    require_world_options,
)

USAGE_ERROR = 2


def fail(prog: str, message: str) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(USAGE_ERROR)


def root_cause(e: BaseException) -> BaseException:
    """Hydra wraps errors raised in constructors; users need the innermost message."""
    while isinstance(e, InstantiationException) and e.__cause__ is not None:
        e = e.__cause__
    return e


def default_wandb_mode() -> None:
    """W&B runs offline unless the user has a key: never a login prompt, never a crash."""
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return
    try:
        has_login = netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        has_login = False
    if not has_login:
        os.environ["WANDB_MODE"] = "offline"


def hydra_args() -> argparse.Namespace:
    """The command line as ``@hydra.main`` parses it (its own parser): the overrides, and flags
    such as ``-m``, ``--cfg job`` (whose value is not an override) and ``--info``."""
    return get_args_parser().parse_args(sys.argv[1:])


def run(
    prog: str,
    config_name: str,
    task: Callable[[DictConfig], None],
    validate: Callable[[DictConfig, list[str]], None],
) -> None:
    """Validates the command line, then hands it to ``@hydra.main`` (so -m sweeps work).

    ``validate`` gets the composed config and the overrides as typed, so it can tell an option
    the user set from one a config group's default set.
    """
    overrides = hydra_args().overrides
    try:
        validate(compose_checked(config_name, overrides), overrides)
    except UsageError as e:
        fail(prog, str(e))

    def guarded(cfg: DictConfig) -> None:
        try:
            task(cfg)
        except (ValueError, FileNotFoundError, InstantiationException) as e:
            if os.environ.get("CDLM_DEBUG"):
                raise
            fail(prog, one_line(str(root_cause(e))))

    hydra.main(config_path=str(config_dir()), config_name=config_name, version_base="1.3")(
        guarded
    )()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(name)
    except (RuntimeError, TypeError):
        raise UsageError(
            f"unknown device {name!r}; valid: auto, cpu, cuda, cuda:N (or any torch device)"
        ) from None


def validate_model_and_output(cfg: DictConfig) -> None:
    """``ckpt``, ``out`` (where the command has one) and ``device`` of cdlm-sample, cdlm-eval
    and cdlm-serve; the model file is checked last, so that every other mistake is named before
    a missing file."""
    require(
        cfg.ckpt is not None,
        "ckpt=PATH is required (a cdlm-train run folder, a model folder, its model.safetensors, "
        "or a Hugging Face Hub id)",
    )
    out = cfg.get("out")
    relative = out is not None and not Path(str(out)).is_absolute()
    # in a multirun a relative out= lands in each job's folder, which Hydra makes
    require_output_file("out", out, per_job=relative and hydra_args().multirun)
    resolve_device(cfg.device)
    require_model_file(cfg.ckpt, base_ok=True, process=cfg.get("process"))
    require_world_options(cfg.ckpt, cfg.get("world_options"))


def model_options(cfg: DictConfig) -> dict:
    """``load_model``'s options for ``ckpt=world:<name>`` (a world's oracle): its process,
    embedding table and world options; None for a model file, which carries its own."""
    keys = ("process", "embedding", "world_options")
    return {k: cfg.get(k) for k in keys}
