"""What both Hydra entry points share: config lookup, up-front validation, one-line errors.

Hydra's own error output spans many lines; users get one line naming the problem instead. The
overrides are composed once before Hydra runs, so a bad key or option fails before any work (and
before any output file exists).
"""

from __future__ import annotations

import argparse
import netrc
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import hydra
from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, InstantiationException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cdlm import config_dir
from cdlm.model_file import ModelFileError, check_model_file

USAGE_ERROR = 2


class UsageError(ValueError):
    """Bad user input: reported as one line, exit status 2."""


def fail(prog: str, message: str) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(USAGE_ERROR)


def root_cause(e: BaseException) -> BaseException:
    """Hydra wraps errors raised in constructors; users need the innermost message."""
    while isinstance(e, InstantiationException) and e.__cause__ is not None:
        e = e.__cause__
    return e


def one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).split("\n")]
    lines = lines[
        : next((i for i, ln in enumerate(lines) if ln.startswith("Config search")), len(lines))
    ]
    return " ".join(ln for ln in lines if ln)


def _first_of_sweeps(overrides: list[str]) -> list[str]:
    """Multirun sweeps (a=1,2) become their first value, so one composition checks the keys."""
    out = []
    for text, o in zip(
        overrides, OverridesParser.create().parse_overrides(overrides), strict=False
    ):
        if o.is_sweep_override():
            first = next(iter(o.sweep_string_iterator()))
            text = f"{o.get_key_element()}={first}"
        out.append(text)
    return out


def _unknown_key_message(config_name: str, key: str, overrides: list[str]) -> str:
    """Lists the valid keys next to the unknown one, in the config the other overrides select."""
    others = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key.lstrip("+~")]
    # the others may hold a second unknown key: then the defaults alone list the options
    for attempt in (others, []):
        try:
            with initialize_config_dir(str(config_dir()), version_base="1.3"):
                base = compose(config_name, overrides=attempt)
            break
        except (HydraException, OmegaConfBaseException):
            continue
    else:
        return f"unknown config option {key!r}"
    *parents, leaf = key.lstrip("+~").split(".")
    node = OmegaConf.select(base, ".".join(parents)) if parents else base
    where = ".".join(parents) or "top level"
    if isinstance(node, DictConfig):
        return f"unknown config option {key!r}; options at {where}: {', '.join(map(str, node))}"
    return f"unknown config option {key!r}"


def compose_checked(config_name: str, overrides: list[str]) -> DictConfig:
    """Composes like Hydra would, turning every failure into a ``UsageError``."""
    try:
        overrides = _first_of_sweeps([o for o in overrides if not o.startswith("hydra")])
        with initialize_config_dir(str(config_dir()), version_base="1.3"):
            return compose(config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        text = str(e)
        if text.startswith("Could not override"):
            key = text.split("'")[1]
            raise UsageError(_unknown_key_message(config_name, key, overrides)) from None
        raise UsageError(one_line(text)) from None


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


def require(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)


def _bounds(at_least, above, at_most, below) -> str:
    """The allowed range as text: ``>= 1``, ``> 0``, ``in (0, 1]``."""
    if (at_least, above) != (None, None) and (at_most, below) != (None, None):
        opening = f"[{at_least}" if at_least is not None else f"({above}"
        closing = f"{at_most}]" if at_most is not None else f"{below})"
        return f"in {opening}, {closing}"
    for sign, bound in ((">=", at_least), (">", above), ("<=", at_most), ("<", below)):
        if bound is not None:
            return f"{sign} {bound}"
    return ""


def require_number(
    name: str,
    value: Any,
    *,
    integer: bool = False,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    nullable: bool = False,
    note: str = "",
) -> None:
    """A ``UsageError`` naming ``name`` unless ``value`` is a number in the given range.

    Hydra passes ``steps=abc`` through as the string ``'abc'``, and a comparison with it would
    raise a TypeError deep in validation, so the type is checked first. Booleans are not numbers
    here, and an integer option refuses floats (``steps=1.5``). ``note`` follows the range in the
    message, e.g. ``(or null for all)``.
    """
    if nullable and value is None:
        return
    bounds = _bounds(at_least, above, at_most, below)
    tail = " ".join(x for x in (bounds, note) if x)
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "an integer" if integer else "a number"
        raise UsageError(f"{name} must be {' '.join(x for x in (kind, tail) if x)}, got {value!r}")
    inside = (
        (at_least is None or value >= at_least)
        and (above is None or value > above)
        and (at_most is None or value <= at_most)
        and (below is None or value < below)
    )
    # NaN fails every comparison above, so it is refused wherever a bound is given
    if not inside:
        raise UsageError(f"{name} must be {tail}, got {value!r}")


def require_choice(name: str, value: Any, choices: Iterable[str]) -> None:
    """A ``UsageError`` listing the valid names unless ``value`` is one of them."""
    choices = list(choices)
    if not (isinstance(value, str) and value in choices):
        raise UsageError(f"unknown {name} {value!r}; valid: {', '.join(choices)}")


def require_bool(name: str, value: Any) -> None:
    """A ``UsageError`` unless ``value`` is true or false (``clamp=abc`` would count as true)."""
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be true or false, got {value!r}")


def require_model_file(path: Any) -> None:
    """A ``UsageError`` unless ``path`` can be a cdlm model file: found before Hydra starts, and
    before cdlm-eval loads its scorer."""
    try:
        check_model_file(path)
    except ModelFileError as e:
        raise UsageError(str(e)) from None


def unwritable(folder: str | Path) -> str | None:
    """Why files cannot be made in ``folder`` (or in the folders that would be created for it),
    or None. Tries a file: permission bits do not bind root, a read-only mount binds everyone."""
    existing = Path(folder).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        fd, tmp = tempfile.mkstemp(dir=existing, prefix=".cdlm-probe-")
    except OSError as e:
        return f"cannot write in {existing} ({e.strerror or e})"
    os.close(fd)
    os.unlink(tmp)
    return None


def require_output_file(name: str, value: Any) -> None:
    """A ``UsageError`` unless ``value`` (an ``out=`` file) can be written: its folder exists (a
    mistyped folder is refused, not silently created) and takes files. In a multirun a relative
    path lands in each job's own folder, which Hydra creates, so it is not checked."""
    if value is None:
        return
    path = Path(str(value))
    if not path.is_absolute() and hydra_args().multirun:
        return
    require(not path.is_dir(), f"{name}={value} is a folder; give a file name")
    require(path.parent.is_dir(), f"{name}={value}: the folder {path.parent} does not exist")
    problem = unwritable(path.parent)
    require(problem is None, f"{name}={value}: {problem}")
