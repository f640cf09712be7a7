"""What every process shares: the loss record and the per-noise-level evaluation record.

A process owns its corruption, its loss and its prior; the training loop only calls
``process.loss(denoiser, tokens)``. See ``docs/architecture.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
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


def stratified_times(
    n: int, device: torch.device, generator: torch.Generator | None = None
) -> Tensor:
    """n times in [0, 1), one in each of n equal strata with a shared random offset
    (antithetic/stratified sampling, Kingma et al. 2021): same mean, lower variance than U(0,1)."""
    u = torch.rand((), device=device, generator=generator)
    return (u + torch.arange(n, device=device) / n) % 1.0


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

    def sampling_denoiser(self, network: nn.Module, clamp: bool = False):
        if clamp:
            raise ValueError("clamp applies to gaussian (embedding) models only")
        return self.make_denoiser(network)

    def prior(
        self, shape: tuple[int, int], device: torch.device, generator: torch.Generator | None
    ) -> Tensor:
        """The starting canvas, (B, L), every position ``canvas_id``."""
        return torch.full(shape, self.canvas_id, dtype=torch.long, device=device)
