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

The denoiser, its window calls and the tail's positions: ``cdlm.processes.block_denoiser``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from cdlm.denoiser import Denoiser, Prediction
from cdlm.processes.base import LossOutput
from cdlm.processes.block_denoiser import BlockDenoiser
from cdlm.processes.losses import next_token_loss, valid_mask
from cdlm.processes.masked import MaskedProcess
from cdlm.processes.prompts import hold_tokens, prompt_of
from cdlm.time_samplers import stratified_times


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
        excluded: ids the block's x0_hat never predicts besides [MASK], as ``MaskedProcess``'s
            (its SUBS readout, the drafts and the verifier's distribution); the clean stream's
            next-token loss reads its raw logits, as before.
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
        excluded: Sequence[int] = (),
    ) -> None:
        super().__init__(
            vocab_size, mask_id, eos_id, schedule, t_min, time_sampler, shift, excluded=excluded
        )
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
            network,
            self.mask_id,
            self.block_size,
            bos,
            self.causal_clean,
            self.sees_last,
            self.support,
        )

    def predict(self, denoiser: Denoiser, c) -> Prediction:
        return denoiser(c.x_t, c.t, clean=c.tokens)

    def loss(self, denoiser: Denoiser, batch: dict[str, Tensor], generator=None) -> LossOutput:
        """The block ELBO integrand in nats per valid token (the bound, in evaluation), plus in
        training ``ar_weight`` times the clean stream's next-token NLL; an AR phase trains that
        next-token NLL alone. A prompt (``cdlm.processes.prompts``) is never masked in the noisy
        stream, as at sampling, nor scored."""
        tokens, valid = batch["tokens"], valid_mask(batch)
        self.support.check(tokens, valid)
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
