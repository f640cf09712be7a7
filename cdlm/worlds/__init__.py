"""Exact worlds: languages whose likelihood, entropy and posteriors are known exactly, named by
the files of conf/world/ (``world:<name>`` wherever a checkpoint or data set is expected;
docs/guide/worlds.md). A world's options (its conf file's keys: ``path``, ``length``, ``top_k`` ...)
reach every command as ``world_options`` (``data.world_options`` in training)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import OmegaConf

from cdlm import config_dir
from cdlm.worlds.base import ImpossibleObservation, World

PREFIX = "world:"

__all__ = [
    "PREFIX",
    "ImpossibleObservation",
    "World",
    "is_world",
    "load",
    "names",
    "option_names",
    "options",
    "options_set",
    "recorded",
]


def names() -> list[str]:
    """The worlds conf/world/ defines."""
    return sorted(p.stem for p in (config_dir() / "world").glob("*.yaml"))


def is_world(spec: object) -> bool:
    """Whether ``spec`` names a world (``world:<name>``) rather than a model or data path."""
    return isinstance(spec, str) and spec.startswith(PREFIX)


def _name(spec: str) -> str:
    name = spec[len(PREFIX) :] if is_world(spec) else spec
    if name not in names():
        raise ValueError(f"unknown world {name!r}; valid: {', '.join(names())} (conf/world/)")
    return name


def option_names(spec: str) -> list[str]:
    """The options ``spec``'s conf file declares (its keys but ``_target_``)."""
    cfg = OmegaConf.load(config_dir() / "world" / f"{_name(spec)}.yaml")
    return [k for k in cfg if k != "_target_"]


def options(spec: str, given: Any = None) -> dict[str, Any]:
    """``given`` (a mapping, or a config node) as the options of world ``spec``: unset (None)
    ones dropped, so the conf file's value stands; ``path`` made absolute, so a model that records
    them (``config["world_options"]``) rebuilds its world from any folder. A one-line ValueError
    names an option the world does not have."""
    given = OmegaConf.to_container(given, resolve=True) if OmegaConf.is_config(given) else given
    out = {k: v for k, v in (given or {}).items() if v is not None}
    valid = option_names(spec)
    for key in out:
        if key not in valid:
            raise ValueError(
                f"world {spec} has no option {key!r}; valid: {', '.join(valid)} (conf/world/)"
            )
    if "path" in out:
        out["path"] = str(Path(str(out["path"])).expanduser().resolve())
    return out


def options_set(given: Any) -> bool:
    """Whether ``given`` (a mapping or config node, e.g. the commands' ``world_options``) sets
    any option."""
    given = OmegaConf.to_container(given, resolve=True) if OmegaConf.is_config(given) else given
    return any(v is not None for v in (given or {}).values())


def load(spec: str, **overrides: Any) -> World:
    """The world ``world:<name>`` (or ``<name>``) of conf/world/, with ``overrides`` of its
    options (e.g. ``length=256``, ``path=corpus.txt``). Built once per process, name and options
    (fitting reads a corpus); a corpus file that changed since is read again."""
    name, given = _name(spec), options(spec, overrides)
    path = given.get("path")
    stamp = os.stat(path).st_mtime_ns if path and os.path.isfile(path) else None
    return _build(name, tuple(sorted(given.items())), stamp)


def recorded(config: dict) -> World:
    """The world a model's ``config`` records (``world``, with its ``world_options``)."""
    return load(config["world"], **(config.get("world_options") or {}))


@lru_cache(maxsize=8)
def _build(name: str, given: tuple[tuple[str, Any], ...], stamp: int | None) -> World:
    """The world ``name`` with options ``given``; ``stamp``: the corpus file's modification time,
    part of the cache key only."""
    cfg = OmegaConf.load(config_dir() / "world" / f"{name}.yaml")
    world = instantiate(cfg, **dict(given))
    world.name, world.options = name, dict(given)
    return world
