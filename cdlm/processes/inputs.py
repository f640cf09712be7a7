"""How an embedding-diffusion network reads x_t: the ``input`` piece of a gaussian process,
chosen in the config by ``_target_`` (``conf/input/``).

* ``VectorInput``: the network reads x_t itself, optionally self-conditioned;
* ``PosteriorInput``: it reads each position's no-context posterior over tokens, optionally with
  Dream-style shifted prediction.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cdlm.denoiser import readout_evidence


class VectorInput:
    """The network reads x_t itself, (B, L, D); with ``self_cond_prob`` > 0 training
    self-conditions that share of batches on a first pass's x0 estimate (Chen et al. 2022), and
    sampling feeds each step the previous estimate."""

    sees_token_levels = False  # x_t alone does not tell the network each token's own level
    shift = False

    def __init__(self, self_cond_prob: float = 0.0) -> None:
        if not 0.0 <= self_cond_prob <= 1.0:
            raise ValueError(f"self_cond_prob must be in [0, 1], got {self_cond_prob}")
        self.self_cond_prob = self_cond_prob

    def network_kwargs(self, vocab_size: int, embed_dim: int) -> dict:
        return {"in_dim": embed_dim, "self_condition": self.self_cond_prob > 0}

    def __call__(self, x_t: Tensor, t: Tensor, embedding: nn.Module, schedule) -> Tensor:
        return x_t

    def estimate(self, self_cond: Tensor | None) -> Tensor | None:
        """The previous x0 estimate (B, L, D) laid out as the network's input rows."""
        return self_cond


class PosteriorInput:
    """The network reads, at each position, the posterior over tokens that the position's own
    x_t gives (uniform prior), embedded as its expected input embedding: the input of Bayesian
    Flow Networks (Graves et al. 2023). A readable token looks like a clean token and a hidden
    one like a soft [MASK], so the task is masked-LM-like and AR weights apply unchanged.

    ``shift``: position i's prediction is read from output i - 1 of [BOS, inputs] (Dream, Ye et
    al. 2025), the layout of a next-token predictor; the process supplies the BOS id.

    ``self_cond_prob`` > 0: self-conditioning as ``VectorInput`` has it (that share of training
    batches, and every sampling call after the first, also feed the previous x0 estimate), the
    estimate entering each row beside the soft token it estimates (a zero row beside the BOS).
    """

    sees_token_levels = True

    def __init__(
        self, shift: bool = False, bos_id: int | None = None, self_cond_prob: float = 0.0
    ) -> None:
        if not 0.0 <= self_cond_prob <= 1.0:
            raise ValueError(f"self_cond_prob must be in [0, 1], got {self_cond_prob}")
        self.shift, self.bos_id, self.self_cond_prob = shift, bos_id, self_cond_prob

    def network_kwargs(self, vocab_size: int, embed_dim: int) -> dict:
        if self.self_cond_prob == 0:
            return {"in_vocab": vocab_size, "self_condition": False}
        return {"in_vocab": vocab_size, "self_condition": True, "self_cond_dim": embed_dim}

    def estimate(self, self_cond: Tensor | None) -> Tensor | None:
        """The previous x0 estimate (B, L, D) beside its soft token: shifted one row right
        behind a zero row (the BOS's) in the shifted layout."""
        if self_cond is None or not self.shift:
            return self_cond
        return torch.cat([torch.zeros_like(self_cond[:, :1]), self_cond], dim=1)

    def __call__(self, x_t: Tensor, t: Tensor, embedding: nn.Module, schedule) -> Tensor:
        soft = torch.softmax(readout_evidence(embedding, schedule, x_t, t), dim=-1)
        if not self.shift:
            return soft
        bos = torch.zeros_like(soft[:, :1])
        bos[..., self.bos_id] = 1.0
        return torch.cat([bos, soft], dim=1)
