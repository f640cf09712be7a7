"""Options checked before any work, each refused in one line that names the key, what it takes and
the value given (docs/guide/reliability.md).

An entry point lists its options as a table of rules (key -> ``Number``, ``Choice`` or ``Flag``)
and checks it with ``check``; a rule between keys stays a ``require`` beside the table. Hydra
passes ``steps=abc`` on as the string ``'abc'``, so every rule checks the type before the range.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cdlm import pretrained, worlds
from cdlm.model_file import check_model_file


class UsageError(ValueError):
    """Bad user input: reported as one line, exit status 2."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)


@dataclass(frozen=True)
class Number:
    """A number in a range. Booleans are not numbers here, and an ``integer`` refuses floats
    (``steps=1.5``); NaN fails every bound. ``note`` follows the range in the message, e.g.
    ``(or null for all)``."""

    integer: bool = False
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None
    nullable: bool = False
    note: str = ""

    def bounds(self) -> str:
        """The allowed range as text: ``>= 1``, ``> 0``, ``in (0, 1]``."""
        low, high = (self.at_least, self.above), (self.at_most, self.below)
        if low != (None, None) and high != (None, None):
            opening = f"[{self.at_least}" if self.at_least is not None else f"({self.above}"
            closing = f"{self.at_most}]" if self.at_most is not None else f"{self.below})"
            return f"in {opening}, {closing}"
        signs = zip((">=", ">", "<=", "<"), (*low, *high), strict=True)
        return next((f"{sign} {bound}" for sign, bound in signs if bound is not None), "")

    def check(self, name: str, value: Any) -> None:
        if self.nullable and value is None:
            return
        tail = " ".join(x for x in (self.bounds(), self.note) if x)
        kinds = (int,) if self.integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            kind = "an integer" if self.integer else "a number"
            raise UsageError(
                f"{name} must be {' '.join(x for x in (kind, tail) if x)}, got {value!r}"
            )
        inside = (
            (self.at_least is None or value >= self.at_least)
            and (self.above is None or value > self.above)
            and (self.at_most is None or value <= self.at_most)
            and (self.below is None or value < self.below)
        )
        require(inside, f"{name} must be {tail}, got {value!r}")


@dataclass(frozen=True)
class Choice:
    """One of a list of names; the message lists them."""

    choices: Iterable[str]
    nullable: bool = False

    def check(self, name: str, value: Any) -> None:
        choices = list(self.choices)
        valid = (isinstance(value, str) and value in choices) or (self.nullable and value is None)
        listed = ", ".join(choices) + (" (or null)" if self.nullable else "")
        require(valid, f"unknown {name} {value!r}; valid: {listed}")


@dataclass(frozen=True)
class Flag:
    """True or false: ``clamp=abc`` would otherwise count as true."""

    def check(self, name: str, value: Any) -> None:
        require(isinstance(value, bool), f"{name} must be true or false, got {value!r}")


Rule = Number | Choice | Flag
COUNT = Number(integer=True, at_least=1)
OPTIONAL_COUNT = Number(integer=True, at_least=1, nullable=True)
SEED = Number(integer=True)
POSITIVE = Number(above=0)
FRACTION = Number(above=0, below=1)
FLAG = Flag()
SCALE = Number(at_least=0, note="(0: unconditional, 1: conditional)")  # guidance.scale
_ABSENT = object()


def check(cfg: DictConfig, rules: Mapping[str, Rule]) -> None:
    """Each rule on its key's value, in the table's order. A key the config lacks is skipped: an
    option of one choice only (``metric.rtol``), or of a callback that is off."""
    for key, rule in rules.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is not _ABSENT:
            rule.check(key, value)


def require_world_options(ckpt: Any, options: Any) -> None:
    """``world_options`` name options the world of ``ckpt=world:<name>`` has, and are given
    only with one (a model trained on a world records its own)."""
    try:
        if worlds.is_world(ckpt):
            worlds.options(ckpt, options)
        else:
            require(
                not worlds.options_set(options),
                "world_options apply to ckpt=world:<name> (a model trained on a world records "
                "its own)",
            )
    except ValueError as e:
        raise UsageError(str(e)) from None


def require_model_file(path: Any, base_ok: bool = False, process: Any = None) -> None:
    """A ``UsageError`` unless ``path`` can be a cdlm model file (or, with ``base_ok``, names a
    pretrained causal LM that exists: ``cdlm.pretrained``; or a world, given a ``process``):
    found before Hydra starts, and before cdlm-eval loads its scorer."""
    world = worlds.is_world(path)
    require(
        world == (process is not None),
        f"ckpt={path} needs process=masked|block|gaussian|autoregressive"
        if world
        else "process= applies to ckpt=world:<name> (a model file carries its own process)",
    )
    if world:
        name = str(path)[len(worlds.PREFIX) :]
        require(
            name in worlds.names(), f"unknown world {name!r}; valid: {', '.join(worlds.names())}"
        )
        return
    try:
        if base_ok and pretrained.is_base(path):
            pretrained.resolve(path)
            return
        check_model_file(path)
    except ValueError as e:  # a ModelFileError among them
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


def require_output_file(name: str, value: Any, *, per_job: bool = False) -> None:
    """A ``UsageError`` unless ``value`` (an ``out=`` file) can be written: its folder exists (a
    mistyped folder is refused, not silently created) and takes files. With ``per_job`` (a
    multirun) a relative path lands in each job's own folder, which Hydra creates: not checked."""
    if value is None:
        return
    path = Path(str(value))
    if not path.is_absolute() and per_job:
        return
    require(not path.is_dir(), f"{name}={value} is a folder; give a file name")
    require(path.parent.is_dir(), f"{name}={value}: the folder {path.parent} does not exist")
    problem = unwritable(path.parent)
    require(problem is None, f"{name}={value}: {problem}")
