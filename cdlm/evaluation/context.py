"""Does a diffusion model use context? Its token accuracy/CE at fixed noise levels beside the
no-context readout at the same noise draw (the token's own noisy observation plus the unigram
prior; see ``process.evaluate_at``). Low-noise accuracy alone says nothing for embedding
diffusion: the own embedding gives the token away there."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cdlm.evaluation.levels import level_metrics
from cdlm.model_file import Model
from cdlm.rng import generator as generator_for


@torch.no_grad()
def context_use(
    model: Model,
    tokens: torch.Tensor,
    log_prior: torch.Tensor,
    times: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9),
    batch_size: int = 32,
    seed: int = 0,
    transition: torch.Tensor | None = None,
) -> list[dict]:
    """Per noise level t: model and no-context accuracy and CE (nats) over ``tokens`` (N, L),
    and their ratio ``context_gain`` = accuracy / no-context accuracy; with a bigram
    ``transition`` (``cdlm.evaluation.oracle``), also the exact bigram denoiser's
    (``oracle_acc``, ``oracle_ce``, ``oracle_gain``): what context can add at that level."""
    device = next(model.network.parameters()).device
    denoiser = model.process.make_denoiser(model.network)
    rows = []
    for t in times:
        generator = generator_for(seed, device)
        sums = {"acc": 0.0, "base_acc": 0.0, "ce": 0.0, "base_ce": 0.0}
        if transition is not None:
            sums |= {"oracle_acc": 0.0, "oracle_ce": 0.0}
        count = 0
        for batch in tokens.split(batch_size):
            ev = model.process.evaluate_at(denoiser, batch.to(device), t, generator)
            m = level_metrics(
                ev, log_prior.to(device), None if transition is None else transition.to(device)
            )
            values = {
                "acc": m.acc,
                "base_acc": m.baseline_acc,
                "ce": m.ce,
                "base_ce": m.baseline_ce,
                "oracle_acc": m.oracle_acc,
                "oracle_ce": m.oracle_ce,
            }
            for key in sums:
                value = values[key]
                sums[key] += float(value) * m.count  # weighted by positions scored
            count += m.count
        means = {key: total / max(count, 1) for key, total in sums.items()}
        base = max(means["base_acc"], 1e-9)
        row = {"t": t, **means, "positions": count, "context_gain": means["acc"] / base}
        if transition is not None:
            row["oracle_gain"] = means["oracle_acc"] / base
        rows.append(row)
    return rows


@torch.no_grad()
def context_ceiling(
    model: Model,
    tokens: torch.Tensor,
    log_prior: torch.Tensor,
    target_time: float = 0.9,
    context_times: Sequence[float] = (0.0, 0.5, 0.7, 0.8, 0.9),
    stride: int = 8,
    batch_size: int = 32,
    seed: int = 0,
) -> list[dict]:
    """Accuracy/CE on tokens noised to ``target_time`` while the rest of the sequence sits at
    each of ``context_times``, beside the no-context readout of the same targets.

    Every ``stride``-th position is a target (each offset in turn, so every token is scored
    once); the others are context. With the context at ``target_time`` this is ``context_use``
    at that level; with it clean (0) it is what context can add to a token that noisy at best,
    which bounds what any model can gain at a level where all tokens are that noisy. Needs a
    process that takes per-token levels (``evaluate_at`` with t of shape (B, L))."""
    process = model.process
    if not process.noise_levels:
        raise ValueError(f"context_ceiling needs noise levels; a {process.kind!r} model has none")
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    device = next(model.network.parameters()).device
    denoiser = process.make_denoiser(model.network)
    log_prior, position = log_prior.to(device), torch.arange(tokens.shape[1], device=device)
    rows = []
    for level in context_times:
        generator = generator_for(seed, device)
        sums, count = {"acc": 0.0, "base_acc": 0.0, "ce": 0.0, "base_ce": 0.0}, 0
        for batch in tokens.split(batch_size):
            batch = batch.to(device)
            for offset in range(min(stride, batch.shape[1])):
                target = position % stride == offset
                t = torch.full(batch.shape, level, device=device)
                t[:, target] = target_time
                ev = process.evaluate_at(denoiser, batch, t, generator)
                m = level_metrics(ev, log_prior, where=target.expand_as(batch))
                for key, value in zip(
                    sums, (m.acc, m.baseline_acc, m.ce, m.baseline_ce), strict=True
                ):
                    sums[key] += float(value) * m.count
                count += m.count
        means = {key: total / max(count, 1) for key, total in sums.items()}
        rows.append(
            {
                "context_t": level,
                "target_t": target_time,
                **means,
                "positions": count,
                "context_gain": means["acc"] / max(means["base_acc"], 1e-9),
            }
        )
    return rows
