"""The KV caches of block-by-block decoding (the loop is ``cdlm.samplers.masked.decode``): each
step runs only the positions that change, attending to cached keys and values of the rest. The cache is an object chosen by
``_target_`` (``conf/cache/``: ``cache=prefix|dual|none``); None runs without one.

* Block diffusion (``process=block``, BD3-LM, Arriola et al. 2025): with ``PrefixCache`` the
  clean past is cached exactly (a block sees only its past). Each denoising step runs the
  current block alone, and a block's first step also writes the clean positions the cache
  lacks (the block finished before it, or the whole prompt) in the same call, so a block at one
  step per block costs one call. None recomputes the clean past in every call.
* A full-attention masked model (Fast-dLLM, Wu et al. 2025): an approximation, rewritten at the
  start of each block (and every ``refresh`` steps): ``PrefixCache`` caches the decided prefix
  and recomputes block + suffix each step; ``DualCache`` also caches the still-masked suffix
  and recomputes the block alone. The rewriting pass's own predictions serve that step.

Windows are in the network's own coordinates (a shifted model's input is one longer); the
denoiser takes the whole canvas and ``positions`` and predicts those positions only. On a shifted
model a block [a, b) is predicted at network positions a..b-1 but its tokens are the inputs of
a+1..b, so a step runs a..b (``Calls.window``): network position b is the block's, not the
suffix's, and a dual cache that kept it would hold the block's last token as a stale [MASK].
A shifted block model's window call runs a..b for the same reason (``window_positions``: the
block's tail, ``cdlm.processes.block``).
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser
from cdlm.networks.cache import KVCache
from cdlm.samplers.masked_steps import network_length


class Calls:
    """The denoiser's window calls on a canvas of ``length``, counting NFE and the positions the
    network processes per sequence: a cached call runs its window only; an uncached one (block
    diffusion without a cache) recomputes the clean past before its window as well."""

    def __init__(self, denoiser: Denoiser, kv: KVCache | None, length: int, device) -> None:
        self.denoiser, self.kv, self.device = denoiser, kv, device
        self.net_len = network_length(denoiser, length)
        self.shift = self.net_len - length  # 1 on a shifted masked model (its BOS), else 0
        self.nfe, self.positions = 0, 0

    def span(self, a: int, b: int) -> Tensor:
        """Positions a..b-1 of the network's sequence."""
        return torch.arange(a, b, device=self.device)

    def window(self, a: int, b: int) -> Tensor:
        """The network positions that change with canvas block [a, b): those that predict it
        (a..b-1) and those whose inputs are its tokens (one to the right when shifted). The
        first b - a predict the block."""
        return self.span(a, b + self.shift)

    def block(self, x: Tensor, a: int, b: int, t: float) -> Tensor:
        """Block diffusion's log-probabilities (B, b - a, V) for the block [a, b) against its
        exact clean past; with a cache the same call writes the clean positions it lacks."""
        tt, span = torch.full((x.shape[0],), t, device=self.device), self.span(a, b)
        self.nfe += 1
        past = 0 if self.kv is None else self.kv.length
        self.positions += a - past + len(self.denoiser.window_positions(span))
        return self.denoiser(x, tt, positions=span, cache=self.kv).logits

    def __call__(self, x: Tensor, at: Tensor, t: float, write: bool = False) -> Tensor:
        """Log-probabilities (B, len(at), V) at positions ``at`` of canvas ``x`` (B, L); a
        ``write`` keeps the window's keys and values in the cache, else it is only read."""
        tt = torch.full((x.shape[0],), t, device=self.device)
        self.nfe += 1
        if self.kv is None:
            self.positions += int(at[0]) + len(at)
            return self.denoiser(x, tt, positions=at).logits
        self.positions += len(at)
        if write:
            return self.denoiser(x, tt, positions=at, cache=self.kv).logits
        with self.kv.read_only():
            return self.denoiser(x, tt, positions=at, cache=self.kv).logits


@dataclass(frozen=True)
class BlockCache(ABC):
    """A KV-cache choice for block-by-block decoding. On a full-attention masked model it is
    approximate and owns what differs between the kinds: the pass that rewrites it and the
    positions every other step runs. refresh: rewrite every ``refresh`` steps of a block as
    well as at its start (None: at the start only; 1: every step, which is uncached decoding)."""

    name: ClassVar[str]  # as chosen on the command line: cache=<name>
    refresh: int | None = None

    def __post_init__(self) -> None:
        if self.refresh is not None and self.refresh < 1:
            raise ValueError(f"cache.refresh must be >= 1 steps, got {self.refresh}")

    def block_logits(self, calls: Calls, x: Tensor, a: int, b: int, j: int, t: float) -> Tensor:
        """The block [a, b)'s log-probabilities (B, b - a, V) at its step j, at time t."""
        if j == 0 or (self.refresh and j % self.refresh == 0):
            return self.rewrite(calls, x, a, b, t)
        return self.read(calls, x, a, b, t)

    @abstractmethod
    def rewrite(self, calls: Calls, x: Tensor, a: int, b: int, t: float) -> Tensor:
        """Rewrites the cache from the current canvas; returns the block's predictions."""

    @abstractmethod
    def read(self, calls: Calls, x: Tensor, a: int, b: int, t: float) -> Tensor:
        """The block's predictions from the positions that are not cached, against the cache."""


@dataclass(frozen=True)
class PrefixCache(BlockCache):
    """Caches the decided prefix: block diffusion's finished blocks (exact), or Fast-dLLM's
    prefix cache (Wu et al. 2025), each step recomputing the block and the suffix after it."""

    name: ClassVar[str] = "prefix"

    def rewrite(self, calls: Calls, x: Tensor, a: int, b: int, t: float) -> Tensor:
        calls.kv.truncate(0)
        logp = calls(x, calls.span(0, calls.net_len), t, write=True)
        calls.kv.truncate(a)
        return logp[:, a:b]

    def read(self, calls: Calls, x: Tensor, a: int, b: int, t: float) -> Tensor:
        return calls(x, calls.span(a, calls.net_len), t)[:, : b - a]


@dataclass(frozen=True)
class DualCache(BlockCache):
    """Fast-dLLM's dual cache (Wu et al. 2025): the decided prefix and the still-masked suffix
    both cached, each step recomputing the block alone (its ``Calls.window``, one position more
    on a shifted model; a full-attention masked model only)."""

    name: ClassVar[str] = "dual"

    def rewrite(self, calls: Calls, x: Tensor, a: int, b: int, t: float) -> Tensor:
        calls.kv.truncate(0)
        window = calls.window(a, b)
        suffix = calls.span(a + len(window), calls.net_len)
        logp = calls(x, torch.cat([calls.span(0, a), suffix, window]), t, write=True)
        calls.kv.truncate(a + len(suffix))  # drops the window's entries, stale after this step
        return logp[:, -len(window) :][:, : b - a]

    def read(self, calls: Calls, x: Tensor, a: int, b: int, t: float) -> Tensor:
        return calls(x, calls.window(a, b), t)[:, : b - a]


def check_cache(cache: object) -> None:
    """A clear error for a ``cache`` that is neither a ``BlockCache`` nor None (e.g. a name)."""
    if cache is not None and not isinstance(cache, BlockCache):
        raise TypeError(
            f"cache must be a PrefixCache, a DualCache or None (no cache), got {cache!r} "
            "(on the command line: cache=prefix|dual|none)"
        )


def unseen_fixed(
    x: Tensor, mask_id: int, block_size: int, lengths: list[int] | None = None
) -> int | None:
    """The first fixed position of ``x`` (B, L) that lies in a later block than a free
    ([MASK]) position of its row, or None; a row's padding (at or past its ``lengths``) is not
    fixed text. Block diffusion shows a block only the blocks before it, so that free position
    is drawn blind to it: not from the conditional given all fixed text, which no block model
    (learned or exact) can see."""
    free, at = x == mask_id, torch.arange(x.shape[1], device=x.device)
    block = at // block_size
    first = torch.where(free, block, x.shape[1]).amin(-1, keepdim=True)
    later = ~free & (block > first)
    if lengths is not None:
        later &= at < torch.tensor(lengths, device=x.device)[:, None]
    later = later.any(0)
    return int(later.long().argmax()) if bool(later.any()) else None


def warn_unseen_fixed(
    x: Tensor, mask_id: int, block_size: int, lengths: list[int] | None = None
) -> None:
    """A one-line warning when fixed text lies where block decoding cannot see it
    (``unseen_fixed``): an infill's right side, a bridge's closing name."""
    at = unseen_fixed(x, mask_id, block_size, lengths)
    if at is not None:
        warnings.warn(
            f"block diffusion sees only earlier blocks: the fixed text from position {at} is "
            "unseen by the free positions in blocks before it, so they are not drawn from the "
            "conditional given it (infill with a masked model for that)",
            stacklevel=3,
        )
