"""Where along the noise path a gaussian model's bound loses its bits (issue 58's diagnosis).

The VDM diffusion term (``cdlm.likelihood.elbo``) is 1/2 * integral of exp(logsnr) |e - x0_hat|^2
over log-SNR. Split into equal-width log-SNR bins, each bin integrated at ``per_bin`` stratified
levels on the same sequences and noise, for three denoisers at once:

* the model;
* a reference, usually the world's exact posterior on the model's own table
  (``cdlm.world_model.oracle_model``): its curve is the bound's own weight on each level, and
  model minus reference is where the model loses;
* the no-context readout (each token's posterior from its own noisy embedding, uniform prior):
  a model no better than it ignores context there. At high SNR every denoiser is near it, which
  is why low-noise accuracy says nothing.

Beside them, the share of the training objective's draws that fall in each bin
(``training_share``), so "trained where the bound is not" shows apart from
"ignores context".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser, expected_embedding, readout_evidence
from cdlm.likelihood.elbo import prior_kl
from cdlm.likelihood.terms import bits_per_token, rounding_nll
from cdlm.processes.gaussian import GaussianProcess


@dataclass
class Account:
    """Per bin (bins,), bits/token: ``model``, ``reference`` and ``no_context`` diffusion
    integrals; ``trained``: the share of training draws in the bin. ``edges`` (bins + 1,) in
    log-SNR. Scalars in bits/token: ``prior``, ``reconstruction`` (the embedding decoder) and
    ``reconstruction_model`` (the model's logits at t = 0), ``excess_se``: the standard error
    over sequences of the model's diffusion total minus the reference's."""

    edges: Tensor
    model: Tensor
    reference: Tensor
    no_context: Tensor
    trained: Tensor
    prior: float
    reconstruction: float
    reconstruction_model: float
    excess_se: float

    def total(self, which: str = "model") -> float:
        """Prior + the ``which`` curve summed + the embedding decoder's reconstruction: a bound
        on -log2 p per token in expectation (the VDM ELBO's terms, integrated by bins)."""
        return self.prior + float(getattr(self, which).sum()) + self.reconstruction

    def rows(self) -> list[dict]:
        """One dict a bin, for JSON and tables."""
        bound = self.reference / self.reference.sum().clamp_min(1e-30)
        return [
            {
                "logsnr": [round(float(self.edges[i]), 3), round(float(self.edges[i + 1]), 3)],
                "model_bits": float(self.model[i]),
                "reference_bits": float(self.reference[i]),
                "excess_bits": float(self.model[i] - self.reference[i]),
                "no_context_bits": float(self.no_context[i]),
                "bound_share": float(bound[i]),
                "trained_share": float(self.trained[i]),
            }
            for i in range(len(self.model))
        ]


@torch.no_grad()
def account(
    process: GaussianProcess,
    model: Denoiser,
    reference: Denoiser,
    tokens: Tensor,
    *,
    bins: int = 20,
    per_bin: int = 4,
    generator: torch.Generator | None = None,
) -> Account:
    """The bound of ``tokens`` (B, L) split by log-SNR, for ``model`` and ``reference`` (pure
    functions of (x_t, t), e.g. ``likelihood_denoiser``) and the no-context readout, all on
    ``process``'s table and schedule with the same levels and noise."""
    if bins < 1 or per_bin < 1:
        raise ValueError(f"account needs bins and per_bin >= 1, got {bins} and {per_bin}")
    batch, length = tokens.shape
    e = process.embedding(tokens).detach()
    ends = torch.tensor([1.0, 0.0], dtype=torch.float64, device=tokens.device)
    lo, hi = (float(v) for v in process.schedule.logsnr(ends))
    edges = torch.linspace(lo, hi, bins + 1, dtype=torch.float64)
    width = (hi - lo) / bins
    curves = torch.zeros(3, batch, bins, dtype=torch.float64)  # model, reference, no context
    for b in range(bins):
        for k in range(per_bin):
            u = torch.rand((), generator=generator, dtype=torch.float64)
            lam = edges[b] + width * (k + u) / per_bin  # stratum k of the bin
            t = process.schedule.t_from_logsnr(lam.expand(batch)).to(e.dtype).to(e.device)
            noise = torch.randn(e.shape, generator=generator, dtype=e.dtype).to(e.device)
            x = process.noised(e, t, noise)
            plain = readout_evidence(process.embedding, process.schedule, x, t)
            estimates = (
                model(x, t).x0,
                reference(x, t).x0,
                expected_embedding(plain, process.embedding),
            )
            for i, x0 in enumerate(estimates):
                error = (e.double() - x0.double()).pow(2).sum((-1, -2)).cpu()
                curves[i, :, b] += 0.5 * math.exp(float(lam)) * error * width / per_bin
    per_token = curves / (length * math.log(2))
    excess = per_token[0].sum(-1) - per_token[1].sum(-1)
    se = float(excess.std() / math.sqrt(batch)) if batch > 1 else math.nan
    zero = torch.zeros(batch, device=e.device, dtype=e.dtype)
    x0 = process.noised(
        e, zero, torch.randn(e.shape, generator=generator, dtype=e.dtype).to(e.device)
    )
    reconstruction = [
        float(bits_per_token(rounding_nll(process, model, x0, tokens, decoder), length).mean())
        for decoder in ("embedding", "model")
    ]
    return Account(
        edges=edges,
        model=per_token[0].mean(0),
        reference=per_token[1].mean(0),
        no_context=per_token[2].mean(0),
        trained=training_share(process, edges, generator),
        prior=float(bits_per_token(prior_kl(process, e), length).mean()),
        reconstruction=reconstruction[0],
        reconstruction_model=reconstruction[1],
        excess_se=se,
    )


def training_share(
    process: GaussianProcess, edges: Tensor, generator: torch.Generator | None, n: int = 65536
) -> Tensor:
    """(bins,) the share of the training objective's weight in each log-SNR bin: ``n`` draws
    of the process's training levels (``sample_t`` in train mode), each weighted 1 / density
    under ``importance_weight``, as the objective weights it."""
    was = process.training
    t = process.train().sample_t(n, generator, device=torch.device("cpu")).double()
    process.train(was)
    weight = (
        1 / process.time_sampler.density(t).clamp_min(1e-6) if process.importance_weight else None
    )
    which = torch.bucketize(process.schedule.logsnr(t).cpu(), edges[1:-1].contiguous())
    share = torch.zeros(len(edges) - 1, dtype=torch.float64)
    share.index_add_(0, which, torch.ones_like(t) if weight is None else weight.double())
    return share / share.sum()
