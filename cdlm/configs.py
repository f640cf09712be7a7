"""The Hydra configs of conf/, composed as the commands compose them, with one-line errors.

Hydra's own error output spans many lines; users get one line naming the problem instead. The
commands compose the overrides once before Hydra runs, so a bad key or option fails before any
work (and before any output file exists).
"""

from __future__ import annotations

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cdlm import config_dir
from cdlm.validation import UsageError


def compose(config_name: str, overrides: list[str], *, hydra: bool = False) -> DictConfig:
    """``conf/<config_name>.yaml`` with ``overrides``; ``hydra``: with the ``hydra`` node (the
    run folder, the job name)."""
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        return hydra_compose(config_name, overrides=overrides, return_hydra_config=hydra)


def one_line(text: str) -> str:
    """An error message on one line, without Hydra's list of config search paths."""
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
            base = compose(config_name, attempt)
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
    """Composes like Hydra would (``hydra.*`` overrides left to Hydra), turning every failure
    into a ``UsageError``."""
    try:
        overrides = _first_of_sweeps([o for o in overrides if not o.startswith("hydra")])
        return compose(config_name, overrides)
    except (HydraException, OmegaConfBaseException) as e:
        text = str(e)
        if text.startswith("Could not override"):
            key = text.split("'")[1]
            raise UsageError(_unknown_key_message(config_name, key, overrides)) from None
        raise UsageError(one_line(text)) from None
