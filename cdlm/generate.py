"""Sampling driver shared by the CLI and the training callbacks: prior -> sampler -> tokens -> text."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from cdlm import config_dir, rng
from cdlm.guidance import Guidance
from cdlm.regions import Layout
from cdlm.samplers import check_compatible, make_grid  # the package: registers every sampler
from cdlm.samplers.base import Callback

ROUNDINGS = ("argmax", "nearest")


@dataclass
class Sample:
    text: str
    token_ids: list[int]


@dataclass
class Generation:
    """samples; nfe: network evaluations per sequence; positions: sequence positions the network
    processed per sequence; wall_seconds: sampling time, all batches."""

    samples: list[Sample]
    nfe: int
    positions: int
    wall_seconds: float


def named_sampler(name: str, **options: Any) -> Callable:
    """The sampler of ``conf/sampler/<name>.yaml``, its options merged with ``options``."""
    return instantiate(
        OmegaConf.merge(OmegaConf.load(config_dir() / "sampler" / f"{name}.yaml"), options)
    )


def default_sampler(process: nn.Module) -> Callable:
    """The process's default sampler, built from its ``conf/sampler/<name>.yaml``."""
    return named_sampler(process.default_sampler)


DEFAULT_STEPS = 64


def sampling_defaults(
    process: nn.Module, config: dict, steps: int | None, sampler: Callable | None
) -> tuple[int, Callable, str | None]:
    """(steps, sampler, note) for what the user left unset (None): a distilled student's own
    step count and sampler (recorded in its model file), else 64 steps and the process's
    default sampler; ``note`` says when the student's record decided."""
    record = config.get("distillation")
    if record is None:
        return steps or DEFAULT_STEPS, sampler or default_sampler(process), None
    used = []
    if steps is None:
        steps = record["steps"]
        used.append(f"steps={steps}")
    if sampler is None:
        sampler = named_sampler(record["sampler"])
        used.append(f"sampler={record['sampler']}")
    note = None
    if used:
        note = (
            f"a {record['method']}-distilled student (round {record['round']}): using its "
            f"{', '.join(used)}; set them to override"
        )
    return steps, sampler, note


def decode(tokenizer, ids: list[int], cut_at_eos: bool = True) -> Sample:
    """Cuts at the first EOS (variable length), or with ``cut_at_eos=False`` keeps the whole
    canvas with every EOS written as a line break (packed training data puts EOS between
    paragraphs); special tokens are dropped from the text."""
    eos = tokenizer.eos_token_id
    if cut_at_eos:
        if eos in ids:
            ids = ids[: ids.index(eos)]
        return Sample(text=tokenizer.decode(ids, skip_special_tokens=True).strip(), token_ids=ids)
    pieces, start = [], 0
    for i, token in enumerate([*ids, eos]):
        if token == eos:
            pieces.append(tokenizer.decode(ids[start:i], skip_special_tokens=True).strip())
            start = i + 1
    return Sample(text="\n".join(p for p in pieces if p), token_ids=ids)


@torch.no_grad()
def generate(
    process: nn.Module,
    network: nn.Module,
    tokenizer,
    sampler: Callable,
    *,
    steps: int,
    num_samples: int,
    seq_len: int,
    seed: int = 0,
    batch_size: int | None = None,
    grid: str = "uniform",
    rounding: str = "argmax",
    clamp: bool = False,
    temperature: float = 1.0,
    cut_at_eos: bool = True,
    callback: Callback | None = None,
    guidance: Guidance | None = None,
    canvas: Layout | None = None,
    strength: float = 1.0,
) -> Generation:
    """Draws ``num_samples`` sequences of ``seq_len`` tokens in batches of ``batch_size``.

    The same seed gives the same samples: all randomness comes from one generator on the model's
    device. ``grid`` names a timestep grid (``cdlm.samplers.grids``). ``rounding``: ``argmax`` of
    the final logits, or the ``nearest`` embedding of the final
    state. ``clamp`` snaps every x0 estimate to its nearest token embedding (Diffusion-LM);
    ``temperature`` sharpens (< 1) the softmax behind each x0 estimate (gaussian only).
    ``guidance``: a label (or one per sample), the classifier-free guidance scale and what it
    guides on (the label, the prompt: the canvas's fixed regions, or both). ``canvas``: from
    ``cdlm.regions.build_layout``, ``seq_len`` positions: the process holds the non-editable ones
    fixed; ``strength`` < 1 starts the editable text spans from their ids noised (or masked) to
    t = strength (editing) instead of from the prior.
    """
    for name, value in (("steps", steps), ("num_samples", num_samples), ("seq_len", seq_len)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; valid: {', '.join(ROUNDINGS)}")
    if rounding == "nearest" and not hasattr(process, "embedding"):
        raise ValueError("rounding=nearest applies to gaussian (embedding) models only")
    if not 0.0 < strength <= 1.0:
        raise ValueError(f"edit strength must be in (0, 1], got {strength}")
    if canvas is not None and len(canvas.ids) != seq_len:
        raise ValueError(f"the canvas has {len(canvas.ids)} positions, seq_len is {seq_len}")
    check_compatible(sampler, process.kind)
    device = next(network.parameters()).device
    generator = rng.generator(seed, device)
    warp = getattr(getattr(process, "time_sampler", None), "quantile", None)
    schedule = getattr(process, "schedule", None)
    timesteps = make_grid(grid, steps, schedule, device, warp) * strength
    guidance = guidance or Guidance()
    prompted = canvas is not None and not all(canvas.editable)
    # w = 1 is the conditional model itself: nothing to guide, whatever the process
    prompt_guided = guidance.targets(prompted)[1] and guidance.scale != 1.0
    if prompt_guided and process.sequential:
        raise ValueError(
            "prompt guidance needs a process whose network sees the whole canvas (masked, "
            "gaussian); the autoregressive baseline reads the prompt as its left context only"
        )
    passes = guidance.passes(prompted)
    # the prompt's blank for prompt guidance comes from its own stream: the sampling stream
    # stays that of unguided sampling
    blanks = rng.generator(seed + 1, device) if prompt_guided else None
    batch_size = batch_size or num_samples
    samples, nfe, start = [], 0, time.perf_counter()
    was_training = network.training
    network.eval()  # callbacks may call this mid-training: no dropout, no attention annealing
    try:
        for first in range(0, num_samples, batch_size):
            n = min(batch_size, num_samples - first)
            x = process.prior((n, seq_len), device, generator)
            where = blank = None
            if canvas is not None:
                ids = torch.tensor(canvas.ids, device=device).expand(n, -1)
                editable = torch.tensor(canvas.editable, device=device).expand(n, -1)
                seeded = torch.tensor(canvas.seeded, device=device).expand(n, -1)
                x = process.start(x, ids, editable, seeded, strength, generator)
                where = ~editable
                if prompt_guided:
                    blank = process.prior((n, seq_len), device, blanks)
            condition = partial(
                guidance.wrap, batch=n, device=device, first=first, where=where, blank=blank
            )
            if canvas is not None:
                held = process.hold_fixed
                condition = partial(
                    _then, condition, partial(held, ids=ids, editable=editable, generator=generator)
                )
            denoiser = process.sampling_denoiser(
                network, clamp=clamp, condition=condition, temperature=temperature
            )
            out = sampler(
                denoiser, x, timesteps, process=process, generator=generator, callback=callback
            )
            ids = out.tokens if rounding == "argmax" else process.embedding.nearest(out.x)
            samples += [decode(tokenizer, row, cut_at_eos) for row in ids.tolist()]
            positions = out.positions if out.positions is not None else out.nfe * seq_len
            nfe, positions = out.nfe * passes, positions * passes
    finally:
        network.train(was_training)
    return Generation(samples, nfe, positions, wall_seconds=time.perf_counter() - start)


def _then(first: Callable, second: Callable, denoiser):
    """second(first(denoiser)): guidance, then the fixed-region hold around it."""
    return second(first(denoiser))
