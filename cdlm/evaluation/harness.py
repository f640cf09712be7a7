"""The whole evaluation of one checkpoint and sampler: quality beside real text, likelihood,
speed and work, in one report dict (see ``report.py`` for its markdown form)."""

from __future__ import annotations

import math
import platform
import sys
import time
from collections.abc import Callable

import torch

from cdlm import worlds
from cdlm.evaluation.quality import Scorer, diversity, generative_perplexity, scorer_is_base
from cdlm.evaluation.speed import measure
from cdlm.evaluation.world_score import LN2, canvas, entropy_rate_bits, world_quality
from cdlm.likelihood.elbo import elbo
from cdlm.likelihood.evaluate import evaluate, validation_tokens
from cdlm.model_file import Model, load_model
from cdlm.progress import progress
from cdlm.rng import generator, seeded
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
    world: str | None = None,
    model_options: dict | None = None,
) -> dict:
    """Loads, samples (1 warm-up + ``repeats`` timed runs, batch = ``num_samples``), scores the
    samples and as many real val sequences cut to the same lengths, and computes the val bound
    on the first ``likelihood_sequences`` val sequences (None: all), averaged over
    ``likelihood_draws`` noise draws (``val_bits_per_token``). ``cut_at_eos=False`` scores
    whole canvases (EOS as line breaks): equal length for every model and sampler; a sampler
    that pads after EOS is refused then (``check_whole_canvases``). ``temperature``: the
    gaussian x0 softmax temperature (the process's sampling denoiser). ``world``
    (``world:<name>``, ``scorer=world``): the samples are scored by that world instead, beside
    exact samples, and the bound is taken on exact samples (``world_sections``).
    ``model_options``: ``load_model``'s keywords (a world oracle's process)."""
    start = time.perf_counter()
    model = load_model(ckpt, device, **(model_options or {}))
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
    judge = None if world is None else world_of(model, world)  # before the sampling, not after
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
    if judge is None:
        val = validation_tokens(model, data_path)
        quality = {
            "scorer": scorer.name if scorer else None,
            "scorer_is_base": judged_by_base,
            "samples": text_quality(
                [s.token_ids for s in samples], [s.text for s in samples], scorer
            ),
            "reference": _reference_quality(model, val, samples, scorer),
        }
        likelihood = val_bits_per_token(
            model, val[:likelihood_sequences], seed, draws=likelihood_draws
        )
    else:
        quality, likelihood = world_sections(
            model, judge, world, samples, seed, likelihood_sequences, likelihood_draws
        )
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
        "quality": quality,
        "likelihood": likelihood,
        "samples": [s.text for s in samples],
    }


WORLD_SEQUENCES = 256  # exact samples the bound is taken on when no count is given


def world_of(model: Model, spec: str) -> worlds.World:
    """The world ``spec`` that is to score ``model``'s samples, refused unless its vocabulary is
    the model's (a model judged by another world's ids would be scored as noise)."""
    world = worlds.load(spec)
    if model.tokenizer.get_vocab() != world.tokenizer.get_vocab():
        raise ValueError(
            f"the model's vocabulary is not {spec}'s; scorer=world:<name> names the world the "
            "model was trained on (scorer=world: the one it records)"
        )
    return world


def world_sections(
    model: Model,
    world: worlds.World,
    spec: str,
    samples,
    seed: int,
    sequences: int | None,
    draws: int,
) -> tuple[dict, dict]:
    """``scorer=world``: the quality section (``world_score.world_quality``: the whole canvases
    of the samples scored by the world ``spec``, beside exact samples), and the likelihood
    section: the model's bound on ``sequences`` exact samples (the bundled corpus is not the
    world's), its entropy rate, and the difference, the model's excess bits per token; beside
    them the world's own NLL of those very sequences (bound minus it: the same excess without
    the sampling noise of the set, a paired estimate)."""
    length = model.config["seq_len"]
    stream = generator(seed)  # one stream: floors, reference and bound sets all differ
    tokens = canvas([s.token_ids for s in samples], length, world.tokenizer.eos_token_id)
    quality = world_quality(world, spec, tokens, generator=stream)
    exact = world.sample(sequences or WORLD_SEQUENCES, length, generator=stream)
    bound = val_bits_per_token(model, exact, seed, draws=draws)
    rate = entropy_rate_bits(world, length)
    return quality, bound | {
        "data": f"{len(exact)} exact {spec} samples",
        "entropy_rate_bits": rate,
        "exact_nll_bits": float(-world.log_prob(exact).mean()) / length / LN2,
        "excess_bits": bound["bits_per_token"] - rate,
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
    data = bound.get("data") or f"{bound['sequences']} val sequences"  # a world's: exact samples
    out = {
        "bits_per_token": bound["bits_per_token"],
        "bound_how": f"{bound['kind']} on {data}, {bound['draws']} draw(s){_excess(bound)}",
        "token_entropy_bits": quality["samples"]["token_entropy_bits"],
        "distinct_2": quality["samples"]["distinct_2"],
        "gen_ppl_how": how,
        "source": command,
    }
    if "excess_bits" in bound:
        out["excess_bits"] = bound["excess_bits"]
    if "std_error" in bound:
        out["bits_per_token_std_error"] = bound["std_error"]
    if "gen_ppl" in quality["samples"]:
        out["gen_ppl"] = quality["samples"]["gen_ppl"]
    return out


def _excess(bound: dict) -> str:
    """A world bound's entropy rate and excess bits, for the card's "how" column."""
    if "excess_bits" not in bound:
        return ""
    return (
        f"; entropy rate {bound['entropy_rate_bits']:.4f}, excess "
        f"{bound['excess_bits']:.4f} bits/token"
    )
