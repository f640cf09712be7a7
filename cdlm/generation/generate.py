"""The sampling driver shared by the CLI, evaluation and the training callbacks:
prior -> conditioned denoiser -> sampler -> rounding -> text."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch

from cdlm import rng
from cdlm.denoiser import mixing_passes
from cdlm.generation.plan import Generation, Plan, decode
from cdlm.model_file import Model
from cdlm.modes import eval_mode
from cdlm.processes.base import Fixed
from cdlm.samplers import check_compatible, make_grid  # the package: registers every sampler
from cdlm.samplers.base import Callback, SampleOutput


@torch.no_grad()
def generate(
    model: Model, sampler: Callable, plan: Plan, callback: Callback | None = None
) -> Generation:
    """Draws ``plan.num_samples`` sequences with ``sampler`` (a registered sampler or a Hydra
    partial of one); ``callback`` sees every step of every batch (``StepInfo``).

    The same seed gives the same samples: all randomness comes from one generator on the model's
    device (prompt guidance's blanks from a second one, ``rng.blanks_generator``, so that the
    sampling stream stays that of unguided sampling). NFE and positions count both passes of a guided call (classifier-free or
    self-conditioning guidance).
    """
    process, network = model.process, model.network
    check_compatible(sampler, process.kind)
    if plan.rounding == "nearest" and not process.continuous:
        raise ValueError("rounding=nearest applies to gaussian (embedding) models only")
    guidance = plan.guidance
    prompt_guided = guidance.guides_prompt(plan.prompted)
    if prompt_guided and process.sequential:
        raise ValueError(
            "prompt guidance needs a process whose network sees the whole canvas (masked, "
            "gaussian); the autoregressive baseline reads the prompt as its left context only"
        )
    device = next(network.parameters()).device
    generator = rng.generator(plan.seed, device)
    blanks = rng.blanks_generator(plan.seed, device) if prompt_guided else None
    timesteps = time_grid(model, plan, device)
    passes = guidance.passes(plan.prompted)
    samples, out, start, stats = [], None, time.perf_counter(), []
    with eval_mode(network):  # callbacks call this mid-training: no dropout, no annealing
        for first, n in plan.batches():
            x, denoiser = _conditioned(model, plan, first, n, device, generator, blanks)
            out = sampler(
                denoiser, x, timesteps, process=process, generator=generator, callback=callback
            )
            samples += [
                decode(model.tokenizer, row, plan.cut_at_eos)
                for row in sampled_ids(model, plan, out)
            ]
            stats.append(out.stats)
    positions = out.positions if out.positions is not None else out.nfe * plan.seq_len
    mean = {key: sum(s[key] for s in stats) / len(stats) for key in out.stats}
    wall = time.perf_counter() - start
    extra = self_cond_extra(plan, out.nfe)  # > 0 only where out.nfe > 1
    positions += positions * extra // out.nfe if extra else 0
    return Generation(samples, (out.nfe + extra) * passes, positions * passes, wall, mean)


def time_grid(model: Model, plan: Plan, device: torch.device) -> torch.Tensor:
    """The plan's decreasing grid of ``steps`` + 1 times, scaled by the edit strength."""
    process = model.process
    grid = make_grid(plan.grid, plan.steps, process.grid_schedule(), device, process.time_warp())
    return grid * plan.strength


def self_cond_extra(plan: Plan, nfe: int) -> int:
    """The second passes of self-conditioning guidance (``SelfCondGuided``): every call but the
    first, which has no estimate yet, runs cond and uncond when the scale is neither 0 nor 1."""
    return (mixing_passes(plan.denoising.get("self_cond_scale", 1.0)) - 1) * max(nfe - 1, 0)


def _conditioned(
    model: Model, plan: Plan, first: int, n: int, device: torch.device, generator, blanks
) -> tuple[torch.Tensor, Callable]:
    """The starting state of samples ``first`` to ``first + n`` and the denoiser that guides
    them and holds the layout's fixed regions."""
    process, layout = model.process, plan.layout
    x = process.prior((n, plan.seq_len), device, generator)
    fixed = where = blank = None
    if layout is not None:
        ids = torch.tensor(layout.ids, device=device).expand(n, -1)
        editable = torch.tensor(layout.editable, device=device).expand(n, -1)
        seeded = torch.tensor(layout.seeded, device=device).expand(n, -1)
        x = process.start(x, ids, editable, seeded, plan.strength, generator)
        fixed, where = Fixed(ids, editable), ~editable
        if blanks is not None:
            blank = process.prior((n, plan.seq_len), device, blanks)
    guide = partial(
        plan.guidance.wrap, batch=n, device=device, first=first, where=where, blank=blank
    )
    denoiser = process.conditioned_denoiser(
        model.network, guide=guide, fixed=fixed, generator=generator, **plan.denoising
    )
    return x, denoiser


def sampled_ids(model: Model, plan: Plan, out: SampleOutput) -> list[list[int]]:
    """The sampled ids: the sampler's tokens, or the nearest embeddings of its final state."""
    if plan.rounding == "argmax":
        return out.tokens.tolist()
    return model.process.embedding.nearest(out.x).tolist()
