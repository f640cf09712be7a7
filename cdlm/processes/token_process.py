"""What the token-input processes (masked, uniform, autoregressive) share, apart from the
``Process`` protocol and its defaults (``cdlm.processes.base``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cdlm.denoiser import Denoiser
from cdlm.processes.base import ProcessModule


class TokenProcess(ProcessModule):
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

    def make_denoiser(self, network: nn.Module) -> Denoiser:
        raise NotImplementedError

    def sampling_denoiser(
        self,
        network: nn.Module,
        clamp: bool = False,
        condition=None,
        temperature: float = 1.0,
        self_cond_scale: float = 1.0,
    ) -> Denoiser:
        """The denoiser samplers see; ``condition`` wraps the network's denoiser first
        (guidance, fixed regions)."""
        if clamp or self_cond_scale != 1.0:
            raise ValueError("clamp and self_cond_scale apply to gaussian (embedding) models only")
        if temperature != 1.0:
            raise ValueError(
                "temperature= applies to gaussian models; token samplers take sampler.temperature "
                "(masked and block: sampler.rule.temperature)"
            )
        denoiser = self.make_denoiser(network)
        return denoiser if condition is None else condition(denoiser)

    def prior(
        self, shape: tuple[int, int], device: torch.device, generator: torch.Generator | None
    ) -> Tensor:
        """The starting canvas, (B, L), every position ``canvas_id``."""
        return torch.full(shape, self.canvas_id, dtype=torch.long, device=device)
