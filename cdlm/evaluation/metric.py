"""What ``cdlm-eval`` hands every metric and task, and what one hands back.

The model is loaded and its sampler chosen once (``load``); each ``conf/metric/*.yaml`` builds
a callable of the one ``Metric`` signature (a task of ``conf/task/*.yaml`` is measured by
``cdlm.tasks.suite.measure`` bound to it, of the same signature), which gets that and the
command's options, and returns a ``Measured`` that the command writes the same way for all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from omegaconf import DictConfig

from cdlm.evaluation.quality import Scorer, load_scorer
from cdlm.generation import Choice, Plan, Sample, choose, generate
from cdlm.model_file import Model, load_model


@dataclass(frozen=True)
class Loaded:
    """The model under evaluation and the sampler chosen for it (``choose``: the caller's, a
    distilled student's own, or the process's default), with its load time kept apart."""

    ckpt: str
    model: Model
    choice: Choice
    device: torch.device
    load_seconds: float


@dataclass(frozen=True)
class Measured:
    """A metric's report: ``name`` places it (``report``: eval.json, else eval_<name>.json),
    ``result`` is the JSON, ``summary`` is printed (and written beside the JSON as .md when
    ``markdown``), ``card`` holds the figures for a model folder's card, and ``log`` sends the
    report to W&B (``wandb=true``)."""

    name: str
    result: dict
    summary: str
    markdown: bool = False
    card: dict | None = None
    log: Callable[[], None] | None = None


class Metric(Protocol):
    """The one signature of ``cdlm-eval``'s metrics and tasks: ``cfg`` is the command's whole
    config (conf/eval.yaml), from which each reads the options it documents there."""

    def __call__(self, loaded: Loaded, cfg: DictConfig) -> Measured: ...


def load(
    ckpt: str,
    device: torch.device,
    steps: int | None,
    sampler: Callable | None,
    model_options: dict | None = None,
) -> Loaded:
    """The model at ``ckpt`` (``model_options``: ``load_model``'s keywords, a world oracle's
    process) with ``sampler`` and ``steps`` filled in by ``choose``."""
    start = time.perf_counter()
    model = load_model(ckpt, device, **(model_options or {}))
    seconds = time.perf_counter() - start
    choice = choose(model.process, model.config, steps, sampler)
    return Loaded(str(ckpt), model, choice, device, seconds)


def scorer_of(name: str, device: torch.device) -> Scorer | None:
    """The gen-PPL scorer a ``scorer=`` value names: ``default``, an HF causal LM, or none."""
    return None if name == "none" else load_scorer(None if name == "default" else name, device)


def draw(
    loaded: Loaded,
    cfg: DictConfig,
    seed: int,
    sampler: Callable | None = None,
    temperature: float | None = None,
) -> list[Sample]:
    """``cfg.num_samples`` samples of ``seed`` with the chosen sampler (or ``sampler``) and
    steps on ``cfg.grid``, cut at EOS or whole canvases as ``cfg.cut_at_eos`` says (as the
    report draws them, untimed); ``temperature``: the gaussian x0 softmax temperature (None:
    ``cfg.temperature``)."""
    plan = Plan(
        num_samples=cfg.num_samples,
        seq_len=loaded.model.config["seq_len"],
        steps=loaded.choice.steps,
        seed=seed,
        grid=cfg.grid,
        denoising={"temperature": cfg.temperature if temperature is None else temperature},
        cut_at_eos=cfg.cut_at_eos,
    )
    return generate(loaded.model, sampler or loaded.choice.sampler, plan).samples
