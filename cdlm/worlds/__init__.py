"""Exact worlds: languages whose likelihood, entropy and posteriors are known exactly, named by
the files of conf/world/ (``world:<name>`` wherever a checkpoint or data set is expected;
docs/guide/worlds.md)."""

from __future__ import annotations

from functools import lru_cache

from hydra.utils import instantiate
from omegaconf import OmegaConf

from cdlm import config_dir
from cdlm.worlds.base import ImpossibleObservation, World

PREFIX = "world:"

__all__ = ["PREFIX", "ImpossibleObservation", "World", "is_world", "load", "names"]


def names() -> list[str]:
    """The worlds conf/world/ defines."""
    return sorted(p.stem for p in (config_dir() / "world").glob("*.yaml"))


def is_world(spec: object) -> bool:
    """Whether ``spec`` names a world (``world:<name>``) rather than a model or data path."""
    return isinstance(spec, str) and spec.startswith(PREFIX)


@lru_cache(maxsize=8)
def load(spec: str, **overrides) -> World:
    """The world ``world:<name>`` (or ``<name>``) of conf/world/, with ``overrides`` of its
    options (e.g. ``length=256``). Built once per process and options (fitting reads a corpus)."""
    name = spec[len(PREFIX) :] if is_world(spec) else spec
    if name not in names():
        raise ValueError(f"unknown world {name!r}; valid: {', '.join(names())} (conf/world/)")
    cfg = OmegaConf.load(config_dir() / "world" / f"{name}.yaml")
    return instantiate(cfg, **overrides)
