"""One step of a world's hidden chain: a row-stochastic (S, S) matrix, dense or sparse.

A dense matrix suits small state spaces (characters, the agreement world). A token chain over a
BPE vocabulary keeps each row's top K successors and mixes in a teleport distribution,
P'(a -> b) = (1 - eps) P_topK(a -> b) + eps nu(b) (Tang et al. 2026, LuhanTang/dllm_sampler's
``SparseTeleportPrior``): messages then cost S K per row instead of S^2, which keeps exact
inference on a CPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

_TINY = 1e-300


def _entropy(p: Tensor) -> Tensor:
    """Row entropies in nats of (..., S) probabilities."""
    return -(p * p.clamp_min(_TINY).log()).sum(-1)


class Transition:
    """P(next state | state), (S, S) float64, given as ``dense`` or as the top-K successors
    ``index`` (S, K) with ``prob`` (S, K) (each row sums to 1) mixed with ``teleport`` (S,) at
    rate ``eps``."""

    def __init__(
        self,
        dense: Tensor | None = None,
        *,
        index: Tensor | None = None,
        prob: Tensor | None = None,
        teleport: Tensor | None = None,
        eps: float = 0.0,
    ) -> None:
        if (dense is None) == (index is None):
            raise ValueError("give a dense matrix or the top-K index and prob, not both")
        self.dense = None if dense is None else dense.double()
        self._entropies: Tensor | None = None
        self._cast: dict[torch.dtype, Tensor] = {}
        if dense is not None:
            self.size = dense.shape[0]
            return
        self.size = index.shape[0]
        self.index, self.prob, self.eps = index.long(), prob.double(), float(eps)
        self.teleport = (
            torch.zeros(self.size, dtype=torch.float64) if teleport is None else teleport.double()
        )
        rows = torch.arange(self.size).repeat_interleave(index.shape[1])
        values = (1.0 - self.eps) * self.prob.flatten()
        # the size given: inferred, it would drop states that no row keeps among its top K
        coo = torch.sparse_coo_tensor(
            torch.stack([rows, self.index.flatten()]), values, (self.size, self.size)
        )
        self.matrix = coo.coalesce().to_sparse_csr()  # P_topK scaled, (S, S)
        self.matrix_t = coo.t().coalesce().to_sparse_csr()

    def _dense(self, dtype: torch.dtype) -> Tensor:
        """The dense matrix in ``dtype``, converted once per dtype."""
        if dtype not in self._cast:
            self._cast[dtype] = self.dense.to(dtype)
        return self._cast[dtype]

    def push(self, message: Tensor) -> Tensor:
        """message @ P: (B, S) weights on states -> weights on their successors."""
        if self.dense is not None:
            return message @ self._dense(message.dtype)
        out = (self.matrix_t.to(message.dtype) @ message.T).T
        return out + self.eps * message.sum(-1, keepdim=True) * self.teleport.to(message.dtype)

    def pull(self, message: Tensor) -> Tensor:
        """message @ P^T: (B, S) weights on successors -> their expectation from each state."""
        if self.dense is not None:
            return message @ self._dense(message.dtype).T
        out = (self.matrix.to(message.dtype) @ message.T).T
        return out + self.eps * (message @ self.teleport.to(message.dtype))[:, None]

    def rows(self, states: Tensor) -> Tensor:
        """(N, S) the full successor distributions of ``states`` (N,)."""
        if self.dense is not None:
            return self.dense[states]
        out = self.eps * self.teleport.expand(len(states), -1).clone()
        return out.scatter_add_(1, self.index[states], (1.0 - self.eps) * self.prob[states])

    def entropies(self, chunk: int = 256) -> Tensor:
        """(S,) each row's entropy in nats (computed once: a sparse chain's rows are made
        dense a chunk at a time)."""
        if self._entropies is None:
            states = torch.arange(self.size)
            self._entropies = torch.cat([_entropy(self.rows(s)) for s in states.split(chunk)])
        return self._entropies

    def prob_of(self, prev: Tensor, nxt: Tensor) -> Tensor:
        """P(nxt | prev) elementwise, float64 (0 where impossible): the same float64 values as
        ``rows`` (its sum in the same order), without making a row dense."""
        if self.dense is not None:
            return self.dense[prev, nxt]
        local = ((self.index[prev] == nxt[..., None]) * self.prob[prev]).sum(-1)
        return self.eps * self.teleport[nxt] + (1.0 - self.eps) * local

    def log_prob(self, prev: Tensor, nxt: Tensor) -> Tensor:
        """log P(nxt | prev) elementwise, float64 (-inf where impossible)."""
        return self.prob_of(prev, nxt).log()

    def sample(self, prev: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One successor of each of ``prev`` (N,), drawn in float64."""
        if self.dense is not None:
            return torch.multinomial(self.dense[prev], 1, generator=generator)[:, 0]
        local = self.index[prev].gather(
            1, torch.multinomial(self.prob[prev], 1, generator=generator)
        )[:, 0]
        if self.eps == 0.0:
            return local
        jump = torch.rand(len(prev), generator=generator, dtype=torch.float64) < self.eps
        far = torch.multinomial(self.teleport, len(prev), replacement=True, generator=generator)
        return torch.where(jump, far, local)
