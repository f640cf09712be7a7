"""Denoising quality at a noise level, beside the no-context readout and the exact bigram
denoiser: the numbers behind "does the model use context?" (docs/guide/levers.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from cdlm.evaluation.oracle import markov_marginals
from cdlm.processes.base import LevelEval


@dataclass
class LevelMetrics:
    """Denoising quality at one noise level, averaged over the scored positions."""

    ce: Tensor  # cross-entropy of the model's token prediction, nats/token
    acc: Tensor  # argmax accuracy of the model's token prediction
    # The same for the no-context readout at the same noise draw (the token's own noisy
    # observation and the unigram prior, nothing else); None without a prior. A model uses
    # context exactly where it beats this.
    baseline_ce: Tensor | None = None
    baseline_acc: Tensor | None = None
    count: int = 0  # positions scored (masked ones only, for masked diffusion)
    # The same for the exact denoiser of a bigram LM (``cdlm.evaluation.oracle``), if asked for.
    oracle_ce: Tensor | None = None
    oracle_acc: Tensor | None = None


def _ce_acc(z: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    z = z.float()
    return F.cross_entropy(z, target), (z.argmax(-1) == target).float().mean()


def level_metrics(
    ev: LevelEval,
    log_prior: Tensor | None = None,
    transition: Tensor | None = None,
    where: Tensor | None = None,
) -> LevelMetrics:
    """CE and accuracy of ``ev``'s logits on its scored positions (and on ``where`` (B, L), if
    given); with the unigram ``log_prior`` (V,) also of the no-context readout
    (evidence + log prior); with a bigram ``transition`` (V, V) as well, of the exact bigram
    denoiser (forward-backward over the evidence)."""
    scored = ev.scored if where is None else ev.scored & where
    target = ev.tokens[scored]
    if target.numel() == 0:
        zero = torch.zeros(())
        none = None if log_prior is None else zero
        return LevelMetrics(ce=zero, acc=zero, baseline_ce=none, baseline_acc=none)
    ce, acc = _ce_acc(ev.logits[scored], target)
    n = target.numel()
    if log_prior is None:
        return LevelMetrics(ce=ce, acc=acc, count=n)
    log_prior = log_prior.float().to(ev.evidence.device)
    b_ce, b_acc = _ce_acc((ev.evidence + log_prior)[scored], target)
    o_ce = o_acc = None
    if transition is not None:
        marginals = markov_marginals(ev.evidence.float(), transition, log_prior.exp())
        o_ce, o_acc = _ce_acc(marginals.clamp_min(1e-30).log()[scored], target)
    return LevelMetrics(ce, acc, b_ce, b_acc, n, o_ce, o_acc)
