"""``cdlm-eval metric=elbo`` and ``metric=ode_nll``: a likelihood bound of ``cdlm.likelihood``
on the held-out split, averaged per term over sequences (``cdlm.likelihood.evaluate``)."""

from __future__ import annotations

import functools
import time
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cdlm import likelihood
from cdlm.evaluation.metric import Loaded, Measured
from cdlm.likelihood.evaluate import evaluate, validation_tokens


def elbo(loaded: Loaded, cfg: DictConfig, **options: Any) -> Measured:
    """The VDM diffusion ELBO (``cdlm.likelihood.elbo`` with ``options``)."""
    return held_out(loaded, cfg, functools.partial(likelihood.elbo, **options))


def ode_nll(loaded: Loaded, cfg: DictConfig, **options: Any) -> Measured:
    """The probability-flow ODE NLL (``cdlm.likelihood.ode_nll`` with ``options``)."""
    return held_out(loaded, cfg, functools.partial(likelihood.ode_nll, **options))


def held_out(loaded: Loaded, cfg: DictConfig, bound: functools.partial) -> Measured:
    """``bound`` on ``num_batches`` batches of the held-out split of ``data``; refused for a
    process the bound does not score (each names its processes and what it is a bound of)."""
    model, name = loaded.model, bound.func.__name__
    fits = bound.func.processes
    if model.process.kind not in fits:
        raise ValueError(
            f"metric={name} scores {', '.join(fits)} models, not {model.process.kind!r}; "
            "metric=report scores any model"
        )
    tokens = validation_tokens(model, cfg.data.path, cfg.data.val_fraction, cfg.data.packing)
    start = time.perf_counter()
    measured = evaluate(
        model,
        bound,
        tokens,
        batch_size=cfg.batch_size,
        num_batches=cfg.num_batches,
        seed=cfg.seed,
        desc=f"cdlm-eval: {name} batch",
    )
    result = {
        "metric": name,
        "ckpt": loaded.ckpt,
        "scores": bound.func.scores,
        **measured,
        "options": OmegaConf.to_container(cfg.metric) | {"seed": cfg.seed},
        "wall_seconds": round(time.perf_counter() - start, 3),
    }
    terms = ", ".join(f"{k}={v:.4f}" for k, v in measured["bits_per_token"].items())
    total = measured["bits_per_token"].get("total")
    how = f"{name} on {measured['sequences']} val sequences, seed {cfg.seed}"
    return Measured(
        name,
        result,
        f"cdlm-eval: {name} of {bound.func.scores}, on {measured['sequences']} sequences, "
        f"bits/token: {terms}",
        card=None if total is None else {"bits_per_token": total, "bound_how": how},
    )
