"""The whole evaluation of one checkpoint and sampler: quality beside real text, likelihood,
speed and work, in one report dict (see ``report.py`` for its markdown form)."""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable

import torch

from cdlm.checkpoint import Model, load_checkpoint
from cdlm.evaluation.quality import Scorer, diversity, generative_perplexity
from cdlm.evaluation.speed import measure
from cdlm.generate import decode, default_sampler
from cdlm.likelihood.elbo import elbo
from cdlm.likelihood.evaluate import evaluate, validation_tokens
from cdlm.rng import mixed_seed


@torch.no_grad()
def val_bits_per_token(model: Model, tokens: torch.Tensor, seed: int, batch_size: int = 32) -> dict:
    """The process's own bound on the val split: AR exact NLL, masked ELBO (the training loss
    with stratified t), gaussian VDM ELBO (``cdlm.likelihood.elbo``)."""
    if model.process.kind == "gaussian":
        result = evaluate(model, elbo, tokens, batch_size=batch_size, num_batches=None, seed=seed)
        return {
            "kind": "ELBO bound",
            "bits_per_token": result["bits_per_token"]["total"],
            "terms": result["bits_per_token"],
            "sequences": result["sequences"],
        }
    torch.manual_seed(mixed_seed(seed))
    device = next(model.network.parameters()).device
    den = model.process.make_denoiser(model.network)
    nats = sum(
        model.process.loss(den, b.to(device)).loss.item() * len(b) for b in tokens.split(batch_size)
    )
    kind = "exact NLL" if model.process.kind == "autoregressive" else "ELBO bound"
    return {
        "kind": kind,
        "bits_per_token": nats / len(tokens) / math.log(2),
        "sequences": len(tokens),
    }


def text_quality(token_lists: list[list[int]], texts: list[str], scorer: Scorer | None) -> dict:
    out = diversity(token_lists)
    if scorer is not None:
        ppl = generative_perplexity(texts, scorer)
        out |= {"gen_ppl": ppl.ppl, "scored_tokens": ppl.scored_tokens, "unscored": ppl.skipped}
    return out


def evaluate_checkpoint(
    ckpt: str,
    sampler: Callable | None,
    *,
    steps: int,
    num_samples: int,
    seed: int,
    repeats: int,
    grid: str,
    scorer: Scorer | None,
    device: torch.device,
    data_path: str | None = None,
    likelihood_sequences: int | None = None,
    cut_at_eos: bool = True,
    temperature: float = 1.0,
) -> dict:
    """Loads, samples (1 warm-up + ``repeats`` timed runs, batch = ``num_samples``), scores the
    samples and as many real val sequences cut to the same lengths, and computes the val bound
    on the first ``likelihood_sequences`` val sequences (None: all). ``cut_at_eos=False`` scores
    whole canvases (EOS as line breaks): equal length for every model and sampler.
    ``temperature``: the gaussian x0 softmax temperature (``cdlm.generate.generate``)."""
    start = time.perf_counter()
    model = load_checkpoint(ckpt, device)
    load_seconds = time.perf_counter() - start
    sampler = sampler or default_sampler(model.process)
    seq_len = model.config["seq_len"]
    speed = measure(
        model,
        sampler,
        repeats,
        steps=steps,
        num_samples=num_samples,
        seq_len=seq_len,
        seed=seed,
        grid=grid,
        cut_at_eos=cut_at_eos,
        temperature=temperature,
    )
    samples = speed.pop("generation").samples
    val = validation_tokens(model, data_path)
    # Real text at equal length: the first len(sample i) tokens of val sequence i, its EOS
    # (paragraph ends) kept as line breaks.
    reference = [
        decode(model.tokenizer, row[: max(2, len(s.token_ids))], cut_at_eos=False)
        for row, s in zip(val.tolist(), samples, strict=False)
    ]
    options = {k: v for k, v in getattr(sampler, "keywords", {}).items()}
    return {
        "model": {
            "ckpt": str(ckpt),
            "process": model.process.kind,
            "seq_len": seq_len,
            "parameters": sum(
                p.numel() for m in (model.process, model.network) for p in m.parameters()
            ),
            "tokenizer": f"{type(model.tokenizer).__name__}, vocab {len(model.tokenizer)}",
        },
        "sampler": {
            "name": getattr(getattr(sampler, "func", sampler), "sampler_name", "?"),
            "options": options,
            "steps": steps,
            "grid": grid,
            "temperature": temperature,
        },
        "batch_size": num_samples,
        "seed": seed,
        "repeats": repeats,
        "cut_at_eos": cut_at_eos,
        "environment": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "device": str(device) if device.type != "cpu" else f"cpu ({platform.machine()})",
        },
        "load_seconds": load_seconds,
        "speed": speed,
        "quality": {
            "scorer": scorer.name if scorer else None,
            "samples": text_quality(
                [s.token_ids for s in samples], [s.text for s in samples], scorer
            ),
            "reference": text_quality(
                [r.token_ids for r in reference], [r.text for r in reference], scorer
            ),
        },
        "likelihood": val_bits_per_token(model, val[:likelihood_sequences], seed),
        "samples": [s.text for s in samples],
    }
