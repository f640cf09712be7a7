"""Choosing a sampler: by name, the process's default, a distilled student's recorded choice,
and the options a caller may add (a KV cache, a temperature); what a chosen sampler implies for
scoring."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hydra.utils import instantiate
from omegaconf import OmegaConf

from cdlm import config_dir
from cdlm.generation.plan import DEFAULT_STEPS
from cdlm.samplers.base import sampler_name, unwrapped


@dataclass(frozen=True)
class Choice:
    """A sampler (a Hydra partial of a registered sampler), its step count, and ``note``: which
    of them a distilled student's record decided (None when the caller or the defaults did)."""

    sampler: Callable
    steps: int
    note: str | None = None

    @property
    def name(self) -> str:
        return sampler_name(self.sampler)

    @property
    def options(self) -> dict[str, Any]:
        """The options the sampler was given (its partial's keywords), as a report can store
        them (JSON): a step function by its name and options, a cache by its class and fields."""
        return {k: _recorded(v) for k, v in getattr(self.sampler, "keywords", {}).items()}


def _recorded(value: Any) -> Any:
    """``value`` in JSON's types: numbers, strings, lists and dicts as they are; a partial as its
    function's path and keywords; a dataclass as its class's path and fields."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_recorded(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _recorded(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value):
        kind = type(value)
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"_target_": f"{kind.__module__}.{kind.__qualname__}"} | _recorded(fields)
    fn = unwrapped(value)
    if hasattr(fn, "__qualname__"):
        keywords = dict(getattr(value, "keywords", {}))
        return {"_target_": f"{fn.__module__}.{fn.__qualname__}"} | _recorded(keywords)
    return repr(value)


def named_sampler(name: str, **options: Any) -> Callable:
    """The sampler of ``conf/sampler/<name>.yaml``, its options merged with ``options``."""
    return instantiate(
        OmegaConf.merge(OmegaConf.load(config_dir() / "sampler" / f"{name}.yaml"), options)
    )


def default_sampler(process) -> Callable:
    """The process's default sampler, built from its ``conf/sampler/<name>.yaml``."""
    return named_sampler(process.default_sampler)


def choose(process, config: dict, steps: int | None, sampler: Callable | None) -> Choice:
    """Fills in what the caller left unset (None): a distilled student's own step count and
    sampler (recorded in its model file's ``config``), else 64 steps and the process's default
    sampler."""
    record = config.get("distillation")
    if record is None:
        return Choice(sampler or default_sampler(process), steps or DEFAULT_STEPS)
    used = []
    if steps is None:
        steps = record["steps"]
        used.append(f"steps={steps}")
    if sampler is None:
        options = record.get("sampler_options", {})  # e.g. a block student's steps per block
        sampler = named_sampler(record["sampler"], **options)
        used.append(f"sampler={record['sampler']}")
        used += [f"sampler.{k}={v}" for k, v in options.items()]
    note = None
    if used:
        note = (
            f"a {record['method']}-distilled student (round {record['round']}): using its "
            f"{', '.join(used)}; set them to override"
        )
    return Choice(sampler, steps, note)


def with_cache(sampler: Callable, cache: Any) -> Callable:
    """``sampler`` with the KV cache ``cache`` (a ``cdlm.samplers.blockwise.BlockCache``, or None:
    no cache); a clean error where the sampler has no such choice."""
    fn = unwrapped(sampler)
    if "cache" not in inspect.signature(fn).parameters:
        raise ValueError(
            f"cache= applies to block diffusion (sampler=block) and to masked samplers with "
            f"sampler.block_length; sampler {sampler_name(sampler)!r} has no such choice (the AR "
            "sampler always keeps its exact KV cache: sampler.use_cache)"
        )
    keywords = dict(getattr(sampler, "keywords", {})) | {"cache": cache}
    return functools.partial(fn, *getattr(sampler, "args", ()), **keywords)


def with_temperature(sampler: Callable, temperature: float) -> Callable:
    """``sampler`` drawing at ``temperature``: its step rule's (masked and block samplers:
    ``rule.temperature``), else its own (AR, uniform-state, speculative, a gaussian sampler's
    token draws); a clean error for a sampler that draws nothing (the gaussian ODE solvers,
    whose temperature is the x0 softmax's: ``Plan.denoising``)."""
    fn = unwrapped(sampler)
    params = inspect.signature(fn).parameters
    keywords = dict(getattr(sampler, "keywords", {}))
    rule = keywords.get("rule", params["rule"].default if "rule" in params else None)
    if rule is not None and "temperature" in {f.name for f in dataclasses.fields(rule)}:
        keywords["rule"] = dataclasses.replace(rule, temperature=temperature)
    elif "temperature" in params:
        keywords["temperature"] = temperature
    else:
        raise ValueError(
            f"sampler {sampler_name(sampler)!r} draws no tokens, so it has no temperature; "
            "choose one that draws (e.g. ancestral, ar, duo_ancestral)"
        )
    return functools.partial(fn, *getattr(sampler, "args", ()), **keywords)


def stops_at_eos(sampler: Callable, block_size: int | None = None) -> bool:
    """Whether ``sampler`` ends a sequence at its first EOS and pads the rest with EOS: its
    ``stop_at_eos`` option (given, else its default) where it decodes in blocks, which a masked
    sampler does with ``block_length`` set or on a block model (its ``block_size``; one block
    has nothing after it to pad)."""
    params = inspect.signature(unwrapped(sampler)).parameters
    given = getattr(sampler, "keywords", {})

    def option(name: str) -> Any:
        param = params.get(name)
        return given.get(name, param.default if param is not None else None)

    blocked = (
        "block_length" not in params or option("block_length") is not None or block_size is not None
    )
    return bool(option("stop_at_eos")) and blocked


def check_whole_canvases(
    sampler: Callable, cut_at_eos: bool, block_size: int | None = None
) -> None:
    """Refuses ``cut_at_eos=False`` (score whole canvases) with a sampler that pads after EOS:
    the padding would be scored as text (measured on an AR model: 4.48 bits of token entropy and
    54% repeated 4-grams for samples that were fine)."""
    if not cut_at_eos and stops_at_eos(sampler, block_size):
        raise ValueError(
            f"cut_at_eos=false scores whole canvases, but sampler {sampler_name(sampler)} stops "
            "at the first EOS and pads the rest with EOS, which would be scored as text; give "
            "sampler.stop_at_eos=false (fill whole canvases) or cut_at_eos=true"
        )
