"""The autoregressive baseline: the same Transformer with causal attention and a next-token
loss. Every diffusion result is compared against it, so it is a plain, well-tuned GPT-style
model: its loss is the exact NLL, and it samples with a KV cache."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cdlm.denoiser import Denoiser, NetworkDenoiser, Prediction, Wrapper, full_precision
from cdlm.processes import fim
from cdlm.processes.base import Corrupted, LevelEval, LossOutput
from cdlm.processes.losses import valid_mask
from cdlm.processes.token_process import TokenProcess


class NextTokenPredictor(NetworkDenoiser):
    """Causal logits for the next token: position i sees tokens < i (and the BOS at 0)."""

    def __init__(self, network: nn.Module, bos_id: int) -> None:
        self.network, self.bos_id = network, bos_id

    @staticmethod
    def shift_tokens(tokens: Tensor, bos_id: int) -> Tensor:
        """[BOS, x_0, ..., x_{L-2}]: the inputs whose outputs predict x_0 ... x_{L-1}."""
        bos = torch.full_like(tokens[:, :1], bos_id)
        return torch.cat([bos, tokens[:, :-1]], dim=1)

    def shift(self, tokens: Tensor) -> Tensor:
        return self.shift_tokens(tokens, self.bos_id)

    def __call__(
        self, tokens: Tensor, t: Tensor | None = None, self_cond=None, **kwargs
    ) -> Prediction:
        """tokens: (B, L) inputs (already shifted); keywords (cache, label, positions) reach
        the network."""
        zeros = torch.zeros(tokens.shape[0], device=tokens.device)
        return Prediction(logits=full_precision(self.network(tokens, zeros, **kwargs)))


class AutoregressiveProcess(TokenProcess):
    """Next-token prediction. ``bos_id`` (the tokenizer's EOS, filled in at build time) starts
    every sequence, so all L tokens are scored and the NLL is per token like the diffusion
    bounds.

    With ``fim_rate`` > 0 that share of training rows is fill-in-the-middle formatted
    (``cdlm.processes.fim``; ``fim_spm_rate`` of them in SPM order), so that the model infills
    templates; ``fim_ids`` are the sentinels, added to the tokenizer at build time. Validation
    and evaluation score plain text, so the logged NLL stays the plain model's.
    """

    kind = "autoregressive"
    default_sampler = "ar"
    loss_is_bound = True
    exact_likelihood = True
    noise_levels = False
    sequential = True  # one sampler step (and callback) per token
    causal = True
    next_token_layout = True  # output i predicts token i from [BOS, x_0, ..., x_{i-1}]
    trains_on_prompts = True  # the prompt is its clean left context; valid_mask skips it

    def __init__(
        self,
        vocab_size: int,
        bos_id: int,
        fim_rate: float = 0.0,
        fim_spm_rate: float = 0.5,
        fim_ids: list[int] | None = None,
    ) -> None:
        super().__init__()
        if not 0 <= bos_id < vocab_size:
            raise ValueError(f"bos_id {bos_id} is outside the vocabulary of {vocab_size}")
        for key, rate in (("fim_rate", fim_rate), ("fim_spm_rate", fim_spm_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"process.{key} must be in [0, 1], got {rate}")
        if fim_rate > 0 and fim_ids is None:
            raise ValueError("process.fim_rate > 0 needs fim_ids (the build adds the sentinels)")
        self.vocab_size, self.bos_id = vocab_size, bos_id
        self.fim_rate, self.fim_spm_rate = fim_rate, fim_spm_rate
        self.fim = fim.FimIds.of(fim_ids) if fim_ids is not None else None

    @property
    def canvas_id(self) -> int:
        return self.bos_id

    def check_prompts(self, prompt_dropout: float) -> None:
        """Also refuses fill-in-the-middle rows, whose reordering would move the prompt."""
        super().check_prompts(prompt_dropout)
        if self.fim_rate > 0:
            raise ValueError(
                "rows with prompts (data.format=pairs, data.prompt_rate > 0) need "
                "process.fim_rate=0 (FIM reorders rows)"
            )

    @torch.no_grad()
    def score_hidden(self, denoiser: Denoiser, ids: Tensor, hidden: Tensor) -> Tensor:
        """Through fill-in-the-middle: each row's hidden span (one, contiguous) is the middle of
        a PSM prompt of the rest, scored token by token."""
        if self.fim is None:
            raise ValueError(
                "scoring hidden tokens with an AR model needs one trained with fim_rate"
            )
        spans = [row.nonzero().flatten() for row in hidden]
        if any(len(s) == 0 or int(s[-1] - s[0]) + 1 != len(s) for s in spans):
            raise ValueError("an AR model scores one contiguous hidden span per row")
        bounds = [(int(s[0]), int(s[-1]) + 1) for s in spans]
        seq = torch.stack(
            [
                torch.cat([fim.prompt(row[:a], row[b:], self.fim, "psm"), row[a:b]])
                for row, (a, b) in zip(ids, bounds, strict=True)
            ]
        )  # the middle is each row's last b - a tokens
        logp = denoiser(denoiser.shift(seq)).logits.log_softmax(-1)
        token = logp.gather(-1, seq[..., None]).squeeze(-1)
        return torch.stack([token[w, -(b - a) :].mean() for w, (a, b) in enumerate(bounds)])

    def make_denoiser(self, network: nn.Module) -> NextTokenPredictor:
        return NextTokenPredictor(network, self.bos_id)

    def sample_t(self, n: int, generator=None, *, device=None, length=None) -> Tensor:
        """No noise levels: zeros, so that level-agnostic callers work unchanged."""
        return torch.zeros(
            n, device=device if device is not None else getattr(generator, "device", None)
        )

    def corrupt(self, tokens: Tensor, t: Tensor, generator=None) -> Corrupted:
        """The AR "corruption" is the shift: the model reads [BOS, x_0, ..., x_{L-2}]."""
        x_t = NextTokenPredictor.shift_tokens(tokens, self.bos_id)
        return Corrupted(tokens, tokens, x_t, t, torch.ones_like(tokens, dtype=torch.bool))

    def weight(self, t: Tensor) -> Tensor:
        return torch.ones_like(t)

    def loss(
        self, denoiser: NextTokenPredictor, batch: dict[str, Tensor], generator=None
    ) -> LossOutput:
        """Exact NLL of the sequence, nats per valid token (in training, of the FIM-formatted
        rows as they stand); of the response given the prompt for prompt→response rows, whose
        prompt ``valid_mask`` leaves out."""
        tokens, valid = batch["tokens"], valid_mask(batch)
        if self.training and self.fim_rate > 0:
            tokens, valid = fim.transform(
                tokens, valid, self.fim_rate, self.fim_spm_rate, self.fim, self.bos_id, generator
            )
        c = self.corrupt(tokens, self.sample_t(tokens.shape[0], device=tokens.device))
        nll = F.cross_entropy(
            denoiser(c.x_t).logits.flatten(0, 1), tokens.flatten(), reduction="none"
        ).view_as(tokens)
        nats = (nll * valid).sum() / valid.sum().clamp_min(1)
        return LossOutput(nats, {"bits_per_token": nats.detach() / math.log(2)})

    def evaluate_at(self, denoiser, tokens: Tensor, t, generator=None) -> LevelEval:
        raise ValueError("the autoregressive baseline has no noise levels to evaluate at")

    def start(
        self,
        x: Tensor,
        ids: Tensor,
        editable: Tensor,
        seeded: Tensor,
        strength: float,
        generator,
    ) -> Tensor:
        """The sampler writes every position; the prompt is forced by ``hold_fixed``."""
        return x

    def hold_fixed(
        self, denoiser, ids: Tensor, editable: Tensor, generator
    ) -> ForcePrefix | FillInTheMiddle:
        """Forces a fixed prefix (a prompt). A fixed region after a generated one (infill=,
        edit=) needs right context, which a causal model reads only when trained to fill in
        the middle: then the sampler writes each gap after a FIM prompt of both sides."""
        fixed = ~editable
        after_open = torch.cummax(editable.long(), dim=1).values.bool()
        if not (fixed & after_open).any():
            return ForcePrefix(denoiser, ids, fixed)
        if self.fim is None:
            raise ValueError(
                "this autoregressive model sees only left context: it takes prompt=, not fixed "
                "regions after generated ones (infill=/edit=), unless trained to fill in the "
                "middle (process.fim_rate > 0)"
            )
        return FillInTheMiddle(denoiser, ids, editable, self.fim)


class ForcePrefix(Wrapper):
    """Makes the next-token distribution a point mass on the given token at fixed positions, so
    that any AR sampler reproduces the prompt (teacher forcing through the denoiser)."""

    def __init__(self, denoiser, ids: Tensor, fixed: Tensor) -> None:
        self.denoiser, self.ids, self.fixed = denoiser, ids, fixed

    def known_prefix(self) -> Tensor:
        """The leading positions fixed in every row, (B, P): a KV-cached sampler feeds them in
        one call (prefill) instead of one call per prompt token."""
        return self.ids[:, : int(self.prefix_lengths().min())]

    def prefix_lengths(self) -> Tensor:
        return self.fixed.long().cumprod(1).sum(1)

    def __call__(self, tokens: Tensor, t=None, self_cond=None, cache=None, **kw) -> Prediction:
        done = cache[0].length if cache is not None and len(cache) else 0
        pred = self.denoiser(tokens, t, self_cond, cache=cache, **kw)
        pos = done + tokens.shape[1] - 1  # the position the last output predicts
        if pos >= self.ids.shape[1]:
            return pred
        logits = pred.logits.clone()
        forced = torch.full_like(logits[:, -1], -torch.inf).scatter_(
            -1, self.ids[:, pos, None], 0.0
        )
        logits[:, -1] = torch.where(self.fixed[:, pos, None], forced, logits[:, -1])
        return Prediction(logits=logits)


class FillInTheMiddle(Wrapper):
    """A template for a FIM-trained model: the canvas ``ids`` and its ``editable`` gaps, which
    the AR sampler fills one by one, left to right (``cdlm.samplers.autoregressive``)."""

    def __init__(self, denoiser, ids: Tensor, editable: Tensor, sentinels: fim.FimIds) -> None:
        if (editable != editable[:1]).any():
            raise ValueError("a FIM batch shares one template: every row needs the same gaps")
        self.denoiser, self.ids, self.editable, self.sentinels = denoiser, ids, editable, sentinels

    def __call__(self, tokens: Tensor, t=None, self_cond=None, **kw) -> Prediction:
        """The model's own next-token logits: the sampler builds the FIM prompts."""
        return self.denoiser(tokens, t, self_cond, **kw)

    def gaps(self) -> list[tuple[int, int]]:
        """The [a, b) spans of editable positions, in order."""
        flags, spans, start = self.editable[0].tolist(), [], None
        for i, flag in enumerate([*flags, False]):
            if flag and start is None:
                start = i
            elif not flag and start is not None:
                spans.append((start, i))
                start = None
        return spans
