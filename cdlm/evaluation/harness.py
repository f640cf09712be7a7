"""The whole evaluation of one checkpoint and sampler: quality beside real text, likelihood,
speed and work, in one report dict (see ``report.py`` for its markdown form); ``report`` is
``cdlm-eval metric=report`` (conf/metric/report.yaml)."""

from __future__ import annotations

import functools
import math
import platform
import sys
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig

from cdlm.evaluation.bound import val_bits_per_token
from cdlm.evaluation.metric import Loaded, Measured, load, scorer_of
from cdlm.evaluation.quality import Scorer, diversity, generative_perplexity, scorer_is_base
from cdlm.evaluation.report import log_to_wandb, summary_markdown
from cdlm.evaluation.speed import measure
from cdlm.evaluation.world_score import world_of, world_sections, world_spec
from cdlm.generation import Plan, Sample, check_whole_canvases, decode
from cdlm.likelihood.evaluate import validation_tokens
from cdlm.model_file import Model


def text_quality(token_lists: list[list[int]], texts: list[str], scorer: Scorer | None) -> dict:
    out = diversity(token_lists)
    if scorer is not None:
        ppl = generative_perplexity(texts, scorer)
        out |= {"gen_ppl": ppl.ppl, "scored_tokens": ppl.scored_tokens, "unscored": ppl.skipped}
        if not math.isnan(ppl.nll_se):  # over samples; gen_ppl_se: the delta method's ppl x se
            out |= {"gen_ppl_nll_se": ppl.nll_se, "gen_ppl_se": ppl.ppl * ppl.nll_se}
    return out


def _judged_by_base(scorer: Scorer | None, model: Model) -> bool:
    """Whether the scorer is of the model's base's family (it flatters the model's gen-PPL);
    says so on stderr."""
    judged = scorer is not None and scorer_is_base(scorer.name, model.config.get("base"))
    if judged:
        print(
            f"cdlm-eval: warning: the scorer {scorer.name} is of the family of this model's base "
            f"({model.config['base']['name']}), which flatters its gen-PPL; an independent "
            "scorer: scorer=gemma3_270m (docs/guide/evaluation.md)",
            file=sys.stderr,
        )
    return judged


def report(loaded: Loaded, cfg: DictConfig) -> Measured:
    """``metric=report``: ``evaluate`` with the options of conf/eval.yaml; ``scorer=world``
    (or ``world:<name>``) scores by that world instead of a language model. A sampler that pads
    after EOS is refused under ``cut_at_eos=false`` before the scorer loads."""
    check_whole_canvases(loaded.choice.sampler, cfg.cut_at_eos, loaded.model.process.block_size)
    world = world_spec(str(cfg.scorer), loaded.model.config)
    result = evaluate(
        loaded,
        num_samples=cfg.num_samples,
        seed=cfg.seed,
        repeats=cfg.repeats,
        grid=cfg.grid,
        scorer=None if world else scorer_of(cfg.scorer, loaded.device),
        data_path=cfg.data.path,
        likelihood_sequences=None if cfg.num_batches is None else cfg.num_batches * cfg.batch_size,
        likelihood_draws=cfg.likelihood_draws,
        cut_at_eos=cfg.cut_at_eos,
        temperature=cfg.temperature,
        world=world,
    )
    return Measured(
        "report",
        result,
        summary_markdown(result),
        markdown=True,
        card=card_metrics(result),
        log=functools.partial(log_to_wandb, result),
    )


def evaluate_checkpoint(
    ckpt: str,
    sampler: Callable | None,
    *,
    steps: int | None,
    device: torch.device,
    cut_at_eos: bool = True,
    model_options: dict | None = None,
    **options: Any,
) -> dict:
    """``evaluate`` on the model at ``ckpt`` with ``sampler`` and ``steps`` (None: the defaults,
    ``choose``), for scripts; ``model_options``: ``load_model``'s keywords (a world oracle's
    process); ``options``: ``evaluate``'s. ``cdlm-eval`` loads once itself and calls
    ``report``."""
    loaded = load(ckpt, device, steps, sampler, model_options)
    check_whole_canvases(loaded.choice.sampler, cut_at_eos, loaded.model.process.block_size)
    return evaluate(loaded, cut_at_eos=cut_at_eos, **options)


def evaluate(
    loaded: Loaded,
    *,
    num_samples: int,
    seed: int,
    repeats: int,
    grid: str,
    scorer: Scorer | None,
    data_path: str | None = None,
    likelihood_sequences: int | None = None,
    likelihood_draws: int = 1,
    cut_at_eos: bool = True,
    temperature: float = 1.0,
    world: str | None = None,
) -> dict:
    """Samples (1 warm-up + ``repeats`` timed runs, batch = ``num_samples``), scores the samples
    and as many real val sequences cut to the same lengths, and computes the val bound on the
    first ``likelihood_sequences`` val sequences (None: all), averaged over
    ``likelihood_draws`` noise draws (``val_bits_per_token``). ``cut_at_eos=False`` scores
    whole canvases (EOS as line breaks): equal length for every model and sampler (the caller
    refuses a sampler that pads after EOS, ``check_whole_canvases``). ``temperature``: the
    gaussian x0 softmax temperature (the process's sampling denoiser). ``world``
    (``world:<name>``, ``scorer=world``): the samples are scored by that world instead, beside
    exact samples, and the bound is taken on exact samples (``world_sections``)."""
    model, choice = loaded.model, loaded.choice
    if choice.note:
        print(f"cdlm-eval: {choice.note}", file=sys.stderr)
    judged_by_base = _judged_by_base(scorer, model)
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
        quality, likelihood = _text_sections(
            model, samples, scorer, judged_by_base, data_path, seed, likelihood_sequences,
            likelihood_draws,
        )  # fmt: skip
    else:
        quality, likelihood = world_sections(
            model, judge, world, samples, seed, likelihood_sequences, likelihood_draws
        )
    return {
        "model": _model_facts(model, loaded.ckpt),
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
        "environment": _environment(loaded.device),
        "load_seconds": loaded.load_seconds,
        "speed": speed.as_dict(),
        "quality": quality,
        "likelihood": likelihood,
        "samples": [s.text for s in samples],
    }


def _text_sections(
    model: Model,
    samples,
    scorer: Scorer | None,
    judged_by_base: bool,
    data_path: str | None,
    seed: int,
    sequences: int | None,
    draws: int,
) -> tuple[dict, dict]:
    """The quality section (the samples under ``scorer`` beside real val text cut to the same
    lengths) and the likelihood section (the bound on the first ``sequences`` val sequences)."""
    val = validation_tokens(model, data_path)
    quality = {
        "scorer": scorer.name if scorer else None,
        "scorer_is_base": judged_by_base,
        "samples": text_quality([s.token_ids for s in samples], [s.text for s in samples], scorer),
        "reference": reference_quality(model, val, samples, scorer),
    }
    return quality, val_bits_per_token(model, val[:sequences], seed, draws=draws)


def reference_texts(model: Model, val: torch.Tensor, samples: list[Sample]) -> list[Sample]:
    """Real text at equal length: the first len(sample i) tokens of val sequence i (at least 2,
    so a scorer has a token to score), its EOS (paragraph ends) kept as line breaks."""
    return [
        decode(model.tokenizer, row[: max(2, len(s.token_ids))], cut_at_eos=False)
        for row, s in zip(val.tolist(), samples, strict=False)
    ]


def reference_quality(
    model: Model, val: torch.Tensor, samples: list[Sample], scorer: Scorer | None
) -> dict:
    """``text_quality`` of ``reference_texts``: the real text beside ``samples``."""
    reference = reference_texts(model, val, samples)
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


def card_metrics(result: dict) -> dict:
    """A full report's figures for a model card (``cdlm.hub.record_metrics``; the command
    adds its ``source``)."""
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
