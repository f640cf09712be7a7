"""Block diffusion (BD3-LM, Arriola et al. 2025): masked diffusion inside blocks of
``block_size`` tokens, autoregressive over blocks.

Each block is denoised given the clean blocks before it, so the bound is a sum of per-block
masked-diffusion ELBOs. Training runs in one pass over the noisy and the clean stream together,
x_t ⊕ x0 (length 2L, both at positions 0..L-1), under BD3-LM's vectorised mask: a noisy block
sees itself and the clean blocks before it; a clean position sees the clean blocks up to its own
(``causal_clean=False``) or the clean positions up to itself (``causal_clean=True``).

With ``shift`` (the configs' default) the layout is a next-token predictor's: network position
i reads token i - 1 (a BOS at 0) and predicts token i, and a noisy block's first input is the
clean token before the block. At block size 1 the noisy stream then reads exactly what an AR
model reads, under the same attention, so an AR checkpoint drops in with its logits unchanged
(``tests/test_block_shift.py``) and larger blocks start from AR's quality. With
``causal_clean`` the clean stream *is* that AR model, and ``ar_weight`` keeps it one with a
next-token loss: its cache is an AR cache, and its outputs verify a block's draft
(``sampler=speculative``).

Shifted, the block [a, b) is predicted at network positions a..b-1, whose inputs are
x_{a-1}, z_a..z_{b-2}: the block's last token z_{b-1} is nobody's input in its own block. Once
it is revealed, the rest of the block would be drawn blind to it, which no sampler can repair
(issue 51: KL 0.60 against 0.36 unshifted on the exact denoiser). So the block's window has one
more input, its *tail*: z_{b-1} at network position b, seen by the whole block and predicting
nothing. Training gives every block its tail (T more positions, one per block); sampling runs
positions a..b. At block size 1 the tail would be the only query's own target (a [MASK] or a
token it need not predict), so there is none, and block size 1 stays the AR model exactly.
``sees_last=false`` is the layout before the tail (kept for the checkpoints trained in it).

How AR-initialised block models elsewhere meet this (read for issue 51):
- Fast-dLLM v2 (``Fast_dLLM_v2_7B/modeling.py``, as copied in Satgoy152/DualDiffusion at
  1aeb3d449d403049d2532b8bcf1a0bc7cd7fa6c5): the window is the block's own B tokens with
  next-token logits shifted one right, so every token it predicts sees the whole block, the last
  included; the block's *first* token is drawn beforehand, greedily, from the previous block's
  clean pass. That is exact only because it is always decoded first; here the first token stays
  in the window (its input x_{a-1}), so any order is exact.
- SDAR (JetAstra/SDAR, ``generate.py`` at 59549b13ed131c41abf1e9c87b10cce0d45c63ef) drops the
  shift: logits at a block's own positions, the BD3-LM (``shift=false``) layout fine-tuned from
  an AR model.

Sampling (``cdlm.samplers.blockwise``): a window call denoises a block against the KV cache of
the clean past and, in the same call, writes the clean positions the cache still lacks (the
block finished before it, or a whole prompt), so a block at one step costs one call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from cdlm.denoiser import Denoiser, Prediction
from cdlm.networks.two_tower import stream_flags
from cdlm.processes.base import LossOutput
from cdlm.processes.block_masks import chunk_mask, clean_visibility, vectorised_mask
from cdlm.processes.losses import next_token_loss, valid_mask
from cdlm.processes.masked import MaskedDenoiser, MaskedProcess
from cdlm.processes.prompts import hold_tokens, prompt_of
from cdlm.time_samplers import stratified_times


@dataclass
class Chunk:
    """The raw network outputs of a window call: ``clean`` (B, C, V) at the clean positions it
    wrote (``clean_positions``; with a causal clean stream, next-token logits) and ``window``
    (B, W, V) at the block's positions."""

    clean: Tensor
    window: Tensor
    clean_positions: Tensor


class BlockDenoiser(MaskedDenoiser):
    """SUBS log-probabilities of a block-causal network.

    A whole-canvas call predicts every block from the clean stream ``clean`` (default: the
    canvas itself, i.e. each block given the canvas's blocks before it). A window call
    (``positions``: one block [a, b)) predicts that block given the canvas's first a tokens as
    the clean past: with ``cache`` (a KV cache holding the clean past's first ``cache.length``
    positions) it writes the clean positions from there up to a and denoises the block in one
    call; with no cache it recomputes the clean past in the same call. ``sees_last``: a
    shifted block's window has its tail (module docstring) at block sizes above 1."""

    def __init__(
        self,
        network: nn.Module,
        mask_id: int,
        block_size: int,
        shift_from: int | None = None,
        causal_clean: bool = False,
        sees_last: bool = True,
    ) -> None:
        super().__init__(network, mask_id, shift_from)
        self.block_size, self.causal_clean = block_size, causal_clean
        self.tail = sees_last and shift_from is not None and block_size > 1

    def window_positions(self, positions: Tensor) -> Tensor:
        """The network positions a window call for the canvas ``positions`` (a block, or its
        end) runs: those, and with a tail one more, whose input is their last token."""
        if not self.tail:
            return positions
        return torch.cat([positions, positions[-1:] + 1])

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
        if positions is None:
            out, _ = self.streams(z, z if clean is None else clean, **kwargs)
            return self.parameterize(out, z, subs)
        chunk = self.chunk(z, positions, cache, **kwargs)
        return self.parameterize(chunk.window, z[:, positions], subs)

    def streams(self, z: Tensor, clean: Tensor, **kwargs) -> tuple[Tensor, Tensor]:
        """Raw outputs (B, L, V) of the noisy and the clean stream under the vectorised mask.
        Shifted, a noisy block's first input is the clean token before it; with tails, each
        block's tail (its last token, at the position after it) runs between the streams."""
        length, device = z.shape[1], z.device
        pos = torch.arange(length, device=device)
        noisy_in = self.window_inputs(z, pos)
        if self.shift_from is not None:
            starts = (pos % self.block_size == 0) & (pos > 0)
            noisy_in = torch.where(starts[None], self.window_inputs(clean, pos), noisy_in)
        ends = torch.arange(self.block_size, length + self.block_size, self.block_size)
        tails = ends.clamp(max=length).to(device) if self.tail else pos[:0]
        at = torch.cat([pos, tails, pos])
        inputs = torch.cat(
            [noisy_in, self.window_inputs(z, tails), self.window_inputs(clean, pos)], 1
        )
        mask = vectorised_mask(length, self.block_size, self.causal_clean, self.tail, device)
        zeros = torch.zeros(z.shape[0], device=device)
        noisy = length + len(tails)
        kwargs |= stream_flags(self.network, length, noisy, clean_first=False, device=device)
        out = self.network(inputs, zeros, positions=at, attn_mask=mask, **kwargs)
        return out[:, :length], out[:, noisy:]

    def chunk(
        self, z: Tensor, positions: Tensor, cache=None, start: int | None = None, **kwargs
    ) -> Chunk:
        """One window call on canvas ``z`` for the block at ``positions`` (contiguous, from
        ``start``, by default its first; empty: a call that only writes): the clean positions
        not yet in ``cache`` up to ``start`` (all of 0..start-1 without one) are computed from z
        in the same call and, with a cache, kept in it; the window's entries (its tail among
        them, whose output is dropped) are not kept."""
        start = int(positions[0]) if start is None else start
        device = z.device
        past = 0 if cache is None else cache.length
        if past > start:
            raise ValueError(f"the cache holds {past} positions, past the block's start {start}")
        clean, window = torch.arange(past, start, device=device), self.window_positions(positions)
        inputs = torch.cat([self.window_inputs(z, clean), self.window_inputs(z, window)], 1)
        mask = chunk_mask(past, clean, len(window), self.block_size, self.causal_clean)
        zeros = torch.zeros(z.shape[0], device=device)
        at = torch.cat([clean, window])
        kwargs |= stream_flags(self.network, len(clean), len(window), True, device)
        out = self.network(inputs, zeros, positions=at, attn_mask=mask, cache=cache, **kwargs)
        if cache is not None and not cache.frozen:
            cache.truncate(start)  # the clean past is kept; the window changes every step
        c = len(clean)
        return Chunk(out[:, :c], out[:, c : c + len(positions)], clean)

    def next_token_logits(self, tokens: Tensor, **kwargs) -> Tensor:
        """The clean stream alone under causal attention: next-token logits (B, L, V), row i
        predicting tokens[:, i] (shifted layout only)."""
        length, device = tokens.shape[1], tokens.device
        pos = torch.arange(length, device=device)
        mask = clean_visibility(pos, pos, self.block_size, causal=True)
        zeros = torch.zeros(tokens.shape[0], device=device)
        inputs = self.window_inputs(tokens, pos)
        return self.network(inputs, zeros, positions=pos, attn_mask=mask, **kwargs)


class BlockProcess(MaskedProcess):
    """Masked diffusion within blocks of ``block_size``, autoregressive over blocks.

    Args (beside ``MaskedProcess``'s):
        block_size: tokens per block (1: an AR model; the sequence length: masked diffusion
            with a clean-stream input).
        shift: the next-token layout (see the module docstring); an AR checkpoint loads
            unchanged (``init_from=``) and block size 1 is that AR model. Needs ``eos_id``.
        sees_last: with ``shift``, each block's window also reads the block's own last token
            (its tail), in training and sampling; False: the layout blind to it, which
            checkpoints stored before the tail keep. Unused unshifted (where a position reads
            its own token).
        causal_clean: the clean stream under causal attention (an AR model whose cache is the
            sampler's), instead of attention up to each position's own block.
        ar_weight: weight of the clean stream's next-token loss beside the block ELBO (a
            joint objective that keeps the causal pass a good AR model, the verifier of
            ``sampler=speculative``); needs ``shift`` and ``causal_clean``. Logged as
            ``ar_bits_per_token``; the logged bound is the block ELBO alone.
        complementary: in training, every sequence is also scored under the complement of its
            mask (Fast-dLLM v2), at the level whose keep rate is the first mask's rate, so every
            token is a target once per step.
        clip: (low, high) training mask rates (BD3-LM's clipped, "data-driven" schedule for
            lower-variance gradients): training t is drawn in [low, high] instead of
            [t_min, 1]; evaluation always integrates the full range, so the bound stays one.
    """

    kind = "block"
    default_sampler = "block"

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
        shift: bool = False,
        causal_clean: bool = False,
        ar_weight: float = 0.0,
        complementary: bool = False,
        sees_last: bool = True,
    ) -> None:
        super().__init__(vocab_size, mask_id, eos_id, schedule, t_min, time_sampler, shift)
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if clip is not None and not 0.0 <= clip[0] < clip[1] <= 1.0:
            raise ValueError(f"clip must be (low, high) with 0 <= low < high <= 1, got {clip}")
        if not ar_weight >= 0.0:
            raise ValueError(f"process.ar_weight must be >= 0, got {ar_weight}")
        if ar_weight > 0 and not (shift and causal_clean):
            raise ValueError(
                "process.ar_weight > 0 trains the clean stream as a next-token predictor: it "
                "needs process.shift=true and process.causal_clean=true"
            )
        self.block_size, self.clip = block_size, None if clip is None else tuple(clip)
        self.causal_clean, self.ar_weight = causal_clean, float(ar_weight)
        self.complementary, self.sees_last = complementary, sees_last

    def check_prompts(self, prompt_dropout: float) -> None:
        """Also refuses prompt dropout: the clean stream would still show a dropped prompt to
        every later block."""
        super().check_prompts(prompt_dropout)
        if prompt_dropout > 0:
            raise ValueError(
                "condition.prompt_dropout > 0 is not supported by process=block: its clean "
                "stream shows the prompt to every later block"
            )

    @property
    def verifies(self) -> bool:
        """Whether the clean stream is a causal next-token model that can verify drafts."""
        return self.shift and self.causal_clean

    def make_denoiser(self, network: nn.Module) -> Denoiser:
        bos = self.eos_id if self.shift else None
        return BlockDenoiser(
            network, self.mask_id, self.block_size, bos, self.causal_clean, self.sees_last
        )

    def predict(self, denoiser: Denoiser, c) -> Prediction:
        return denoiser(c.x_t, c.t, clean=c.tokens)

    def loss(self, denoiser: Denoiser, batch: dict[str, Tensor], generator=None) -> LossOutput:
        """The block ELBO integrand in nats per valid token (the bound, in evaluation), plus in
        training ``ar_weight`` times the clean stream's next-token NLL; an AR phase trains that
        next-token NLL alone. A prompt (``cdlm.processes.prompts``) is never masked in the noisy
        stream, as at sampling, nor scored."""
        tokens, valid = batch["tokens"], valid_mask(batch)
        if self.training and self.ar_phase:
            if not self.shift:
                raise ValueError("an AR phase needs process.shift=true (next-token layout)")
            return next_token_loss(denoiser.next_token_logits(tokens), tokens, valid)
        t = self.sample_t(tokens.shape[0], generator, device=tokens.device, length=tokens.shape[1])
        c = self.corrupt(tokens, t, generator)
        if self.training and self.complementary:
            c = self.with_complement(c)
            tokens, valid = c.tokens, valid.repeat(2, 1)
        prompt = prompt_of(batch)
        if prompt is not None:  # after the complement, which would mask a held prompt
            c = hold_tokens(c, prompt.repeat(len(tokens) // len(batch["tokens"])), self.mask_id)
        noisy, clean = denoiser.streams(c.x_t, c.tokens)
        logp = denoiser.parameterize(noisy, c.x_t).logits
        integrand, _ = self.elbo_terms(logp, c, valid)
        nats = integrand.sum() / valid.sum().clamp_min(1)
        metrics = {"bits_per_token": nats.detach() / math.log(2)}
        if not self.verifies:
            return LossOutput(nats, metrics)
        ar = next_token_loss(clean, tokens, valid)
        metrics.update(ar.metrics)
        total = nats + self.ar_weight * ar.loss if self.training else nats
        return LossOutput(total, metrics)

    def with_complement(self, c):
        """The corruption ``c`` and, stacked below it, its complement: the masked positions
        visible and the visible ones masked, at the level ``schedule.time_of(1 - keep(t))``."""
        t_other = self.schedule.time_of(1.0 - self.schedule.keep(c.t)).clamp(self.t_min, 1.0)
        x_other = torch.where(c.noisy, c.tokens, self.mask_id)
        return type(c)(
            tokens=c.tokens.repeat(2, 1),
            x0=c.x0.repeat(2, 1),
            x_t=torch.cat([c.x_t, x_other]),
            t=torch.cat([c.t, t_other]),
            noisy=torch.cat([c.noisy, ~c.noisy]),
        )

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
