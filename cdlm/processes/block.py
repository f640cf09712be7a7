"""Block diffusion (BD3-LM, Arriola et al. 2025): masked diffusion inside blocks of
``block_size`` tokens, autoregressive over blocks.

Each block is denoised given the clean blocks before it, so the bound is a sum of per-block
masked-diffusion ELBOs; at block size 1 it is the AR NLL (a lone masked token is predicted from
its clean past alone, and the ELBO weight integrates to one). Training runs in one pass over the
noisy and the clean sequence together, x_t ⊕ x0 (length 2L, both at positions 0..L-1), under
BD3-LM's vectorised mask: a noisy block sees itself and the clean blocks before it; a clean block
sees the clean blocks up to itself. Sampling writes each finished block into the network's KV
cache once, so a block costs its denoising steps over ``block_size`` positions plus one pass to
cache it (``cdlm.samplers.blockwise``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cdlm.denoiser import Denoiser, Prediction
from cdlm.processes.masked import MaskedDenoiser, MaskedProcess
from cdlm.time_samplers import stratified_times


def vectorised_mask(length: int, block_size: int, device=None) -> Tensor:
    """(2L, 2L) bool, True = visible, over [x_t (L), x0 (L)] (BD3-LM Sec. 3.2)."""
    block = torch.arange(length, device=device) // block_size
    q, k = block[:, None], block[None, :]
    noisy_sees = torch.cat([q == k, k < q], dim=1)  # its own block; clean blocks before it
    clean_sees = torch.cat([torch.zeros_like(q == k), k <= q], dim=1)  # clean blocks up to it
    return torch.cat([noisy_sees, clean_sees], dim=0)


def prefix_mask(prefix: int, width: int, block_size: int, device=None) -> Tensor:
    """(P + W, P + W) mask of an uncached window call: the clean prefix (P positions) block-
    causal among itself, the window (one block, W positions) seeing the prefix and itself."""
    block = torch.arange(prefix, device=device) // block_size
    top = torch.cat(
        [
            block[None, :] <= block[:, None],
            torch.zeros(prefix, width, dtype=torch.bool, device=device),
        ],
        dim=1,
    )
    bottom = torch.ones(width, prefix + width, dtype=torch.bool, device=device)
    return torch.cat([top, bottom], dim=0)


class BlockDenoiser(MaskedDenoiser):
    """SUBS log-probabilities of a block-causal network.

    A whole-canvas call predicts every block from the clean stream ``clean`` (default: the
    canvas itself, i.e. each block given the canvas's blocks before it). A window call
    (``positions``: one block [a, b)) predicts that block given the canvas's first a tokens as
    the clean past, read from ``cache`` (the network's KV cache holding exactly them) or, with
    no cache, recomputed in the same call."""

    def __init__(self, network: nn.Module, mask_id: int, block_size: int) -> None:
        super().__init__(network, mask_id)
        self.block_size = block_size

    def __call__(
        self,
        z: Tensor,
        t: Tensor,
        self_cond: Tensor | None = None,
        subs: bool = True,
        *,
        positions: Tensor | None = None,
        clean: Tensor | None = None,
        cache=None,
        **kwargs,
    ) -> Prediction:
        if positions is not None and cache is not None:
            return super().__call__(z, t, positions=positions, cache=cache, **kwargs)
        length = z.shape[1]
        if positions is None:
            clean = z if clean is None else clean
            inputs = torch.cat([z, clean], dim=1)
            at = torch.arange(length, device=z.device).repeat(2)
            mask = vectorised_mask(length, self.block_size, z.device)
            window = slice(0, length)
        else:
            start, width = int(positions[0]), len(positions)
            inputs = torch.cat([z[:, :start], z[:, positions]], dim=1)
            at = torch.cat([torch.arange(start, device=z.device), positions])
            mask = prefix_mask(start, width, self.block_size, z.device)
            window = slice(start, start + width)
        zeros = torch.zeros(z.shape[0], device=z.device)
        out = self.network(inputs, zeros, positions=at, attn_mask=mask, **kwargs)[:, window]
        seen = z if positions is None else z[:, positions]
        return self.parameterize(out, seen, subs)


class BlockProcess(MaskedProcess):
    """Masked diffusion within blocks of ``block_size``, autoregressive over blocks.

    Args (beside ``MaskedProcess``'s; ``shift`` is not used: blocks see their own clean past):
        block_size: tokens per block (1: an AR model; the sequence length: masked diffusion
            with a clean-stream input).
        clip: (low, high) training mask rates (BD3-LM's clipped, "data-driven" schedule for
            lower-variance gradients): training t is drawn in [low, high] instead of
            [t_min, 1]; evaluation always integrates the full range, so the bound stays one.
    """

    kind = "block"
    default_sampler = "block"
    next_token_layout = False

    def __init__(
        self,
        vocab_size: int,
        mask_id: int,
        block_size: int = 4,
        eos_id: int | None = None,
        schedule=None,
        t_min: float = 1e-3,
        time_sampler=None,
        clip: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(vocab_size, mask_id, eos_id, schedule, t_min, time_sampler, shift=False)
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if clip is not None and not 0.0 <= clip[0] < clip[1] <= 1.0:
            raise ValueError(f"clip must be (low, high) with 0 <= low < high <= 1, got {clip}")
        self.block_size, self.clip = block_size, None if clip is None else tuple(clip)

    def make_denoiser(self, network: nn.Module) -> Denoiser:
        return BlockDenoiser(network, self.mask_id, self.block_size)

    def predict(self, denoiser: Denoiser, c) -> Prediction:
        return denoiser(c.x_t, c.t, clean=c.tokens)

    def sample_t(self, n, generator=None, *, device=None, length=None) -> Tensor:
        """One level per block, (n, length): each block's ELBO term is estimated separately.
        Training: the time sampler's draw (in [low, high] when clipped); evaluation:
        stratified uniform over all n x blocks levels."""
        device = device if device is not None else getattr(generator, "device", None)
        if length is None:
            return super().sample_t(n, generator, device=device)
        blocks = -(-length // self.block_size)
        if self.training:
            u = self.time_sampler(n * blocks, device, generator)
            low, high = self.clip if self.clip is not None else (self.t_min, 1.0)
        else:
            u = stratified_times(n * blocks, device, generator)
            low, high = self.t_min, 1.0
        t = (low + (high - low) * u).view(n, blocks)
        return t.repeat_interleave(self.block_size, dim=1)[:, :length]
