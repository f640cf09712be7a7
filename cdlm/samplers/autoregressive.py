"""Left-to-right sampling for the autoregressive baseline, with a KV cache."""

from __future__ import annotations

import torch
from torch import Tensor

from cdlm.processes.autoregressive import AutoregressiveProcess, NextTokenPredictor
from cdlm.samplers.base import Callback, SampleOutput, StepInfo, register, sample_categorical


@register("ar", processes=("autoregressive",))
@torch.no_grad()
def sample_ar(
    denoiser: NextTokenPredictor,
    x: Tensor,
    timesteps: Tensor,
    *,
    process: AutoregressiveProcess,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    temperature: float = 1.0,
    use_cache: bool = True,
    stop_at_eos: bool = True,
) -> SampleOutput:
    """Ancestral sampling, one token per network call; ``timesteps`` is ignored (the sequence
    length sets the number of calls). With ``use_cache`` each call feeds one new position and
    attends to the cached keys/values (positions processed = tokens made), after one prefill call
    over a fixed prompt (the denoiser's ``known_prefix``, from ``hold_fixed``); without it every
    call reruns the whole prefix (the reference the cache is tested against). With
    ``stop_at_eos`` it stops once every row has produced EOS (the process's BOS id, which is the
    tokenizer's EOS) and later positions become EOS; without, it fills the whole canvas (EOS then
    separates paragraphs, as in packed training data)."""
    x, (batch, length) = x.clone(), x.shape
    eos = process.bos_id
    cache = denoiser.network.new_cache() if use_cache else None
    step_input = torch.full((batch, 1), eos, dtype=torch.long, device=x.device)
    done = torch.zeros(batch, dtype=torch.bool, device=x.device)
    positions, pred, i, first = 0, None, -1, 0
    known = getattr(denoiser, "known_prefix", None)
    if use_cache and known is not None:  # prefill: the prompt but its last token in one call
        prompt = known()
        first = max(prompt.shape[1] - 1, 0)
        x[:, :first] = prompt[:, :first]
        step_input = torch.cat([step_input, x[:, :first]], 1)
    for i in range(first, length):
        if use_cache:
            pred = denoiser(step_input, cache=cache)
            positions += step_input.shape[1]
        else:
            pred = denoiser(denoiser.shift(x)[:, : i + 1])
            positions += i + 1
        token = sample_categorical(pred.logits[:, -1].log_softmax(-1), generator, temperature)
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
