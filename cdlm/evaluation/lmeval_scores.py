"""What lm-evaluation-harness asks of a model, answered by a cdlm model: the log-likelihood of a
continuation given a context, the bound of a whole text, and a continuation sampled after a
prompt. Free of lm-eval itself (``cdlm.evaluation.lmeval`` adapts these to its API).

The log-likelihood is the process's own: exact for AR (next-token log-probabilities); for
masked, block and uniform the Monte Carlo estimate of the conditional ELBO of LLaDA (Nie et al.
2025, eq. 6: the context clean, the continuation corrupted at a stratified level, the loss on
the continuation weighted as the process's ELBO says), which is the process's own ``loss`` with
the context as a held prompt; for gaussian the VDM ELBO of the continuation with the context
held clean (``cdlm.likelihood.elbo`` with ``held``). A diffusion estimate is an upper bound on
-log p in expectation (exact for an exact denoiser of masked diffusion), averaged over
``draws`` corruptions drawn from one seeded generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cdlm import rng
from cdlm.generation import Plan, Row, generate_rows
from cdlm.likelihood.elbo import elbo
from cdlm.likelihood.terms import likelihood_denoiser
from cdlm.model_file import Model
from cdlm.modes import eval_mode


@dataclass(frozen=True)
class Score:
    """nats: -log p(continuation | context), exact or a draw-averaged bound; greedy: whether
    the continuation is the model's greedy choice (``continuation_score``); draws: the
    corruptions averaged (1 when exact)."""

    nats: float
    greedy: bool
    draws: int


def encode(model: Model, text: str) -> list[int]:
    """``text`` as the model's token ids, no special tokens (as a prompt is tokenised)."""
    return list(model.tokenizer(text, add_special_tokens=False)["input_ids"])


def split_pair(model: Model, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids): the pair tokenised as one text and cut where the
    context's own tokens end, so that a merge across the boundary (" yes" after "Answer:")
    tokenises as in running text; the two apart where the joint text does not start with them."""
    joint, head = encode(model, context + continuation), encode(model, context)
    if joint[: len(head)] == head and len(joint) > len(head):
        return head, joint[len(head) :]
    return head, encode(model, continuation)


def fit_context(context: list[int], continuation: list[int], seq_len: int) -> list[int]:
    """The context cut from the left so that the pair fits the model's ``seq_len`` (the length it
    was trained at); a continuation longer than that alone is refused."""
    if not continuation:
        raise ValueError("lm-eval asked for the likelihood of an empty continuation")
    if len(continuation) > seq_len:
        raise ValueError(
            f"a continuation of {len(continuation)} tokens is longer than the model's seq_len "
            f"{seq_len}"
        )
    return context[max(0, len(context) + len(continuation) - seq_len) :]


@torch.no_grad()
def continuation_score(
    model: Model,
    context: list[int],
    continuation: list[int],
    *,
    draws: int,
    seed: int,
    batch_size: int = 64,
) -> Score:
    """-log p(continuation | context) in nats (see the module docstring) and whether it is the
    greedy choice: for AR, every token the argmax of its next-token distribution; for diffusion,
    the argmax at every continuation position of one model call with the context clean and the
    continuation at the prior (all [MASK] for masked and block; t = 1 for gaussian, seeded) --
    the first step of a greedy decoder that commits every position at once."""
    if draws < 1:
        raise ValueError(f"mc_draws must be >= 1, got {draws}")
    process, network = model.process, model.network
    context = fit_context(context, continuation, model.config["seq_len"])
    device = next(network.parameters()).device
    ids = torch.tensor([context + continuation], device=device)
    held = torch.zeros_like(ids, dtype=torch.bool)
    held[:, : len(context)] = True
    with eval_mode(process, network):
        if process.exact_likelihood:
            return _exact(model, ids, held)
        generator = rng.generator(seed, device)
        if process.loss_is_bound:
            nats = _loss_bound(model, ids, held, draws, generator, batch_size)
        else:
            bound = elbo(
                likelihood_denoiser(process, network),
                process,
                ids,
                generator=generator,
                t_samples=draws,
                held=held,
            )
            nats = float(bound.total[0]) * len(continuation) * math.log(2)
        return Score(nats, _one_call_greedy(model, ids, held, generator), draws)


def _exact(model: Model, ids: torch.Tensor, held: torch.Tensor) -> Score:
    """The AR chain rule: next-token log-probabilities of the continuation, one pass."""
    denoiser = model.process.make_denoiser(model.network)
    logp = denoiser(denoiser.shift(ids)).logits.double().log_softmax(-1)
    scored = ~held[0]
    token = logp[0].gather(-1, ids[0, :, None]).squeeze(-1)
    greedy = bool((logp[0].argmax(-1) == ids[0])[scored].all())
    return Score(-float(token[scored].sum()), greedy, 1)


def _loss_bound(
    model: Model,
    ids: torch.Tensor,
    held: torch.Tensor,
    draws: int,
    generator: torch.Generator,
    batch_size: int,
) -> float:
    """The process's eval-mode loss on ``draws`` copies of the row, the context a held prompt
    (never corrupted, never scored), in batches of at most ``batch_size`` copies: the loss is
    nats per scored token, so times the scored count of a batch it is that batch's sum."""
    process = model.process
    denoiser = process.make_denoiser(model.network)
    if bool(held.any()):
        process.check_prompts(0.0)  # refuses a process that cannot hold a prompt clean
    scored, total = int((~held).sum()), 0.0
    for first in range(0, draws, batch_size):
        n = min(batch_size, draws - first)
        batch = {"tokens": ids.expand(n, -1), "prompt": held.expand(n, -1)}
        total += float(process.loss(denoiser, batch, generator).loss) * scored * n
    return total / draws


def _one_call_greedy(
    model: Model, ids: torch.Tensor, held: torch.Tensor, generator: torch.Generator
) -> bool:
    """Whether one call from the prior (context at level 0, continuation at level 1) puts its
    argmax on every continuation token (see ``continuation_score``)."""
    process = model.process
    levels = (~held).to(torch.float32)
    out = process.evaluate_at(process.make_denoiser(model.network), ids, levels, generator)
    return bool((out.logits[0].argmax(-1) == ids[0])[~held[0]].all())


def rolling_nats(model: Model, text: list[int], *, draws: int, seed: int) -> float:
    """-log p(text) in nats: the sum over disjoint windows of the model's ``seq_len`` tokens, each
    scored on its own (no context), as lm-eval's rolling windows do (exact for AR within a window;
    across windows the text's dependence is cut)."""
    length = model.config["seq_len"]
    windows = [text[a : a + length] for a in range(0, len(text), length)]
    return sum(
        continuation_score(model, [], w, draws=draws, seed=rng.member_seed(seed, k)).nats
        for k, w in enumerate(windows)
    )


def cut_at_stops(text: str, stops: list[str]) -> str:
    """``text`` up to the first occurrence of any stop string (all of it if none occurs)."""
    ends = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return text[: min(ends)] if ends else text


def sample_continuations(
    model: Model,
    sampler,
    steps: int,
    requests: list[tuple[str, int]],
    seed: int,
    batch_size: int | None = None,
) -> list[str]:
    """A continuation of each ``(prompt, max_new_tokens)``: that many positions after the prompt
    (fewer where the model's ``seq_len`` leaves less room; the prompt cut from the left to leave
    one at least), drawn by ``sampler`` in ``steps`` steps, ``batch_size`` different prompts per
    call (``cdlm.generation.generate_rows``; request r draws from seed ``rng.member_seed(seed, r)``, so it is
    the same alone or batched), and decoded up to the first EOS."""
    seq_len = model.config["seq_len"]
    rows = []
    for prompt, max_new_tokens in requests:
        new = max(1, min(max_new_tokens, seq_len - 1))
        ids = encode(model, prompt)
        if len(ids) + new > seq_len:
            prompt = model.tokenizer.decode(ids[len(ids) + new - seq_len :])
        rows.append(Row(prompt=prompt, max_new_tokens=new))
    plan = Plan(num_samples=1, seq_len=seq_len, steps=steps, seed=seed, batch_size=batch_size)
    return [r.completion for r in generate_rows(model, sampler, plan, rows).rows]
