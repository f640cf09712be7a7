"""The whole evaluation of one checkpoint and sampler: quality beside real text, likelihood,
speed and work, in one report dict (see ``report.py`` for its markdown form)."""

from __future__ import annotations

import math
import platform
import sys
import time
from collections.abc import Callable

import torch

from cdlm.evaluation.quality import Scorer, diversity, generative_perplexity, scorer_is_base
from cdlm.evaluation.speed import measure
from cdlm.likelihood.elbo import elbo
from cdlm.likelihood.evaluate import evaluate, validation_tokens
from cdlm.model_file import Model, load_model
from cdlm.progress import progress
from cdlm.rng import seeded
from cdlm.sampling import Plan, check_whole_canvases, choose, decode


@torch.no_grad()
def val_bits_per_token(
    model: Model, tokens: torch.Tensor, seed: int, batch_size: int = 32, draws: int = 1
) -> dict:
    """The process's own bound on the val split: AR exact NLL, masked ELBO (the training loss
    with stratified t), gaussian VDM ELBO (``cdlm.likelihood.elbo``).

    A diffusion bound is a Monte Carlo estimate (one t and noise draw per sequence): on a
    ~140-sequence split one draw varies by ~0.2 bits between seeds, so ``draws`` passes with
    seeds seed, seed + 1, ... are averaged and their standard error is reported. The AR NLL is
    exact: one pass."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    if model.process.exact_likelihood:
        draws = 1
    passes = [_one_draw(model, tokens, seed + d, batch_size) for d in range(draws)]
    values = [p["bits_per_token"] for p in passes]
    mean = sum(values) / draws
    spread = sum((v - mean) ** 2 for v in values) / max(1, draws - 1)
    kind = "exact NLL" if model.process.exact_likelihood else "ELBO bound"
    out = {"kind": kind, "bits_per_token": mean, "sequences": len(tokens), "draws": draws}
    if draws > 1:
        out |= {"std_error": math.sqrt(spread / draws), "per_draw": values}
    if "terms" in passes[0]:
        out["terms"] = {k: sum(p["terms"][k] for p in passes) / draws for k in passes[0]["terms"]}
    return out


def _one_draw(model: Model, tokens: torch.Tensor, seed: int, batch_size: int) -> dict:
    """One noise draw of the bound: the process's own eval-mode loss where that is a bound (or
    exact), else (a CE-trained gaussian model) the VDM ELBO of ``cdlm.likelihood``. PAD
    positions are not scored."""
    if not model.process.loss_is_bound:
        result = evaluate(
            model,
            elbo,
            tokens,
            batch_size=batch_size,
            num_batches=None,
            seed=seed,
            desc="val bound (ELBO) batch",
        )
        return {
            "bits_per_token": result["bits_per_token"]["total"],
            "terms": result["bits_per_token"],
        }
    device = next(model.network.parameters()).device
    den = model.process.make_denoiser(model.network)
    pad = model.tokenizer.pad_token_id
    nats, counted = 0.0, 0
    with seeded(seed, device):  # the process's loss draws its levels from the global stream
        for b in progress(tokens.split(batch_size), "val bound batch"):
            b = b.to(device)
            valid = b != pad if pad is not None else torch.ones_like(b, dtype=torch.bool)
            n = int(valid.sum())
            nats += model.process.loss(den, {"tokens": b, "valid": valid}).loss.item() * n
            counted += n
    return {"bits_per_token": nats / max(counted, 1) / math.log(2)}


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
    steps: int | None,
    num_samples: int,
    seed: int,
    repeats: int,
    grid: str,
    scorer: Scorer | None,
    device: torch.device,
    data_path: str | None = None,
    likelihood_sequences: int | None = None,
    likelihood_draws: int = 1,
    cut_at_eos: bool = True,
    temperature: float = 1.0,
) -> dict:
    """Loads, samples (1 warm-up + ``repeats`` timed runs, batch = ``num_samples``), scores the
    samples and as many real val sequences cut to the same lengths, and computes the val bound
    on the first ``likelihood_sequences`` val sequences (None: all), averaged over
    ``likelihood_draws`` noise draws (``val_bits_per_token``). ``cut_at_eos=False`` scores
    whole canvases (EOS as line breaks): equal length for every model and sampler; a sampler
    that pads after EOS is refused then (``check_whole_canvases``). ``temperature``: the
    gaussian x0 softmax temperature (the process's sampling denoiser)."""
    start = time.perf_counter()
    model = load_model(ckpt, device)
    load_seconds = time.perf_counter() - start
    choice = choose(model.process, model.config, steps, sampler)
    if choice.note:
        print(f"cdlm-eval: {choice.note}", file=sys.stderr)
    judged_by_base = scorer is not None and scorer_is_base(scorer.name, model.config.get("base"))
    if judged_by_base:
        print(
            f"cdlm-eval: warning: the scorer {scorer.name} is of the family of this model's base "
            f"({model.config['base']['name']}), which flatters its gen-PPL; an independent "
            "scorer: scorer=gemma3_270m (docs/evaluation.md)",
            file=sys.stderr,
        )
    check_whole_canvases(choice.sampler, cut_at_eos)
    plan = Plan(
        num_samples=num_samples,
        seq_len=model.config["seq_len"],
        steps=choice.steps,
        seed=seed,
        grid=grid,
        denoising={"temperature": temperature},
        cut_at_eos=cut_at_eos,
    )
    speed = measure(model, choice.sampler, plan, repeats)
    samples = speed.generation.samples
    val = validation_tokens(model, data_path)
    return {
        "model": _model_facts(model, ckpt),
        "sampler": {
            "name": choice.name,
            "options": choice.options,
            "steps": plan.steps,
            "grid": grid,
            "temperature": temperature,
        },
        "batch_size": num_samples,
        "seed": seed,
        "repeats": repeats,
        "cut_at_eos": cut_at_eos,
        "environment": _environment(device),
        "load_seconds": load_seconds,
        "speed": speed.as_dict(),
        "quality": {
            "scorer": scorer.name if scorer else None,
            "scorer_is_base": judged_by_base,
            "samples": text_quality(
                [s.token_ids for s in samples], [s.text for s in samples], scorer
            ),
            "reference": _reference_quality(model, val, samples, scorer),
        },
        "likelihood": val_bits_per_token(
            model, val[:likelihood_sequences], seed, draws=likelihood_draws
        ),
        "samples": [s.text for s in samples],
    }


def _reference_quality(model: Model, val: torch.Tensor, samples, scorer: Scorer | None) -> dict:
    """Real text at equal length: the first len(sample i) tokens of val sequence i, its EOS
    (paragraph ends) kept as line breaks."""
    reference = [
        decode(model.tokenizer, row[: max(2, len(s.token_ids))], cut_at_eos=False)
        for row, s in zip(val.tolist(), samples, strict=False)
    ]
    return text_quality([r.token_ids for r in reference], [r.text for r in reference], scorer)


def _model_facts(model: Model, ckpt: str) -> dict:
    modules = (model.process, model.network)
    return {
        "ckpt": str(ckpt),
        "process": model.process.kind,
        "seq_len": model.config["seq_len"],
        "parameters": sum(p.numel() for m in modules for p in m.parameters()),
        "tokenizer": f"{type(model.tokenizer).__name__}, vocab {len(model.tokenizer)}",
    }


def _environment(device: torch.device) -> dict:
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": str(device) if device.type != "cpu" else f"cpu ({platform.machine()})",
    }


def card_metrics(result: dict, command: str) -> dict:
    """A full report's figures for a model card (``cdlm.hub.record_metrics``)."""
    bound, quality = result["likelihood"], result["quality"]
    sampler = result["sampler"]
    how = (
        f"{quality['scorer'] or 'no scorer'}; {result['batch_size']} samples, sampler "
        f"{sampler['name']}, {sampler['steps']} steps, seed {result['seed']}"
    )
    out = {
        "bits_per_token": bound["bits_per_token"],
        "bound_how": f"{bound['kind']} on {bound['sequences']} val sequences, "
        f"{bound['draws']} draw(s)",
        "token_entropy_bits": quality["samples"]["token_entropy_bits"],
        "distinct_2": quality["samples"]["distinct_2"],
        "gen_ppl_how": how,
        "source": command,
    }
    if "std_error" in bound:
        out["bits_per_token_std_error"] = bound["std_error"]
    if "gen_ppl" in quality["samples"]:
        out["gen_ppl"] = quality["samples"]["gen_ppl"]
    return out
