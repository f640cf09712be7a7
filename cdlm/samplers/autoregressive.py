"""Left-to-right sampling for the autoregressive baseline, with a KV cache."""

from __future__ import annotations

import torch
from torch import Tensor

from cdlm import rng
from cdlm.processes import fim
from cdlm.processes.autoregressive import (
    AutoregressiveProcess,
    FillInTheMiddle,
    NextTokenPredictor,
)
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, register, sample_categorical


@register("ar", processes=("autoregressive",))
@torch.no_grad()
def sample_ar(
    denoiser: NextTokenPredictor,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: AutoregressiveProcess,
    generator: rng.Draws = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
    use_cache: bool = True,
    stop_at_eos: bool = True,
    fim_mode: str = "psm",
    fixed_shape: bool = False,
    graph: bool = False,
) -> SampleOutput:
    """Ancestral sampling, one token per network call; ``timesteps`` is ignored (the sequence
    length sets the number of calls). With ``use_cache`` each call feeds one new position and
    attends to the cached keys/values (positions processed = tokens made), after one prefill call
    over a fixed prompt (the denoiser's ``known_prefix``, from ``hold_fixed``); without it every
    call reruns the whole prefix (the reference the cache is tested against). With
    ``stop_at_eos`` it stops once every row has produced EOS (the process's BOS id, which is the
    tokenizer's EOS) and later positions become EOS; without, it fills the whole canvas (EOS then
    separates paragraphs, as in packed training data). ``fixed_shape``: decode over a fixed-shape
    cache (``cdlm.networks.fixed_cache``: every one-token call has the same shapes; the same
    tokens); ``graph`` (CUDA only): that step replayed from a CUDA graph, captured at its first
    call, which saves the per-kernel launches that bound decoding at batch 1 on a GPU. An infill or edit template on a FIM-trained model (a ``FillInTheMiddle`` denoiser, from
    ``hold_fixed``) goes to ``sample_middles``, with ``fim_mode`` its prompt order. A FIM
    model's sentinels are never written: each draw is over the text tokens only."""
    if isinstance(denoiser, FillInTheMiddle):
        if fixed_shape or graph:
            raise ValueError("sampler.fixed_shape and sampler.graph decode left to right, not FIM")
        return sample_middles(
            denoiser,
            process.bos_id,
            generator=generator,
            callback=callback,
            temperature=temperature,
            use_cache=use_cache,
            mode=fim_mode,
        )
    cache = _cache(denoiser, x, use_cache, fixed_shape, graph)
    x, (batch, length) = x.clone(), x.shape
    eos = process.bos_id
    step_input = torch.full((batch, 1), eos, dtype=torch.long, device=x.device)
    done = torch.zeros(batch, dtype=torch.bool, device=x.device)
    positions, pred, i, first = 0, None, -1, 0
    prompt = denoiser.known_prefix() if use_cache else None
    if prompt is not None:  # prefill: the prompt but its last token in one call
        first = max(prompt.shape[1] - 1, 0)
        x[:, :first] = prompt[:, :first]
        step_input = torch.cat([step_input, x[:, :first]], 1)
    starts = _starts(denoiser, generator, first, batch, x.device) if use_cache else None
    every_row = first if starts is None else int(starts.max())  # from here every row draws
    for i in range(first, length):
        if use_cache:
            pred = denoiser(step_input, cache=cache)
            positions += step_input.shape[1]
        else:
            pred = denoiser(denoiser.shift(x)[:, : i + 1])
            positions += i + 1
        logp = text_only(pred.logits[:, -1], process.fim)
        if i >= every_row:
            token = sample_categorical(logp, generator, temperature)
        else:  # a row before its start is in its prompt: its (forced) token, no draw
            token, live = logp.argmax(-1), i >= (first if starts is None else starts)
            token[live] = sample_categorical(logp[live], rng.select(generator, live), temperature)
        x[:, i] = torch.where(done, eos, token)
        step_input = x[:, i : i + 1]
        done |= (x[:, i] == eos) & stop_at_eos
        if callback is not None:
            callback(
                StepInfo(
                    i=i, t=1.0 - i / length, s=1.0 - (i + 1) / length, x=x.clone(), prediction=pred
                )
            )
        if done.all():
            x[:, i + 1 :] = eos
            break
    return SampleOutput(x=x, tokens=x, prediction=pred, nfe=i + 1 - first, positions=positions)


def _cache(
    denoiser: NextTokenPredictor, x: Tensor, use_cache: bool, fixed_shape: bool, graph: bool
):
    """The decode's KV cache: growing, fixed-shape (``fixed_shape``, or ``graph`` on CUDA), or
    none (``use_cache`` false)."""
    fixed = fixed_shape or graph
    if fixed and not use_cache:
        raise ValueError(
            "sampler.fixed_shape and sampler.graph decode with the KV cache (use_cache)"
        )
    if graph and x.device.type != "cuda":
        raise ValueError(
            f"sampler.graph=true replays the decode step from a CUDA graph and needs a CUDA "
            f"device; the model is on {x.device.type} (sampler.fixed_shape=true runs the same "
            "fixed-shape step without the graph)"
        )
    if fixed:
        return denoiser.new_fixed_cache(*x.shape, graph)
    return denoiser.new_cache() if use_cache else None


def text_only(logits: Tensor, sentinels: fim.FimIds | None) -> Tensor:
    """Log-probabilities (B, V) renormalised over the text tokens: a FIM model puts mass on its
    sentinels (it was trained to write ``<fim_end>`` and to read the others), and a sentinel
    written into a canvas is no text of the data (a world's scorer refuses it)."""
    if sentinels is not None:
        logits = logits.clone()
        logits[:, sentinels.as_list()] = -torch.inf
    return logits.log_softmax(-1)


def _starts(
    denoiser: NextTokenPredictor, generator: rng.Draws, first: int, batch: int, device
) -> Tensor:
    """(B,) the position of each row's first draw in a cached run: ``first`` (after the prefill
    shared by the batch), or with per-row generators (``rng.Rows``) the row's own prompt end, as if it were
    prefilled alone, so that a row with a longer prompt than its batch's shortest draws the same
    numbers as alone (its prompt tokens are forced without a draw)."""
    lengths = denoiser.prefix_lengths()
    if not isinstance(generator, rng.Rows) or lengths is None:
        return torch.full((batch,), first, device=device)
    return (lengths - 1).clamp_min(0)


def sample_middles(
    denoiser: FillInTheMiddle,
    bos_id: int,
    *,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
    use_cache: bool = True,
    mode: str = "psm",
) -> SampleOutput:
    """Fills a template's gaps left to right, each after the FIM prompt of its two sides: the
    prefix is the whole canvas before the gap (earlier gaps filled), the suffix the fixed text up
    to the next gap. The template gives each gap's length, so a gap gets exactly that many
    tokens (the sentinels, the end one included, are never drawn), as a diffusion sampler's
    does. One call per token; the first call of a gap reads its whole prompt."""
    x, (_, length) = denoiser.ids.clone(), denoiser.ids.shape
    gaps = denoiser.gaps()
    total = sum(b - a for a, b in gaps)
    calls = positions = written = 0
    pred = None
    for k, (a, b) in enumerate(gaps):
        stop = gaps[k + 1][0] if k + 1 < len(gaps) else length
        head = fim.prompt(x[:, :a], x[:, b:stop], denoiser.sentinels, mode)
        bos = torch.full_like(head[:, :1], bos_id)
        context = torch.cat([bos, head], 1)
        cache = denoiser.new_cache() if use_cache else None
        step_input = context
        for i in range(a, b):
            pred = denoiser(step_input, cache=cache) if use_cache else denoiser(context)
            calls, positions = calls + 1, positions + step_input.shape[1]
            logp = text_only(pred.logits[:, -1], denoiser.sentinels)
            x[:, i] = sample_categorical(logp, generator, temperature)
            context = torch.cat([context, x[:, i : i + 1]], 1)
            step_input = x[:, i : i + 1] if use_cache else context
            written += 1
            if callback is not None:
                t, s = 1.0 - (written - 1) / total, 1.0 - written / total
                callback(StepInfo(i=written - 1, t=t, s=s, x=x.clone(), prediction=pred))
    return SampleOutput(x=x, tokens=x, prediction=pred, nfe=calls, positions=positions)
