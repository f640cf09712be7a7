"""The conditional table's goals and markdown (``worlds_conditional``): what the doc says of the
rows. Settings (tasks, steps, floor sets) come in the report, so this module imports no study."""

from __future__ import annotations

import json

import study

DRAWS = ("masked", "block", "autoregressive")  # the goal's processes
GREEDY = ("confidence",)  # argmax decoders: no draw from the conditional, so no floor to reach
ODE = ("euler", "heun", "dpmpp_2m")  # the probability-flow ODE solvers (cdlm/samplers/ode.py)
VIEWS = ("clean", "noised")
UNSUPPORTED = "not supported: block sees only earlier blocks"
CARRIED = " †"  # a row carried from an earlier run (``worlds_conditional.carried``)
GOAL_KEYS = ("world", "task", "process", "sampler", "layout", "steps", "tokens_per_call",
             "kl_rate", "kl_floor", "kl_floor_se", "violation_rate")  # fmt: skip


def goals(rows: list[dict], tasks: dict) -> dict:
    """The issue's goals read off the rows: ``exact``, the supported rows of masked, block and
    AR samplers that decide exactly one token per call (or verify drafts), and ``exact_off``,
    those off the floor; ``on_average`` and ``on_average_off``, the same for the samplers that
    draw one token per call or fewer only on average; ``unsupported``, the rows whose fixed text
    the process cannot see; ``ode``, each gaussian ODE solver's first step count at the floor
    per world, task and prompt view (None: not within the grid)."""
    mine = [r for r in rows if r["process"] in DRAWS and r["supported"]]
    exact = [r for r in mine if r["exact_rule"]]
    average = [
        r
        for r in mine
        if not r["exact_rule"] and r["sampler"] not in GREEDY and r["tokens_per_call"] <= 1
    ]
    ode = []
    for world in tasks:
        for task in tasks[world]:
            firsts = {}
            for sampler in ODE:
                for view in VIEWS:
                    at = [
                        r["steps"]
                        for r in rows
                        if (r["world"], r["task"], r["sampler"]) == (world, task, sampler)
                        and r.get("prompt_view") == view
                        and r["at_floor"]
                    ]
                    firsts[f"{sampler} {view}"] = min(at, default=None)
            ode.append({"world": world, "task": task, "first_steps_at_floor": firsts})

    def brief(chosen: list[dict]) -> list[dict]:
        return [{k: r.get(k) for k in GOAL_KEYS} for r in chosen]

    return {
        "exact": brief(exact),
        "exact_off": brief([r for r in exact if not r["at_floor"]]),
        "on_average": brief(average),
        "on_average_off": brief([r for r in average if not r["at_floor"]]),
        "unsupported": brief([r for r in rows if not r["supported"]]),
        "ode": ode,
    }


def kl(r: dict) -> str:
    """A KL rate as the doc shows it: None is an infinite one (``finite``)."""
    return "∞" if r["kl_rate"] is None else f"{r['kl_rate']:.4f}"


def name(r: dict) -> str:
    steps = "" if r["steps"] is None else f" @{r['steps']}"
    layout = f" ({r['layout']})" if r.get("layout") else ""
    return f"{r['world']} {r['task']}, {r['process']} {r['sampler']}{layout}{steps}"


def off_lines(off: list[dict]) -> list[str]:
    return [
        f"  - off: {name(r)} ({r['tokens_per_call']:.2f} tokens/call): KL {kl(r)} against "
        f"{r['kl_floor']:.4f} ± {r['kl_floor_se']:.4f}"
        for r in off
    ]


def goal_lines(found: dict, steps: tuple[int, ...]) -> list[str]:
    """The goals as the doc says them."""
    exact, off = found["exact"], found["exact_off"]
    average, avg_off = found["on_average"], found["on_average_off"]
    lines = [
        "- **Goal: every sampler that decides exactly one token per call, masked, block and AR, "
        f"at the floor** (exact-k at k = 1, ancestral left to right, AR, and speculative "
        f"decoding, which verifies its drafts; {len(exact)} rows): {len(exact) - len(off)} at "
        "the floor" + (":" if off else "."),
        *off_lines(off),
        f"- Beside it, not judged: samplers at one token per call or fewer only **on average** "
        f"(ancestral, ReMDM, block's MDLM rule; {len(average)} rows): "
        f"{len(average) - len(avg_off)} at the floor" + (":" if avg_off else "."),
        *off_lines(avg_off),
        f"- **{UNSUPPORTED}** (fixed text to the right of a free block, which the sampler never "
        f"shows it; cdlm warns): {len(found['unsupported'])} rows, left out of both counts.",
        f"- **Gaussian ODE solvers: the first step count at the floor** (of "
        f"{', '.join(map(str, steps))}; `-`: none):",
        "",
    ]
    columns = ["world", "task", *found["ode"][0]["first_steps_at_floor"]] if found["ode"] else []
    cells = [[o["world"], o["task"], *o["first_steps_at_floor"].values()] for o in found["ode"]]
    return lines + [study.markdown_table(columns, cells)] if cells else lines


def per_call(r: dict) -> str:
    """The table's ``one per call`` cell."""
    if r["exact_rule"]:
        return "verified" if r["sampler"] == "speculative" else "exactly"
    return "on average" if r["tokens_per_call"] <= 1 and r["sampler"] not in GREEDY else "-"


def task_table(mine: list[dict]) -> str:
    cells = [
        [r["process"], r["sampler"] + CARRIED * ("carried_from" in r),
         r.get("prompt_view") or r.get("layout") or "-",
         r["steps"] or "-", r["tokens_per_call"], per_call(r),
         kl(r) if r["supported"] else f"{kl(r)} ({UNSUPPORTED})",
         f"{r['kl_floor']:.4f} ± {r['kl_floor_se']:.4f}", r["violation_rate"],
         f"{r['nll_cond'] - r['entropy_cond']:+.3f} ± {r['nll_cond_se']:.3f}",
         "yes" if r["at_floor"] else "no"]
        for r in mine
    ]  # fmt: skip
    columns = ["process", "sampler", "prompt view / layout", "steps", "tokens/call",
               "one per call", "KL rate", "floor ± s.e.", "violations", "NLL − entropy",
               "at floor"]  # fmt: skip
    return study.markdown_table(columns, cells)


def infill_table(report: dict) -> list[str]:
    lines = [
        "",
        f"### `task=infill` on exact world samples ({report['infill_cases']} cases, "
        f"{report['infill_steps']} steps, each process's default sampler)",
        "",
        "Measured token accuracy and span exact-match (± s.e. over the cases) beside the exact "
        "conditional's: what an exact sampler averages, and the best token accuracy of any "
        "infill.",
        "",
    ]
    cells = [
        [r["world"], r["process"], r["sampler"] + CARRIED * ("carried_from" in r), r["span"],
         f"{r['token_accuracy']:.3f} ± {r['token_accuracy_se']:.3f}",
         r["exact_token_accuracy"], r["best_token_accuracy"],
         f"{r['span_exact']:.3f} ± {r['span_exact_se']:.3f}", r["exact_span_exact"],
         r["fixed_intact"]]
        for r in report["task_infill"]
    ]  # fmt: skip
    columns = ["world", "process", "sampler", "span", "token accuracy", "exact sampler's",
               "best", "span exact", "exact sampler's", "fixed intact"]  # fmt: skip
    return [*lines, study.markdown_table(columns, cells)]


def carried_note(report: dict) -> list[str]:
    """A line naming the earlier run that rows marked † come from, if any."""
    runs = {tuple(r["carried_from"]) for r in report["rows"] + report["task_infill"]
            if "carried_from" in r}  # fmt: skip
    return (
        [
            "",
            f"Rows marked †: carried unchanged from the earlier run at commits "
            f"{', '.join(f'`{c[:7]}`' for c in commits)} (same settings and seed), not rerun here.",
        ]
        if (commits := sorted({c for run in runs for c in run}))
        else []
    )


def markdown(report: dict) -> str:
    """The doc's generated body: the goals, then a table per world and task."""
    lines = [
        f"{report['num_samples']} samples per row, seed 0, each set scored against the world's "
        "exact conditional; floor: the same estimator on as many exact conditional samples (mean "
        f"± s.e. over {report['floor_sets']} sets). `at floor`: KL rate ≤ floor + 2 s.d. of one "
        "set. Tokens per call: free tokens over network calls. `one per call`: `exactly` for a "
        "sampler that decides one token per call by construction, `verified` for speculative "
        "decoding, `on average` for one that decides a random number per call. KL `∞`: some "
        "sample falls where the exact conditional puts no mass (null in the JSON, the key named "
        "in the row's `infinite`). Block layouts: shifted, with its tail (`process.sees_last`, "
        "the default) or unshifted.",
        *carried_note(report),
        "",
        "### Goals",
        "",
        *goal_lines(report["goals"], report["steps"]),
    ]
    tasks = report["tasks"]
    for world in tasks:
        for task in tasks[world]:
            mine = [r for r in report["rows"] if (r["world"], r["task"]) == (world, task)]
            if mine:
                fixed = json.dumps(tasks[world][task])
                lines += ["", f"### {world}: {task} (`{fixed}`, {mine[0]['free']} free tokens)", ""]
                lines.append(task_table(mine))
    if report["task_infill"]:
        lines += infill_table(report)
    return "\n".join(lines) + "\n"
