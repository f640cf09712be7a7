"""``cdlm-eval scorer=world prompt=...`` (or ``infill=``, ``prompts=FILE``): a model's conditional
samples scored against the world's exact conditional given the fixed text, one sample set per
row (``world_conditional.score_conditional``)."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from cdlm.evaluation.metric import Loaded, Measured
from cdlm.evaluation.world_conditional import score_conditional
from cdlm.evaluation.world_score import finite_row, world_of, world_spec
from cdlm.generation import Plan, Row, generate_rows
from cdlm.generation.inputs import read_rows
from cdlm.rng import generator
from cdlm.worlds.conditional import condition

CONDITIONING = ("prompt", "infill", "prompts")

REPORT = "cdlm.evaluation.harness.report"  # the metric these scores replace


def conditioning(cfg: DictConfig) -> list[str]:
    """The conditioning options given (``prompt``, ``infill``, ``prompts``)."""
    return [k for k in CONDITIONING if cfg.get(k) is not None]


def conditioning_problem(cfg: DictConfig) -> str | None:
    """What is wrong with ``prompt=``, ``infill=``, ``prompts=`` on this command (one of them,
    scored by a world's exact conditional in place of the full report); None when nothing."""
    given = conditioning(cfg)
    if cfg.get("max_new_tokens") is not None and cfg.get("prompt") is None:
        return "max_new_tokens= counts the tokens after prompt="
    if not given:
        return None
    scorer = str(cfg.scorer)
    for bad, problem in (
        (len(given) > 1, f"give at most one of prompt=, infill=, prompts= (got {given})"),
        (cfg.get("task") is not None, f"{given[0]}= is scored by scorer=world, not with task="),
        (
            cfg.metric.get("_target_") != REPORT,
            f"{given[0]}= is scored in place of the full report (metric=report), not another metric",
        ),
        (
            not (scorer == "world" or scorer.startswith("world:")),
            f"{given[0]}= is scored against a world's exact conditional: give scorer=world (or "
            f"scorer=world:<name>), got scorer={scorer}",
        ),
    ):
        if bad:
            return problem
    return None


def rows_of(cfg: DictConfig) -> list[Row]:
    """The rows to score: ``prompt=`` (with ``max_new_tokens=``) or ``infill=`` as one row, or
    every line of ``prompts=FILE`` (``cdlm-sample``'s format)."""
    if cfg.get("prompts") is not None:
        path = Path(str(cfg.prompts))
        if not path.is_file():
            raise ValueError(f"prompts file not found: {path}")
        return read_rows(path.read_text(encoding="utf-8"))
    if cfg.get("prompt") is not None:
        return [Row(prompt=str(cfg.prompt), max_new_tokens=cfg.get("max_new_tokens"))]
    return [Row(infill=str(cfg.infill))]


def conditional_report(loaded: Loaded, cfg: DictConfig) -> Measured:
    """``cfg.num_samples`` samples per row with the chosen sampler and steps, each row's set
    scored by the exact conditional of the world ``scorer=`` names; floors from exact
    conditional samples of one stream seeded by ``cfg.seed``."""
    model, choice = loaded.model, loaded.choice
    spec = world_spec(str(cfg.scorer), model.config)
    if spec is None:
        raise ValueError("prompt=, infill= and prompts= are scored by a world: give scorer=world")
    world = world_of(model, spec)
    rows = rows_of(cfg)
    plan = Plan(
        num_samples=cfg.num_samples,
        seq_len=model.config["seq_len"],
        steps=choice.steps,
        seed=cfg.seed,
        grid=cfg.grid,
        denoising={"temperature": cfg.temperature},
    )
    gen = generate_rows(model, choice.sampler, plan, rows, what="prompts line")
    stream = generator(cfg.seed)
    scored = []
    for r, row in enumerate(rows):
        drawn = gen.rows[r * plan.num_samples : (r + 1) * plan.num_samples]
        layout = drawn[0].layout
        cond = condition(world, torch.tensor(layout.ids), torch.tensor(layout.editable))
        tokens = torch.tensor([d.token_ids for d in drawn])
        scores = score_conditional(cond, tokens, generator=stream)
        task = "continuation" if row.prompt is not None else "infill"
        text = row.prompt if row.prompt is not None else row.infill
        row = {"task": task, "input": text} | finite_row(scores)
        scored.append(row | {"texts": [d.text for d in drawn]})
    result = {
        "model": {"ckpt": loaded.ckpt, "process": model.process.kind},
        "sampler": {"name": choice.name, "options": choice.options, "steps": plan.steps},
        "world": world.describe(),
        "scorer": spec,
        "seed": cfg.seed,
        "num_samples": cfg.num_samples,
        "nfe": gen.nfe,
        "rows": scored,
    }
    return Measured("conditional", result, summary(result), markdown=True)


def summary(result: dict) -> str:
    """The report as markdown: one line per row."""
    head = (
        f"## Conditional samples of {result['model']['ckpt']} ({result['model']['process']}), "
        f"sampler {result['sampler']['name']}, {result['sampler']['steps']} steps, scored by "
        f"the exact conditional of {result['scorer']}\n\n"
        "| row | task | free | NLL (bits/token ± s.e.) | entropy | KL rate (floor ± s.e.) | "
        "TV rate (floor ± s.e.) | violations |\n|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {i + 1} | {r['task']} | {r['free']} | {f(r['nll_cond'])} ± {f(r['nll_cond_se'])} "
        f"| {f(r['entropy_cond'])} | {f(r['kl_rate'])} ({f(r['kl_floor'])} ± "
        f"{f(r['kl_floor_se'])}) | {f(r['tv_rate'])} ({f(r['tv_floor'])} ± "
        f"{f(r['tv_floor_se'])}) | {r['violation_rate']:.3f} |"
        for i, r in enumerate(result["rows"])
    ]
    return head + "\n".join(lines) + "\n"


def f(x: float | None) -> str:
    """A figure to 4 places; None (an infinite figure, ``finite_row``) as inf."""
    return "inf" if x is None else f"{x:.4f}"
