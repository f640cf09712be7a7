"""Issue 25's measurement: every task on every model in one run (``cdlm.tasks``), written as
docs/results/tasks.json ({"rows": [...]}) and the tables of docs/results/tasks.md's generated part.

Three model sets (experiments/train_task_models.sh): Austen (--model: infill, correct,
constrain's text kinds, write), code (--code, with --code-data: infill, constrain's code kinds,
write) and plan (--plan, with --plan-data: Sudoku and Countdown). Accuracy tasks decode
greedily: AR at temperature 0, masked by confidence (top-k easy-first, Ye et al. 2025), block
and gaussian with their own samplers at temperature 0 where they have one. Open writing (write)
uses each process's default sampler at temperature 1.

usage: python experiments/tasks.py --model ar-fim=PATH ... [--code KEY=PATH ... --code-data F]
    [--plan KEY=PATH ... --plan-data F] [--only correct ...] --out docs/results/tasks
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from cdlm.evaluation.quality import load_scorer
from cdlm.generation.choice import named_sampler
from cdlm.io import atomic_write_text
from cdlm.model_file import load_model
from cdlm.tasks import constraint_kinds, correct, infill, suite
from cdlm.tasks.base import named_task

GREEDY = {  # process kind -> (sampler, options, steps) for the accuracy tasks
    "autoregressive": ("ar", {"temperature": 0.0, "stop_at_eos": False}, 1),
    "masked": ("confidence", {"stop_at_eos": False}, 32),
    "block": ("block", {"temperature": 0.0, "stop_at_eos": False}, 32),
    "gaussian": ("ddpm", {}, 64),
}
WRITE_STEPS = {"autoregressive": 1, "masked": 64, "block": 64, "gaussian": 64}
PLAN_STEPS = 64  # a Sudoku answer is at most 40 tokens: one or more decided per step
SETS = {  # a model set -> its tasks
    "austen": ("infill", "correct", "constrain", "write"),
    "code": ("infill", "constrain", "write"),
    "plan": ("plan",),
}
KINDS = {"austen": constraint_kinds.TEXT_KINDS, "code": constraint_kinds.CODE_KINDS}


def task_plan(kind: str, group: str, args, scorer) -> list[tuple]:
    """(name, task of conf/task/, sampler or None for the default, steps, scorer) for each."""
    name, options, steps = GREEDY[kind]
    greedy = named_sampler(name, **options)
    every = {
        "infill": (named_task("infill", spans=args.spans), greedy, steps, scorer),
        "correct": (named_task("correct", rates=args.rates), greedy, steps, None),
        "constrain": (
            named_task("constrain", kinds=list(KINDS.get(group, ()))),
            greedy,
            steps,
            scorer,
        ),
        "plan": (named_task("plan"), greedy, PLAN_STEPS if kind != "autoregressive" else 1, None),
        "write": (named_task("write", samples=args.samples), None, WRITE_STEPS[kind], scorer),
    }
    return [(task, *every[task]) for task in SETS[group] if task in (args.only or SETS[group])]


def rows_of(key: str, path: str, group: str, data: str | None, args, scorer) -> list[dict]:
    start = time.perf_counter()
    model = load_model(path)
    load = time.perf_counter() - start
    rows = []
    for task, fn, sampler, n, task_scorer in task_plan(model.process.kind, group, args, scorer):
        sampler = sampler or named_sampler(model.process.default_sampler)
        print(f"== {key}: {task} ({time.strftime('%T')})", file=sys.stderr)
        try:
            report = suite.report(
                fn,
                model,
                sampler,
                steps=n,
                seed=args.seed,
                cases={"correct": args.correct_cases, "plan": args.plan_cases}.get(
                    task, args.cases
                ),
                scorer=task_scorer,
                data_path=data,
                load_seconds=load,
            )
        except ValueError as e:  # e.g. passages too short for any constraint: said, not hidden
            print(f"== {key}: {task} skipped: {e}", file=sys.stderr)
            continue
        extra = {"model": key, "path": path, "set": group}
        rows += [row | extra for row in report["rows"]]
    return rows


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def table(rows: list[dict], columns: list[str]) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "".join("| " + " | ".join(fmt(r.get(c)) for c in columns) + " |\n" for r in rows)


def goals(rows: list[dict]) -> list[str]:
    """Each goal of issue 25 that this run measures, met or not, with the figures."""
    out = []
    rows = [r for r in rows if r.get("set", "austen") == "austen"] + [
        r for r in rows if r.get("set") == "plan"
    ]
    by = {(r["task"], r["model"], r.get("span", r.get("rate"))): r for r in rows}
    ar = next((r["model"] for r in rows if r["process"] == "autoregressive+fim"), None)
    for span in (4, 16):
        for model in sorted({r["model"] for r in rows if r["process"] in ("masked", "gaussian")}):
            mine, theirs = by.get(("infill", model, span)), by.get(("infill", ar, span))
            if mine is None or theirs is None:
                continue
            won = all(mine[k] > theirs[k] for k in ("token_accuracy", "span_exact"))
            out.append(
                f"Infill, {span} tokens: {model} token accuracy {mine['token_accuracy']:.3f} and "
                f"span exact {mine['span_exact']:.3f} against {ar}'s {theirs['token_accuracy']:.3f}"
                f" and {theirs['span_exact']:.3f}: goal (beat it on both) "
                f"{'met' if won else 'not met'}."
            )
    for r in rows:
        if r["task"] == "correct" and r["rate"] == 0.05:
            met = r["restored"] >= 0.5 and r["changed_correct"] <= 0.01
            out.append(
                f"Correct, 5%: {r['model']} restored {r['restored']:.3f} of corrupted words and "
                f"changed {r['changed_correct']:.4f} of correct ones: goal (>= 0.5 restored, <= "
                f"0.01 changed) {'met' if met else 'not met'}."
            )
    return out + constrain_goals(rows, ar) + plan_goals(rows)


def constrain_goals(rows: list[dict], ar: str | None) -> list[str]:
    by = {(r["model"], r["kind"]): r for r in rows if r["task"] == "constrain"}
    out = []
    for kind in ("name_twice", "end_with"):
        theirs = by.get((ar, kind))
        for (model, k), mine in sorted(by.items()):
            if k != kind or model == ar or theirs is None:
                continue
            met = mine["acceptance"] >= 2 * theirs["acceptance"] and mine["acceptance"] > 0
            out.append(
                f"Constrain, {kind}: {model} accepted {mine['acceptance']:.3f} against {ar}'s "
                f"{theirs['acceptance']:.3f}: goal (>= 2x) {'met' if met else 'not met'}."
            )
    return out


def plan_goals(rows: list[dict]) -> list[str]:
    by = {(r["process"], r["game"]): r for r in rows if r["task"] == "plan"}
    out = []
    for game in ("sudoku", "countdown"):
        mine, theirs = by.get(("masked", game)), by.get(("autoregressive", game))
        if mine is None or theirs is None:
            continue
        rate, ar_rate = mine["solve_rate"], theirs["solve_rate"]
        met = rate >= 2 * ar_rate and rate > 0 and (game != "sudoku" or rate >= 0.9)
        floor = " and >= 0.9" if game == "sudoku" else ""
        out.append(
            f"Plan, {game}: masked solved {rate:.3f} against AR's {ar_rate:.3f}: goal (>= 2x"
            f"{floor}) {'met' if met else 'not met'}."
        )
    return out


def markdown(rows: list[dict]) -> str:
    parts = [
        "## Infill\n",
        table(
            [r for r in rows if r["task"] == "infill"],
            [
                "set",
                "set",
                "model",
                "sampler",
                "span",
                "cases",
                "token_accuracy",
                "span_exact",
                "fixed_intact",
                "ppl_ratio",
                "nfe",
                "positions",
                "wall_s_median",
                "first_stable_s_median",
            ],
        ),
    ]
    parts += [
        "\n## Correct\n",
        table(
            [r for r in rows if r["task"] == "correct"],
            [
                "set",
                "model",
                "sampler",
                "rate",
                "cases",
                "corrupted_words",
                "restored",
                "changed_correct",
                "acceptance",
                "revision_rounds",
                "nfe",
                "positions",
                "wall_s_median",
            ],
        ),
    ]
    parts += [
        "\n## Constrain\n",
        table(
            [r for r in rows if r["task"] == "constrain"],
            [
                "set",
                "model",
                "sampler",
                "kind",
                "cases",
                "acceptance",
                "matches_original",
                "accepted_ppl",
                "nfe",
                "positions",
                "wall_s_median",
            ],
        ),
        "\n## Plan\n",
        table(
            [r for r in rows if r["task"] == "plan"],
            [
                "set",
                "model",
                "sampler",
                "game",
                "cases",
                "solve_rate",
                "nfe",
                "positions",
                "wall_s_median",
            ],
        ),
    ]
    parts += [
        "\n## Write\n",
        table(
            [r for r in rows if r["task"] == "write"],
            [
                "set",
                "model",
                "sampler",
                "samples",
                "entropy",
                "reference_entropy",
                "gen_ppl",
                "reference_ppl",
                "nfe",
                "wall_s_median",
            ],
        ),
    ]
    parts += ["\n## Goals\n", "".join(f"- {g}\n" for g in goals(rows))]
    return "".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", default=[], help="KEY=PATH (Austen)")
    parser.add_argument("--code", action="append", default=[], help="KEY=PATH (code set)")
    parser.add_argument("--plan", action="append", default=[], help="KEY=PATH (plan set)")
    parser.add_argument("--code-data", help="the code corpus the code set trained on")
    parser.add_argument("--plan-data", help="the puzzle file the plan set trained on")
    parser.add_argument("--cases", type=int, default=32)
    parser.add_argument("--plan-cases", type=int, default=64, help="puzzles, both games")
    parser.add_argument(
        "--correct-cases", type=int, default=12, help="correct scores every word: the dearest task"
    )
    parser.add_argument("--spans", type=int, nargs="+", default=list(infill.SPANS))
    parser.add_argument("--rates", type=float, nargs="+", default=list(correct.RATES))
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument(
        "--only",
        nargs="+",
        choices=sorted({t for tasks in SETS.values() for t in tasks}),
        help="run these tasks alone (e.g. --only correct: re-measure its rows); default: all",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scorer", default="default", help="default | none | an HF causal LM")
    parser.add_argument("--out", default="docs/results/tasks")
    args = parser.parse_args()
    scorer = (
        None
        if args.scorer == "none"
        else load_scorer(None if args.scorer == "default" else args.scorer)
    )
    rows = []
    sets = [("austen", m, None) for m in args.model] + [
        ("code", m, args.code_data) for m in args.code
    ]
    for group, spec, data in sets + [("plan", m, args.plan_data) for m in args.plan]:
        key, _, path = spec.partition("=")
        rows += rows_of(key, path, group, data, args, scorer)
        atomic_write_text(Path(f"{args.out}.partial.json"), json.dumps({"rows": rows}, indent=2))
    meta = {
        "threads": torch.get_num_threads(),
        "cases": args.cases,
        "correct_cases": args.correct_cases,
        "plan_cases": args.plan_cases,
        "seed": args.seed,
        "command": " ".join(sys.argv),
    }
    atomic_write_text(Path(f"{args.out}.json"), json.dumps({"rows": rows} | meta, indent=2) + "\n")
    atomic_write_text(Path(f"{args.out}.tables.md"), markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
