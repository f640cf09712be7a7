"""A world's exact posterior behind the network seam: the oracle denoiser of every process.

``OracleNetwork`` is called exactly like cdlm's Transformer (token ids, soft tokens, noise level,
KV cache, explicit positions, attention mask) and returns, at each query position, the exact
log-posterior of the world's token there given what the query may see. Every process wraps it
as it wraps a trained network (SUBS, the readout, the next-token layout, guidance, fixed regions,
caches), so every sampler runs on it unchanged and any gap to the world is the sampler's alone
(Tang et al., ICML 2026).

What a query sees follows the attention pattern: all keys (bidirectional), keys up to itself
(causal: the forward pass alone, the predictive), or an explicit mask (block diffusion); cached
keys are earlier calls' inputs. An input is evidence about one world position: a token id (the
token itself), [MASK] (nothing), or a soft token (the per-position posterior that the gaussian
process's posterior input hands the network, exact for per-token noise levels). Shifted
layouts (input i is position i - 1 after a BOS; output i predicts position i) are the
processes' own, so an output is always about the position of its index.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from cdlm.worlds.base import NEVER, World

SLACK = 1e-30  # the likelihood an observed token leaves to every other token


class OracleCache:
    """The inputs an oracle network has been shown: each written key's network position and
    evidence, in the order written (the ``KVCache`` protocol: ``length``, ``truncate``,
    ``frozen``, ``read_only``; one "layer")."""

    def __init__(self) -> None:
        self.positions: Tensor | None = None  # (T,)
        self.evidence: Tensor | None = None  # (B, T, V)
        self.frozen = False

    @property
    def length(self) -> int:
        return 0 if self.positions is None else len(self.positions)

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> OracleCache:
        if i not in (0, -1):
            raise IndexError(f"an oracle cache has one layer, not {i + 1}")
        return self

    def __iter__(self) -> Iterator[OracleCache]:
        return iter([self])

    def extend(self, positions: Tensor, evidence: Tensor) -> tuple[Tensor, Tensor]:
        """Cached keys followed by the chunk's; kept unless frozen."""
        if self.positions is None:
            keys = (positions, evidence)
        else:
            keys = (torch.cat([self.positions, positions]), torch.cat([self.evidence, evidence], 1))
        if not self.frozen:
            self.positions, self.evidence = keys
        return keys

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        if length == 0:
            self.positions = self.evidence = None
        elif self.positions is not None:
            self.positions, self.evidence = self.positions[:length], self.evidence[:, :length]

    @contextmanager
    def read_only(self) -> Iterator[OracleCache]:
        before, self.frozen = self.frozen, True
        try:
            yield self
        finally:
            self.frozen = before


class OracleNetwork(nn.Module):
    """The exact posterior of ``world`` with a Transformer's call signature.

    Args:
        world: the world.
        out_dim: the logits' width (the model's vocabulary: the world's tokenizer).
        in_vocab: token input (ids or soft tokens) of that width; vector input is refused (the
            gaussian oracle reads soft tokens, which carry each token's own noise level).
        causal: causal attention (the AR process): each output is the predictive.
        shift: the next-token layout (input i is position i - 1; a BOS opens the sequence).
        mask_id: the id that carries no evidence ([MASK]); None: every id is observed.
        self_condition, max_seq_len, num_classes: accepted as a Transformer's (unused);
            labels are refused.
    """

    def __init__(
        self,
        world: World,
        out_dim: int,
        in_vocab: int | None = None,
        in_dim: int | None = None,
        causal: bool = False,
        shift: bool = False,
        mask_id: int | None = None,
        self_condition: bool = False,
        max_seq_len: int = 1 << 20,
        num_classes: int = 0,
    ) -> None:
        super().__init__()
        if in_vocab is None or in_dim is not None:
            raise ValueError("an oracle reads token ids or soft tokens (in_vocab), not vectors")
        if out_dim != world.vocab_size or in_vocab != world.vocab_size:
            raise ValueError(
                f"the process's vocabulary ({in_vocab} in, {out_dim} out) is not the world's "
                f"({world.vocab_size})"
            )
        if causal and not shift:
            raise ValueError("a causal oracle needs the next-token layout (shift)")
        if num_classes:
            raise ValueError("a world has no class labels (condition.labels=false)")
        self.world, self.causal, self.shift, self.mask_id = world, causal, shift, mask_id
        # no weights; an empty one says where the network lives, as callers ask a network
        self.anchor = nn.Parameter(torch.zeros(0), requires_grad=False)

    def new_cache(self) -> OracleCache:
        return OracleCache()

    def evidence(self, x: Tensor) -> Tensor:
        """(B, W, V) log-likelihood of each token given each input: a soft token's log, an id's
        indicator, nothing for [MASK]. No token is ruled out outright (at most SLACK): a
        sampler that has committed tokens the world never puts together (a factorised draw
        in the agreement world) gets the posterior of the rest given that one observation is
        wrong, instead of none; for possible evidence the answer moves by about SLACK."""
        if x.is_floating_point():
            return x.float().clamp_min(SLACK).log()
        ev = torch.full((*x.shape, self.world.vocab_size), math.log(SLACK), device=x.device)
        ev.scatter_(-1, x[..., None], 0.0)
        if self.mask_id is not None:
            ev = ev.masked_fill((x == self.mask_id)[..., None], 0.0)
        return ev

    def forward(
        self,
        x: Tensor,
        t: Tensor | None = None,
        self_cond: Tensor | None = None,
        cache: OracleCache | None = None,
        label: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        attn_mask: Tensor | None = None,
        **ignored,
    ) -> Tensor:
        """As ``Transformer.forward``; returns (B, W, V) exact log-posteriors, NEVER where the
        world puts no mass (an output one past the canvas, as a shifted layout has, predicts the
        next position, which the process drops)."""
        if label is not None and bool((label >= 0).any()):
            raise ValueError("a world has no class labels")
        past = 0 if cache is None else cache.length
        width = x.shape[1]
        if positions is None:
            positions = torch.arange(past, past + width, device=x.device)
        evidence = self.evidence(x)
        if positions.dim() != 1:
            raise ValueError("an oracle network takes positions (W,) shared by the batch")
        keys = (positions, evidence) if cache is None else cache.extend(positions, evidence)
        return self._answer(keys, positions, attn_mask, x.shape[0])

    def _answer(
        self, keys: tuple[Tensor, Tensor], queries: Tensor, attn_mask: Tensor | None, batch: int
    ) -> Tensor:
        """Each query's exact log-posterior given the keys it sees."""
        key_pos, key_ev = keys
        where = key_pos - int(self.shift)  # the world position each input is evidence about
        size = int(max(where.max(), queries.max())) + 1
        if attn_mask is None and self.causal:  # query p sees the keys before position p
            answer = self.world.predictive(self._canvas(where, key_ev, size, None))
            return answer[:, queries]
        out = torch.full((batch, len(queries), self.world.vocab_size), NEVER, device=key_ev.device)
        if attn_mask is None:
            attn_mask = torch.ones(len(queries), len(key_pos), dtype=torch.bool)
        rows, group = torch.unique(attn_mask.cpu(), dim=0, return_inverse=True)
        for g, seen in enumerate(rows):
            chosen = (group == g).to(queries.device)
            # Past its last visible key and query a row's canvas holds no evidence and is asked
            # nothing; a chain's backward message from there is 1, so it is cut off (exact). A
            # block's rows then cost their prefix, not the sequence (half of block's oracle).
            visible = where[(where >= 0) & seen.to(where.device)]
            reach = max(int(visible.max()) if len(visible) else -1, int(queries[chosen].max()))
            posterior = self.world.posterior(self._canvas(where, key_ev, reach + 1, seen))
            out[:, chosen] = posterior[:, queries[chosen]]
        return out

    def _canvas(self, where: Tensor, evidence: Tensor, size: int, seen: Tensor | None) -> Tensor:
        """(B, size, V) summed evidence at each world position from the visible keys."""
        keep = where >= 0
        if seen is not None:
            keep = keep & seen.to(keep.device)
        canvas = torch.zeros(evidence.shape[0], size, evidence.shape[-1], device=evidence.device)
        return canvas.index_add_(1, where[keep], evidence[:, keep])
