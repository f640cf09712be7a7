"""A model's own likelihood bound on held-out sequences, in bits per token, with its noise."""

from __future__ import annotations

import math

import torch

from cdlm.likelihood.elbo import elbo
from cdlm.likelihood.evaluate import evaluate
from cdlm.model_file import Model
from cdlm.progress import progress
from cdlm.rng import member_seed, seeded


@torch.no_grad()
def val_bits_per_token(
    model: Model, tokens: torch.Tensor, seed: int, batch_size: int = 32, draws: int = 1
) -> dict:
    """The process's own bound on the val split: AR exact NLL, masked ELBO (the training loss
    with stratified t), gaussian VDM ELBO (``cdlm.likelihood.elbo``).

    A diffusion bound is a Monte Carlo estimate (one t and noise draw per sequence): on a
    ~140-sequence split one draw varies by ~0.2 bits between seeds, so ``draws`` passes with
    seeds ``member_seed(seed, d)`` (the first ``seed``) are averaged and their standard error is reported. The AR NLL is
    exact: one pass."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    if model.process.exact_likelihood:
        draws = 1
    passes = [_one_draw(model, tokens, member_seed(seed, d), batch_size) for d in range(draws)]
    values = [p["bits_per_token"] for p in passes]
    mean = sum(values) / draws
    spread = sum((v - mean) ** 2 for v in values) / max(1, draws - 1)
    kind = "exact NLL" if model.process.exact_likelihood else "ELBO bound"
    out = {"kind": kind, "bits_per_token": mean, "sequences": len(tokens), "draws": draws}
    if draws > 1:
        out |= {"std_error": math.sqrt(spread / draws), "per_draw": values}
    if "terms" in passes[0]:
        out["terms"] = {k: sum(p["terms"][k] for p in passes) / draws for k in passes[0]["terms"]}
    return out


def _one_draw(model: Model, tokens: torch.Tensor, seed: int, batch_size: int) -> dict:
    """One noise draw of the bound: the process's own eval-mode loss where that is a bound (or
    exact), else (a CE-trained gaussian model) the VDM ELBO of ``cdlm.likelihood``. PAD
    positions are not scored."""
    if not model.process.loss_is_bound:
        result = evaluate(
            model,
            elbo,
            tokens,
            batch_size=batch_size,
            num_batches=None,
            seed=seed,
            desc="val bound (ELBO) batch",
        )
        return {
            "bits_per_token": result["bits_per_token"]["total"],
            "terms": result["bits_per_token"],
        }
    device = next(model.network.parameters()).device
    den = model.process.make_denoiser(model.network)
    pad = model.tokenizer.pad_token_id
    nats, counted = 0.0, 0
    with seeded(seed, device):  # the process's loss draws its levels from the global stream
        for b in progress(tokens.split(batch_size), "val bound batch"):
            b = b.to(device)
            valid = b != pad if pad is not None else torch.ones_like(b, dtype=torch.bool)
            n = int(valid.sum())
            nats += model.process.loss(den, {"tokens": b, "valid": valid}).loss.item() * n
            counted += n
    return {"bits_per_token": nats / max(counted, 1) / math.log(2)}
