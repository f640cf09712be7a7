"""CANDI's hybrid sampler for a gaussian model trained with ``process.hybrid`` (Pynadath, Shi &
Zhang 2026, "CANDI: Hybrid Discrete-Continuous Diffusion Models").

The reverse of the hybrid corruption (``cdlm.processes.hybrid``): a token is either a clean
anchor (its embedding, level 0) or corrupted (a noisy embedding at the run's level t). Each
interval t -> s makes one network call on that state, then

* reveals each corrupted token with the forward process's probability of being clean at s given
  corrupted at t, (keep(s) - keep(t)) / (1 - keep(t)), as a token drawn from its predicted
  distribution, which becomes an anchor (the discrete half, masked diffusion's ancestral step);
* moves every token still corrupted from t to s by a DDPM posterior draw towards the x0
  estimate (the continuous half, ``step_ddpm``).

At s = 0 every token left is revealed, so the run ends on anchors only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cdlm import rng
from cdlm.denoiser import Denoiser, per_position
from cdlm.processes.gaussian import GaussianProcess
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, register, sample_categorical
from cdlm.samplers.gaussian import step_ddpm


def step_reveal(
    x: Tensor,
    anchors: Tensor,
    tokens: Tensor,
    drawn: Tensor,
    reveal: Tensor,
    stepped: Tensor,
    embed: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """One hybrid update of the state (x (B, L, D), anchors (B, L) bool, tokens (B, L)): the
    ``reveal`` positions (corrupted ones only) become anchors holding ``drawn`` and their
    embeddings ``embed``; the corrupted rest take ``stepped``; anchors stay."""
    new = reveal & ~anchors
    still = ~anchors & ~new
    x = torch.where(new[..., None], embed, torch.where(still[..., None], stepped, x))
    return x, anchors | new, torch.where(new, drawn, tokens)


@register("hybrid", processes=("gaussian",))
@torch.no_grad()
def sample_hybrid(
    denoiser: Denoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: GaussianProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
) -> SampleOutput:
    """CANDI's reverse process. x: (B, L, D) prior draw (every token corrupted at t = 1);
    timesteps: (T+1,) from 1 to 0; revealed tokens are drawn at ``temperature`` (0: argmax).
    Refused for a model trained without ``process.hybrid``."""
    schedule, n = process.schedule, len(timesteps) - 1
    anchors = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)
    tokens = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
    pred = None
    for i in range(n):
        t, s = (v.to(x.dtype).expand(x.shape[0]) for v in timesteps[i : i + 2])
        share = process.unmask_share(t, s)  # refuses a model trained without the hybrid
        levels = torch.where(anchors, torch.zeros_like(t[:, None]), t[:, None])
        pred = denoiser(x, levels)
        logp = torch.log_softmax(pred.logits.double(), -1)
        drawn = sample_categorical(logp, generator, temperature)
        u = rng.rand(x.shape[:2], generator, device=x.device, dtype=torch.float64)
        reveal = u < share.double()[:, None]
        noise = rng.randn(x.shape, generator, device=x.device, dtype=x.dtype)
        ss = torch.where(s <= 0, t, s)  # the last interval reveals everything: no step
        coefficients = [
            per_position(f(v)) for v in (t, ss) for f in (schedule.alpha, schedule.sigma)
        ]
        stepped = step_ddpm(x, pred.x0, *coefficients, noise)
        embed = process.embedding(drawn).to(x.dtype)
        x, anchors, tokens = step_reveal(x, anchors, tokens, drawn, reveal, stepped, embed)
        if callback is not None:
            callback(StepInfo(i=i, t=float(t.max()), s=float(s.max()), x=x, prediction=pred))
    return SampleOutput(x=x, tokens=tokens, prediction=pred, nfe=n)
