"""Issue 25's measurement: every task on every model in one run (``cdlm.tasks``), written as
docs/tasks.json ({"rows": [...]}) and the tables of docs/tasks.md's generated part.

Accuracy tasks (infill, correct) decode greedily: AR-FIM at temperature 0, masked by confidence
(top-k easy-first, Ye et al. 2025), block and gaussian with their own samplers at temperature 0
where they have one. Open writing (write) uses each process's default sampler at temperature 1.

usage: python experiments/tasks.py --model ar-fim=PATH --model masked=PATH ... --out docs/tasks
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

from cdlm.evaluation.quality import load_scorer
from cdlm.io import atomic_write_text
from cdlm.model_file import load_model
from cdlm.sampling.choice import named_sampler
from cdlm.tasks import correct, infill, suite, write

GREEDY = {  # process kind -> (sampler, options, steps) for infill and correct
    "autoregressive": ("ar", {"temperature": 0.0, "stop_at_eos": False}, 1),
    "masked": ("confidence", {"stop_at_eos": False}, 32),
    "block": ("block", {"temperature": 0.0, "stop_at_eos": False}, 32),
    "gaussian": ("ddpm", {}, 64),
}
WRITE_STEPS = {"autoregressive": 1, "masked": 64, "block": 64, "gaussian": 64}


def rows_of(key: str, path: str, args, scorer) -> list[dict]:
    start = time.perf_counter()
    model = load_model(path)
    load = time.perf_counter() - start
    kind = model.process.kind
    name, options, steps = GREEDY[kind]
    greedy = named_sampler(name, **options)
    plan = [
        ("infill", functools.partial(infill.run, spans=args.spans), greedy, steps, scorer),
        ("correct", functools.partial(correct.run, rates=args.rates), greedy, steps, None),
        (
            "write",
            functools.partial(write.run, samples=args.samples),
            None,
            WRITE_STEPS[kind],
            scorer,
        ),
    ]
    rows = []
    for task, fn, sampler, n, task_scorer in plan:
        if task == "correct" and not (
            hasattr(model.process, "mask_id") or kind == "autoregressive"
        ):
            continue  # gaussian: no scoring rule yet (docs/evaluation.md)
        sampler = sampler or named_sampler(model.process.default_sampler)
        print(f"== {key}: {task} ({time.strftime('%T')})", file=sys.stderr)
        report = suite.report(
            task,
            fn,
            model,
            sampler,
            steps=n,
            seed=args.seed,
            cases=args.cases,
            scorer=task_scorer,
            load_seconds=load,
        )
        rows += [row | {"model": key, "path": path} for row in report["rows"]]
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
    return out


def markdown(rows: list[dict]) -> str:
    parts = [
        "## Infill\n",
        table(
            [r for r in rows if r["task"] == "infill"],
            [
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
        "\n## Write\n",
        table(
            [r for r in rows if r["task"] == "write"],
            [
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
    parser.add_argument("--model", action="append", required=True, help="KEY=PATH")
    parser.add_argument("--cases", type=int, default=32)
    parser.add_argument("--spans", type=int, nargs="+", default=list(infill.SPANS))
    parser.add_argument("--rates", type=float, nargs="+", default=list(correct.RATES))
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scorer", default="default", help="default | none | an HF causal LM")
    parser.add_argument("--out", default="docs/tasks")
    args = parser.parse_args()
    scorer = (
        None
        if args.scorer == "none"
        else load_scorer(None if args.scorer == "default" else args.scorer)
    )
    rows = []
    for spec in args.model:
        key, _, path = spec.partition("=")
        rows += rows_of(key, path, args, scorer)
        atomic_write_text(Path(f"{args.out}.partial.json"), json.dumps({"rows": rows}, indent=2))
    meta = {
        "threads": torch.get_num_threads(),
        "cases": args.cases,
        "seed": args.seed,
        "command": " ".join(sys.argv),
    }
    atomic_write_text(Path(f"{args.out}.json"), json.dumps({"rows": rows} | meta, indent=2) + "\n")
    atomic_write_text(Path(f"{args.out}.tables.md"), markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
