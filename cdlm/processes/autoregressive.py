"""The autoregressive baseline: the same Transformer with causal attention and a next-token
loss. Every diffusion result is compared against it, so it is a plain, well-tuned GPT-style
model: its loss is the exact NLL, and it samples with a KV cache."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cdlm.denoiser import Prediction, full_precision
from cdlm.processes.base import LossOutput, TokenProcess


class NextTokenPredictor:
    """Causal logits for the next token: position i sees tokens < i (and the BOS at 0)."""

    def __init__(self, network: nn.Module, bos_id: int) -> None:
        self.network, self.bos_id = network, bos_id

    def shift(self, tokens: Tensor) -> Tensor:
        """[BOS, x_0, ..., x_{L-2}]: the inputs whose outputs predict x_0 ... x_{L-1}."""
        bos = torch.full_like(tokens[:, :1], self.bos_id)
        return torch.cat([bos, tokens[:, :-1]], dim=1)

    def __call__(
        self, tokens: Tensor, t: Tensor | None = None, self_cond=None, cache=None
    ) -> Prediction:
        """tokens: (B, L) inputs (already shifted); cache: the network's KV cache or None."""
        zeros = torch.zeros(tokens.shape[0], device=tokens.device)
        return Prediction(logits=full_precision(self.network(tokens, zeros, cache=cache)))


class AutoregressiveProcess(TokenProcess):
    """Next-token prediction. ``bos_id`` (the tokenizer's EOS, filled in at build time) starts
    every sequence, so all L tokens are scored and the NLL is per token like the diffusion
    bounds."""

    kind = "autoregressive"
    default_sampler = "ar"
    causal = True

    def __init__(self, vocab_size: int, bos_id: int) -> None:
        super().__init__()
        if not 0 <= bos_id < vocab_size:
            raise ValueError(f"bos_id {bos_id} is outside the vocabulary of {vocab_size}")
        self.vocab_size, self.bos_id = vocab_size, bos_id

    @property
    def canvas_id(self) -> int:
        return self.bos_id

    def make_denoiser(self, network: nn.Module) -> NextTokenPredictor:
        return NextTokenPredictor(network, self.bos_id)

    def loss(self, denoiser: NextTokenPredictor, tokens: Tensor) -> LossOutput:
        """Exact NLL of the sequence, nats per token."""
        logits = denoiser(denoiser.shift(tokens)).logits
        nats = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        return LossOutput(nats, {"bits_per_token": nats.detach() / math.log(2)})
