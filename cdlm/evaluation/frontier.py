"""``cdlm-eval metric=frontier``: the temperature frontier (Pynadath et al. 2026), gen-PPL
against token entropy over a sweep of sampling temperatures, beside real text's point.

Lowering the temperature lowers gen-PPL and entropy together, so one gen-PPL says little: two
samplers compare fairly at equal entropy. This metric reads the model's gen-PPL at real text's
entropy off its frontier (``at_entropy``), so that no sampler wins by collapsing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig

from cdlm.evaluation.harness import reference_quality, text_quality
from cdlm.evaluation.metric import Loaded, Measured, draw, scorer_of
from cdlm.evaluation.world_score import world_spec
from cdlm.generation import check_whole_canvases, with_temperature
from cdlm.likelihood.evaluate import validation_tokens


def at_entropy(points: list[tuple[float, float]], target: float) -> float | None:
    """Gen-PPL at ``target`` bits of entropy, interpolated in log gen-PPL between the two
    (entropy, gen-PPL) ``points`` (sorted by entropy) that bracket it; None outside the swept
    range: a frontier is not extrapolated."""
    for (h0, p0), (h1, p1) in zip(points, points[1:], strict=False):
        if h0 <= target <= h1 and h1 > h0:
            w = (target - h0) / (h1 - h0)
            return math.exp((1 - w) * math.log(p0) + w * math.log(p1))
    return None


@dataclass(frozen=True)
class Tempered:
    """A sampler and the x0 softmax temperature (``Plan.denoising``) that together draw at one
    temperature."""

    sampler: Callable
    x0_temperature: float


def tempered(loaded: Loaded, temperature: float) -> Tempered:
    """The chosen sampler drawing at ``temperature``: a continuous process's sampling
    denoiser's softmax over each x0 estimate (what the report's ``temperature`` sets), else the
    token sampler's own draws (``with_temperature``: a masked or block sampler's step rule,
    the AR and uniform-state samplers' own)."""
    if loaded.model.process.continuous:
        return Tempered(loaded.choice.sampler, temperature)
    return Tempered(with_temperature(loaded.choice.sampler, temperature), 1.0)


def frontier(loaded: Loaded, cfg: DictConfig, temperatures: list[float]) -> Measured:
    """``metric=frontier``: ``num_samples`` samples (seed ``seed``, the chosen sampler and
    steps, cut at EOS as ``cut_at_eos`` says) at each of ``temperatures``, their (temperature,
    entropy, gen-PPL) points; real val text cut to the lengths of the samples drawn nearest
    T = 1 (the model's own distribution); and gen-PPL read at real text's entropy. ``scorer=none``
    gives entropies only."""
    swept = sorted(float(t) for t in temperatures)
    if not swept or swept[0] <= 0:
        raise ValueError(f"metric.temperatures: a list of positive numbers, got {swept}")
    model = loaded.model
    if world_spec(str(cfg.scorer), model.config):
        raise ValueError(
            "metric=frontier reads gen-PPL under a language model; a world model is scored "
            "exactly: metric=report scorer=world"
        )
    check_whole_canvases(loaded.choice.sampler, cfg.cut_at_eos, model.process.block_size)
    scorer = scorer_of(str(cfg.scorer), loaded.device)
    points, drawn = [], []
    for t in swept:
        at = tempered(loaded, t)
        samples = draw(loaded, cfg, cfg.seed, at.sampler, at.x0_temperature)
        quality = text_quality([s.token_ids for s in samples], [s.text for s in samples], scorer)
        entropy, gen_ppl = quality["token_entropy_bits"], quality.get("gen_ppl")
        points.append(
            {"temperature": t, "entropy": entropy, "gen_ppl": gen_ppl, "quality": quality}
        )
        drawn.append(samples)
    nearest = min(range(len(swept)), key=lambda i: abs(math.log(swept[i])))
    val = validation_tokens(model, cfg.data.path, cfg.data.val_fraction, cfg.data.packing)
    real = reference_quality(model, val, drawn[nearest], scorer)
    curve = sorted((p["entropy"], p["gen_ppl"]) for p in points) if scorer else []
    result = {
        "metric": "frontier",
        "ckpt": loaded.ckpt,
        "scorer": scorer.name if scorer else None,
        "sampler": {
            "name": loaded.choice.name,
            "options": loaded.choice.options,
            "steps": loaded.choice.steps,
            "grid": cfg.grid,
        },
        "num_samples": cfg.num_samples,
        "seed": cfg.seed,
        "cut_at_eos": cfg.cut_at_eos,
        "points": points,
        "reference": real | {"lengths_of_temperature": swept[nearest]},
        "gen_ppl_at_reference_entropy": at_entropy(curve, real["token_entropy_bits"]),
    }
    return Measured("frontier", result, _summary(result))


def _summary(result: dict) -> str:
    def ppl(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1f}"

    sampler = result["sampler"]
    lines = [
        f"cdlm-eval: temperature frontier of {sampler['name']} ({sampler['steps']} steps), "
        f"{result['num_samples']} samples a temperature, seed {result['seed']}, gen-PPL under "
        f"{result['scorer'] or 'no scorer'}:",
        *(
            f"  T={p['temperature']:g}: entropy {p['entropy']:.3f} bits, gen-PPL "
            f"{ppl(p['gen_ppl'])}"
            for p in result["points"]
        ),
        f"  real val text: entropy {result['reference']['token_entropy_bits']:.3f} bits, gen-PPL "
        f"{ppl(result['reference'].get('gen_ppl'))}",
        f"  gen-PPL at real text's entropy: {ppl(result['gen_ppl_at_reference_entropy'])} "
        "(log-linear between the two temperatures that bracket it; n/a outside the sweep)",
    ]
    return "\n".join(lines)
