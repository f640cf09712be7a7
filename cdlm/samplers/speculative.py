"""Lossless self-speculative decoding of a shifted block model (``sampler=speculative``).

A block model with a causal clean stream (``process.shift`` and ``process.causal_clean``, the
configs' default) is two models in one network: the noisy stream drafts a whole block in one
call, and the clean stream is an AR model whose outputs at the drafted positions are its
next-token distributions given the tokens before them. So one call verifies the last draft (its
clean chunk holds the draft as if accepted) and drafts the next block behind it (its window).

Acceptance is the speculative-sampling rule (Leviathan et al. 2023; Chen et al. 2023): draft
token d with draft probability p(d) is kept with probability min(1, q(d) / p(d)), q being the AR
distribution; at the first rejection a token is drawn from norm(max(0, q - p)). Every committed
token then follows q exactly, so the samples are the causal pass's AR samples; at temperature 0
it keeps the longest prefix agreeing with q's argmax and returns AR's greedy tokens exactly.
Rows share positions: each call commits the tokens every row accepted, plus one (a row that
accepted further keeps its draft token there, which is still an exact draw). Drafts end where
the training blocks end, so that a window's last predicted position is never a block's first (which
training always shows its clean left neighbour): after a rejection the draft runs to the end
of that block, then whole blocks again. A full acceptance
leaves the next draft valid (one call per block); a rejection costs one more call to redraft.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cdlm import rng
from cdlm.denoiser import Prediction
from cdlm.processes.block_denoiser import BlockDenoiser
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, register, sample_categorical
from cdlm.samplers.masked_steps import ended_at_eos


def probabilities(logp: Tensor, temperature: float) -> Tensor:
    """softmax(logp / T) in float64, (..., V); T = 0 is the argmax's point mass."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logp.argmax(-1), logp.shape[-1]).double()
    return (logp.double() / temperature).softmax(-1)


def draw(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One id per row of float64 probabilities (..., V) (not normalised), by inverse CDF."""
    cdf = probs.cumsum(-1)
    u = rng.rand(cdf.shape[:-1], generator, False, dtype=torch.float64, device=probs.device)
    return (
        torch.searchsorted(cdf, (u * cdf[..., -1])[..., None])
        .squeeze(-1)
        .clamp(max=probs.shape[-1] - 1)
    )


def accept(
    draft: Tensor, p: Tensor, q: Tensor, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """(accepted (B, n) bool, residual draws (B, n)): each draft token kept with probability
    min(1, q/p), and the token that replaces it if not, from norm(max(0, q - p))."""
    pd, qd = p.gather(-1, draft[..., None])[..., 0], q.gather(-1, draft[..., None])[..., 0]
    u = rng.rand(draft.shape, generator, False, dtype=torch.float64, device=draft.device)
    kept = u * pd < qd
    residual = (q - p).clamp_min(0.0)
    empty = residual.sum(-1, keepdim=True) <= 0  # p == q: a rejection cannot happen there
    return kept, draw(torch.where(empty, q, residual), generator)


def propose(logp: Tensor, temperature: float, generator) -> tuple[Tensor, Tensor]:
    """(draft (B, n), its probabilities (B, n, V) in float64) from a window's log-probs."""
    probs = probabilities(logp, temperature)
    if temperature == 0:
        return probs.argmax(-1), probs
    return sample_categorical(probs.log(), generator, 1.0), probs


def leading(kept: Tensor) -> Tensor:
    """(B,) the number of leading True per row of (B, n)."""
    return kept.long().cumprod(-1).sum(-1)


def commit(x: Tensor, p: int, draft: Tensor, per_row: Tensor, residual: Tensor) -> int:
    """Writes into x from p the draft tokens every row kept (m, returned) and, if some row
    rejected one, one more: its residual draw, or the kept draft token of a row that went on."""
    m = int(per_row.min())
    x[:, p : p + m] = draft[:, :m]
    if m < draft.shape[1]:
        x[:, p + m] = torch.where(per_row > m, draft[:, m], residual[:, m])
    return m


def prompt_length(x: Tensor, mask_id: int) -> int:
    """The fixed prefix every row shares; refuses fixed tokens after the first [MASK]."""
    open_ = x == mask_id
    first = int(open_.any(0).long().argmax()) if bool(open_.any()) else x.shape[1]
    if not bool(open_[:, first:].all()):
        raise ValueError(
            "sampler=speculative continues a prompt left to right; it cannot keep fixed "
            "tokens after the first gap (infill or edit with a sampler that sees the text on "
            "both sides: a masked model's sampler=exact_k or sampler=ancestral, or a gaussian one)"
        )
    return first


class SeparateVerifier:
    """Verification by a separate AR model (a ``NextTokenPredictor``, e.g. the checkpoint the
    block model started from) on its own KV cache: one more call per draft, for comparing with
    the block model's own causal pass (docs/speed.md)."""

    def __init__(self, predictor) -> None:
        self.predictor, self.kv = predictor, predictor.new_cache()

    def __call__(self, tentative: Tensor, p: int, n: int) -> tuple[Tensor, int]:
        """(raw logits (B, n, V) for positions p..p+n-1 of ``tentative``, positions run)."""
        a = self.kv.length
        inputs = self.predictor.shift(tentative)[:, a : p + n]
        return self.predictor(inputs, cache=self.kv).logits[:, -n:], p + n - a


def check_verifiable(denoiser, process, separate: bool, temperature: float) -> None:
    """Clear errors for what speculative decoding cannot verify."""
    if not isinstance(denoiser, BlockDenoiser) or not (process.verifies or separate):
        raise ValueError(
            "sampler=speculative verifies drafts with the block model's own causal clean stream "
            "in the same call: it needs process.shift=true and process.causal_clean=true, and "
            "takes no guidance or label (use sampler=block for those)"
        )
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")


@register("speculative", processes=("block",))
@torch.no_grad()
def sample_speculative(
    denoiser: BlockDenoiser,
    x: Tensor,
    timesteps: Tensor,
    *,
    process,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
    stop_at_eos: bool = True,
    verifier=None,
) -> SampleOutput:
    """Self-speculative decoding (module docstring) of the canvas x (B, L) after its prompt, in
    drafts of the process's block size; ``timesteps`` is ignored (a draft is one call).
    ``temperature`` applies to both the draft and the AR distribution (0: greedy). With
    ``stop_at_eos`` it stops once every row has produced EOS. ``verifier``: a separate AR
    model's ``NextTokenPredictor`` to verify with instead of the model's own causal pass (one
    more call per draft). ``stats``: ``accepted_per_call`` (tokens committed per network call),
    ``accepted_per_draft`` (draft tokens kept per verified draft, before the one drawn at a
    rejection) and the number of ``drafts``."""
    separate = None if verifier is None else SeparateVerifier(verifier)
    check_verifiable(denoiser, process, separate is not None, temperature)
    x, length, k = x.clone(), x.shape[1], process.block_size
    kv, mask_id = denoiser.new_cache(), process.mask_id
    p = start = prompt_length(x, mask_id)
    nfe = positions = drafts = kept = 0
    draft = draft_p = None

    def call(canvas: Tensor, a: int, b: int):
        """One network call: the clean positions the cache lacks up to a written (a draft
        there is verified by them), the window [a, b) drafted behind them."""
        nonlocal nfe, positions
        window = torch.arange(a, b, device=x.device)
        nfe, positions = nfe + 1, positions + a - kv.length + len(denoiser.window_positions(window))
        return denoiser.chunk(canvas, window, kv, start=a)

    while p < length:
        n = min(k - p % k, length - p)  # drafts end where the training blocks end
        if draft is None:  # after the prompt or a rejection: a draft-only call
            chunk = call(x, p, p + n)
            draft, draft_p = propose(
                denoiser.parameterize(chunk.window, x[:, p : p + n]).logits, temperature, generator
            )
        tentative = x.clone()
        tentative[:, p : p + n] = draft
        n_next = min(k, length - p - n)
        chunk = call(tentative, p + n, p + n + n_next)  # verifies the draft, drafts the next
        q_raw = chunk.clean[:, -n:]
        if separate is not None:
            (q_raw, ran), nfe = separate(tentative, p, n), nfe + 1
            positions += ran
        q_logp = denoiser.parameterize(q_raw, draft, subs=False).logits
        kept_here, residual = accept(draft, draft_p, probabilities(q_logp, temperature), generator)
        before, m = p, commit(x, p, draft, leading(kept_here), residual)
        drafts, kept, p, draft = drafts + 1, kept + m, p + min(m + 1, n), None
        if m == n and n_next:  # every row kept it all: the window behind it is the next draft
            window = denoiser.parameterize(chunk.window, tentative[:, p : p + n_next])
            draft, draft_p = propose(window.logits, temperature, generator)
        elif m < n:  # the clean positions whose input was a dropped draft token are stale
            for cache in (kv, None if separate is None else separate.kv):
                if cache is not None:
                    cache.truncate(p)
        ended = ended_at_eos(x, p, process.eos_id, mask_id) if stop_at_eos else None
        x = x if ended is None else ended
        if callback is not None:
            t, s = 1.0 - before / length, 0.0 if ended is not None else 1.0 - p / length
            callback(StepInfo(i=drafts - 1, t=t, s=s, x=x.clone(), prediction=Prediction(q_logp)))
        if ended is not None:
            break
    stats = {
        "accepted_per_call": (p - start) / max(nfe, 1),
        "accepted_per_draft": kept / max(drafts, 1),
        "drafts": float(drafts),  # verifying calls (the separate verifier's not counted)
        "draft_calls": float(nfe - drafts * (2 if separate else 1)),  # draft-only calls
    }
    return SampleOutput(x=x, tokens=x, prediction=None, nfe=nfe, positions=positions, stats=stats)
