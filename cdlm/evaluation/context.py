"""Does a diffusion model use context? Its token accuracy/CE at fixed noise levels beside the
no-context readout at the same noise draw (the token's own noisy observation plus the unigram
prior; see ``process.evaluate_at``). Low-noise accuracy alone says nothing for embedding
diffusion: the own embedding gives the token away there."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cdlm.checkpoint import Model


@torch.no_grad()
def context_use(
    model: Model,
    tokens: torch.Tensor,
    log_prior: torch.Tensor,
    times: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9),
    batch_size: int = 32,
    seed: int = 0,
) -> list[dict]:
    """Per noise level t: model and no-context accuracy and CE (nats) over ``tokens`` (N, L),
    and their ratio ``context_gain`` = accuracy / no-context accuracy."""
    device = next(model.network.parameters()).device
    denoiser = model.process.make_denoiser(model.network)
    rows = []
    for t in times:
        generator = torch.Generator(device).manual_seed(seed)
        sums = {"acc": 0.0, "base_acc": 0.0, "ce": 0.0, "base_ce": 0.0}
        count = 0
        for batch in tokens.split(batch_size):
            m = model.process.evaluate_at(
                denoiser, batch.to(device), t, generator, log_prior.to(device)
            )
            values = {
                "acc": m.acc,
                "base_acc": m.baseline_acc,
                "ce": m.ce,
                "base_ce": m.baseline_ce,
            }
            for key, value in values.items():
                sums[key] += float(value) * m.count  # weighted by positions scored
            count += m.count
        means = {key: total / max(count, 1) for key, total in sums.items()}
        gain = means["acc"] / max(means["base_acc"], 1e-9)
        rows.append({"t": t, **means, "positions": count, "context_gain": gain})
    return rows
