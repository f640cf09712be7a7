"""Held-out evaluation of a checkpoint: its validation split, batched metric, averaged terms."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict

import torch

from cdlm import rng
from cdlm.data import TextDataModule
from cdlm.likelihood.terms import likelihood_denoiser
from cdlm.model_file import Model
from cdlm.progress import progress


def corpus_split(
    model: Model, path: str | None = None, val_fraction: float = 0.02, packing: bool = True
) -> TextDataModule:
    """The corpus at ``path`` split exactly as ``cdlm-train`` does, tokenised with the
    checkpoint's own tokenizer (handed to ``TextDataModule`` as a saved tokenizer folder)."""
    with tempfile.TemporaryDirectory() as folder:
        model.tokenizer.save_pretrained(folder)
        data = TextDataModule(
            path=path,
            tokenizer=folder,
            seq_len=model.config["seq_len"],
            packing=packing,
            val_fraction=val_fraction,
        )
        data.setup("validate")
    return data


def validation_tokens(
    model: Model, path: str | None = None, val_fraction: float = 0.02, packing: bool = True
) -> torch.Tensor:
    """(N, L) held-out sequences of the corpus at ``path`` (see ``corpus_split``)."""
    return corpus_split(model, path, val_fraction, packing).val_set.tokens


@torch.no_grad()
def evaluate(
    model: Model,
    metric: Callable,
    tokens: torch.Tensor,
    *,
    batch_size: int,
    num_batches: int | None,
    seed: int,
    desc: str = "likelihood batch",
    show_progress: bool = True,
) -> dict:
    """Runs ``metric(denoiser, process, tokens, generator=...)`` (``elbo`` or ``ode_nll``) on the
    first ``num_batches`` batches (None: all) and averages every term over sequences. Batches
    done go to stderr under ``desc`` (see ``cdlm.progress``): an ODE batch takes minutes."""
    device = next(model.network.parameters()).device
    generator = rng.generator(seed, device)
    denoiser = likelihood_denoiser(model.process, model.network)
    batches = list(torch.split(tokens, batch_size))[:num_batches]
    sums: dict[str, float] = {}
    nfe = 0
    for batch in progress(batches, desc, enabled=show_progress):
        result = asdict(metric(denoiser, model.process, batch.to(device), generator=generator))
        nfe = max(nfe, result.pop("nfe"))
        for name, values in result.items():
            sums[name] = sums.get(name, 0.0) + float(values.sum())
    n = sum(len(b) for b in batches)
    terms = {name: total / n for name, total in sums.items()}
    return {"bits_per_token": terms, "sequences": n, "seq_len": tokens.shape[1], "nfe": nfe}
