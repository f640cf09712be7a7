"""``cdlm-eval metric=account``: a gaussian model's bound split by log-SNR beside its world's
exact denoiser on the model's own table (``cdlm.likelihood.account``), on the world's draws."""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig

from cdlm import worlds
from cdlm.evaluation.metric import Loaded, Measured
from cdlm.likelihood.account import account as split_bound
from cdlm.likelihood.terms import likelihood_denoiser
from cdlm.model_file import oracle_model


def account(
    loaded: Loaded, cfg: DictConfig, *, world: str | None, sequences: int, bins: int, per_bin: int
) -> Measured:
    """The per-level account of ``loaded``'s bound on ``sequences`` draws of ``world``."""
    model = loaded.model
    if model.process.kind not in account.processes:
        raise ValueError(f"metric=account scores gaussian models, not {model.process.kind!r}")
    if not worlds.is_world(str(world)):
        raise ValueError("metric=account needs metric.world=world:<name>, the world it learned")
    found = worlds.load(str(world))
    g = torch.Generator().manual_seed(int(cfg.seed))
    tokens = found.sample(sequences, generator=g)
    exact = oracle_model(found, model.config["process"], loaded.device, embedding=model)
    split = split_bound(
        model.process,
        likelihood_denoiser(model.process, model.network),
        likelihood_denoiser(exact.process, exact.network),
        tokens.to(loaded.device),
        bins=bins,
        per_bin=per_bin,
        generator=g,
    )
    nll = float(-found.log_prob(tokens).mean() / (tokens.shape[1] * math.log(2)))
    result = {
        "metric": "account",
        "ckpt": loaded.ckpt,
        "world": str(world),
        "sequences": sequences,
        "world_nll_bits": nll,
        "bound_bits": split.total("model"),
        "reference_bits": split.total("reference"),
        "no_context_bits": split.total("no_context"),
        "excess_bits": split.total("model") - split.total("reference"),
        "excess_se": split.excess_se,
        "prior_bits": split.prior,
        "reconstruction_bits": split.reconstruction,
        "reconstruction_model_bits": split.reconstruction_model,
        "bins": split.rows(),
        "options": {"bins": bins, "per_bin": per_bin, "seed": int(cfg.seed)},
    }
    return Measured("account", result, markdown(result), markdown=True)


account.processes = ("gaussian",)  # the process kinds it scores


def markdown(result: dict) -> str:
    """The account as a table: one row a log-SNR bin, then the totals."""
    lines = [
        f"Bound of {result['ckpt']} on {result['sequences']} draws of {result['world']}, "
        "bits/token by log-SNR bin (model, the exact denoiser on its table, the no-context "
        "readout; shares of the bound's and of training's weight):",
        "",
        "| log-SNR | model | exact | excess | no context | bound share | trained share |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["bins"]:
        lo, hi = row["logsnr"]
        lines.append(
            f"| [{lo:.1f}, {hi:.1f}] | {row['model_bits']:.3f} | {row['reference_bits']:.3f} | "
            f"{row['excess_bits']:.3f} | {row['no_context_bits']:.3f} | "
            f"{row['bound_share']:.3f} | {row['trained_share']:.3f} |"
        )
    lines += [
        "",
        f"Totals: bound {result['bound_bits']:.3f}, exact {result['reference_bits']:.3f}, "
        f"excess {result['excess_bits']:.3f} ± {result['excess_se']:.3f}, no context "
        f"{result['no_context_bits']:.3f}; world NLL {result['world_nll_bits']:.3f}; prior "
        f"{result['prior_bits']:.4f}, reconstruction {result['reconstruction_bits']:.4f} "
        f"(model decoder {result['reconstruction_model_bits']:.4f}).",
    ]
    return "\n".join(lines) + "\n"
