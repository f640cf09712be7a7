"""What every process shares: the loss record and the per-noise-level evaluation record.

A process owns its corruption, its loss and its prior; the training loop only calls
``process.loss(denoiser, tokens)``. See ``docs/architecture.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class LossOutput:
    """loss: scalar to optimise; metrics: extra scalars to log (already detached)."""

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class LevelMetrics:
    """Denoising quality at one fixed noise level t, averaged over all positions."""

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


def level_metrics(
    logits: Tensor, target: Tensor, baseline: Tensor | None, oracle: Tensor | None = None
) -> LevelMetrics:
    """CE and accuracy of (N, V) ``logits`` on (N,) ``target``, and of ``baseline`` and
    ``oracle`` logits."""
    if target.numel() == 0:
        zero = torch.zeros(())
        none = None if baseline is None else zero
        return LevelMetrics(ce=zero, acc=zero, baseline_ce=none, baseline_acc=none)

    def ce_acc(z: Tensor) -> tuple[Tensor, Tensor]:
        z = z.float()
        return F.cross_entropy(z, target), (z.argmax(-1) == target).float().mean()

    ce, acc = ce_acc(logits)
    n = target.numel()
    if baseline is None:
        return LevelMetrics(ce=ce, acc=acc, count=n)
    b_ce, b_acc = ce_acc(baseline)
    o_ce, o_acc = ce_acc(oracle) if oracle is not None else (None, None)
    return LevelMetrics(ce, acc, b_ce, b_acc, n, o_ce, o_acc)


class AttentionPhases:
    """AR pre-training inside a diffusion run, then attention annealed from causal to full
    (DiffuLLaMA, Gong et al. 2025; Dream, Ye et al. 2025). A mixin for process modules: the
    batch count is a buffer, so a resumed or exported model knows its phase."""

    ar_steps: int
    anneal_steps: int

    def _init_phases(self, ar_steps: int, anneal_steps: int, shift: bool) -> None:
        if ar_steps < 0 or anneal_steps < 0:
            raise ValueError(
                f"ar_steps and anneal_steps must be >= 0, got {ar_steps}, {anneal_steps}"
            )
        if ar_steps and not shift:
            raise ValueError("ar_steps > 0 needs shift=true (next-token prediction layout)")
        self.ar_steps, self.anneal_steps = ar_steps, anneal_steps
        self.register_buffer("step", torch.zeros((), dtype=torch.long))  # training batches seen

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # Models saved before the batch count existed load with a count of 0.
        state_dict.setdefault(prefix + "step", torch.zeros((), dtype=torch.long))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _training_phase(self, denoiser) -> bool:
        """Advances the batch count and sets the network's share of visible future keys;
        True while in the AR phase."""
        self.step += 1
        if not (self.ar_steps or self.anneal_steps):
            return False  # no host sync on the common path
        step = int(self.step) - 1
        if step < self.ar_steps:
            visibility = 0.0
        elif self.anneal_steps:
            visibility = min(1.0, (step - self.ar_steps) / self.anneal_steps)
        else:
            visibility = 1.0
        network = getattr(denoiser, "network", None)
        if not hasattr(network, "future_visibility"):
            raise ValueError(
                f"ar_steps/anneal_steps need a cdlm Transformer (attention annealing); got "
                f"{type(network).__name__}"
            )
        network.future_visibility = visibility
        return step < self.ar_steps


class TokenProcess(nn.Module):
    """What the token-input processes (masked, autoregressive) share: a network that reads token
    ids, no self-conditioning, no clamping, and a canvas filled with one placeholder id that the
    sampler overwrites. Subclasses set ``causal`` and ``canvas_id``."""

    causal: bool
    vocab_size: int
    canvas_id: int

    @property
    def network_kwargs(self) -> dict:
        return {
            "in_vocab": self.vocab_size,
            "out_dim": self.vocab_size,
            "self_condition": False,
            "causal": self.causal,
        }

    def make_denoiser(self, network: nn.Module):
        raise NotImplementedError

    def sampling_denoiser(
        self, network: nn.Module, clamp: bool = False, condition=None, temperature: float = 1.0
    ):
        """The denoiser samplers see; ``condition`` wraps the network's denoiser first
        (guidance, fixed regions)."""
        if clamp:
            raise ValueError("clamp applies to gaussian (embedding) models only")
        if temperature != 1.0:
            raise ValueError(
                "temperature= applies to gaussian models; token samplers take sampler.temperature"
            )
        denoiser = self.make_denoiser(network)
        return denoiser if condition is None else condition(denoiser)

    def prior(
        self, shape: tuple[int, int], device: torch.device, generator: torch.Generator | None
    ) -> Tensor:
        """The starting canvas, (B, L), every position ``canvas_id``."""
        return torch.full(shape, self.canvas_id, dtype=torch.long, device=device)
