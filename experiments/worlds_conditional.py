"""The conditional table of the exact worlds (issue 50): docs/results/worlds_conditional.{md,json}.

    python experiments/worlds_conditional.py multirun/worlds_conditional --run

Every process's oracle (``ckpt=world:chars`` and ``world:agreement``, ``process=masked | block |
gaussian | autoregressive | uniform``) samples each task's fixed text with every sampler family
that takes fixed text, at 16, 64 and 128 steps, each set scored against the world's exact
conditional (``cdlm-eval scorer=world prompts=FILE``, ``cdlm.evaluation.world_conditional``).
The tasks: ``continuation`` (a prompt continued to the canvas's end), ``infill`` (a middle span
between fixed text), and in the agreement world ``bridge`` (a span between two fixed names, each
of the span's names bound to one of them). ``--run`` launches one ``cdlm-eval -m`` per world and
process into ``<folder>/<world>/<process>`` (a group whose jobs all finished is not run again);
without it the folder's jobs are only collected, through the toolkit's table
(``study.table``), and the doc written. The same run adds ``cdlm-eval -m task=infill`` per
world over the oracles (span exact-match and token accuracy on the world's exact samples,
beside the exact conditional's ceiling).

With ``--models`` (the ``experiment=worlds_conditional`` training sweep), every learned model
there is sampled too, into ``<folder>/learned/<world>/<recipe>``, and its rows (``model:
learned``) stand beside the oracles' (``worlds_conditional_learned``).

A row is at the floor when its KL rate is within two standard deviations of one exact set above
the floor's mean (the floor is the mean of 8 exact sets: one set's s.d. is its s.e. x sqrt(8)).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import study
import worlds_conditional_learned as learned

STEPS = (16, 64, 128)
NUM_SAMPLES = 64
FLOOR_SETS = 8  # exact conditional sets the floor averages (score_conditional's floor_repeats)
# world -> task -> the prompts-file line (cdlm-sample's syntax). Agreement: segments of 16
# tokens, a name (A or B), 14 filler characters, the same name again.
TASKS = {
    "chars": {
        "continuation": {"prompt": "it is a truth"},
        "infill": {"infill": "it is a truth [[16]] acknowledged"},
    },
    "agreement": {
        "continuation": {"prompt": "Ait is a truth ABuniversally"},  # 31 must close with B
        "infill": {"infill": "Ait is a truth AB[[14]]BAit is a truth A"},  # filler only
        "bridge": {"infill": "Ait is a truth AB[[30]]A"},  # 31 agrees with 16, 32 with 47
    },
}
# process -> the sampler families that take fixed text (conf/sampler/ names)
SAMPLERS = {
    "masked": ("ancestral", "confidence", "remdm"),
    "block": ("block",),
    "autoregressive": ("ar",),
    "uniform": ("duo_ancestral", "duo_psi"),
    "gaussian": ("ddpm", "rolling", "euler", "heun", "dpmpp_2m"),
}
GREEDY = ("confidence",)  # argmax decoders: no draw from the conditional, so no floor to reach
ODE = ("euler", "heun", "dpmpp_2m")
# one more group: masked ancestral left to right (sampler.block_length=1), one token per call
# whatever the step count, so run once per task as AR is: the masked one-token-per-call sampler
L2R = "masked_l2r"
GROUPS = (*SAMPLERS, L2R)
ONE_PER_TOKEN = (
    "autoregressive",
    L2R,
)  # their step count is the span's length  # the probability-flow ODE solvers (cdlm/samplers/ode.py)
VIEWS = ("clean", "noised")  # the gaussian process's prompt views (process.prompt_view)
CONTINUATION_ONLY = ("autoregressive",)  # a plain AR model takes no fixed text after a gap
# task=infill on the world's exact samples: each process's default sampler (the oracle AR has no
# fill-in-the-middle form, and a plain AR model takes no infill)
INFILL_PROCESSES = ("masked", "block", "gaussian", "uniform")
INFILL_SPANS, INFILL_CASES, INFILL_STEPS = (1, 4, 16), 32, 64


def prompt_files(folder: Path) -> dict[str, dict[str, Path]]:
    """world -> task -> its one-line prompts file under ``folder`` (written if missing)."""
    out: dict[str, dict[str, Path]] = {}
    for world, tasks in TASKS.items():
        for task, line in tasks.items():
            path = folder / "prompts" / f"{world}_{task}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(line) + "\n", encoding="utf-8")
            out.setdefault(world, {})[task] = path
    return out


def command(
    folder: Path, world: str, group: str, files: dict[str, Path], num_samples: int
) -> list[str]:
    """The ``cdlm-eval -m`` of one world's oracle of a process (``group``: a process, or
    ``L2R``): every sampler, step count, task (and gaussian prompt view) a job, each in its own
    folder."""
    process = "masked" if group == L2R else group
    tasks = [p for t, p in files.items() if process not in CONTINUATION_ONLY or t == "continuation"]
    steps = "64" if group in ONE_PER_TOKEN else ",".join(map(str, STEPS))
    samplers = "ancestral" if group == L2R else ",".join(SAMPLERS[process])
    args = [
        "cdlm-eval",
        "-m",
        f"ckpt=world:{world}",
        f"process={process}",
        "scorer=world",
        f"num_samples={num_samples}",
        "wandb=false",
        "seed=0",
        f"sampler={samplers}",
        f"steps={steps}",
        f"prompts={','.join(str(p.resolve()) for p in tasks)}",
        f"hydra.sweep.dir={folder / world / group}",
    ]
    args += ["sampler.block_length=1"] if group == L2R else []
    return args + ([f"process.prompt_view={','.join(VIEWS)}"] if process == "gaussian" else [])


def infill_command(folder: Path, world: str) -> list[str]:
    """The ``cdlm-eval -m task=infill`` of one world: every process's oracle a job."""
    return [
        "cdlm-eval",
        "-m",
        f"ckpt=world:{world}",
        f"process={','.join(INFILL_PROCESSES)}",
        "task=infill",
        "scorer=none",
        f"cases={INFILL_CASES}",
        f"steps={INFILL_STEPS}",
        f"task.spans=[{','.join(map(str, INFILL_SPANS))}]",
        "wandb=false",
        "seed=0",
        f"hydra.sweep.dir={folder / world / 'task_infill'}",
    ]


def expected_jobs(group: str, tasks: int) -> int:
    process = "masked" if group == L2R else group
    samplers = 1 if group == L2R else len(SAMPLERS[process])
    count = samplers * (1 if group in ONE_PER_TOKEN else len(STEPS))
    return (
        count
        * (1 if process in CONTINUATION_ONLY else tasks)
        * (len(VIEWS) if process == "gaussian" else 1)
    )


def finished(group: Path, jobs: int) -> bool:
    """Whether ``group`` holds ``jobs`` finished jobs (a rerun skips it)."""
    if not group.is_dir():
        return False
    try:
        return len(study.rows(study.table(group))) == jobs
    except FileNotFoundError:
        return False


def run_all(folder: Path, num_samples: int, cdlm_eval: str) -> None:
    """Every world's and group's ``cdlm-eval -m``, then its ``task=infill``, one after another;
    a group whose jobs all finished is skipped."""
    files = prompt_files(folder)
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for world in TASKS:
        runs = [
            (command(folder, world, g, files[world], num_samples), g,
             expected_jobs(g, len(files[world])))
            for g in GROUPS
        ]  # fmt: skip
        runs.append((infill_command(folder, world), "task_infill", len(INFILL_PROCESSES)))
        for cmd, group, jobs in runs:
            if not finished(folder / world / group, jobs):
                print(" ".join(cmd), flush=True)
                subprocess.run([cdlm_eval, *cmd[1:]], check=True, env=env)


def is_oracle(job: dict) -> bool:
    """Whether a job sampled a world's oracle (``ckpt=world:<name>``), not a learned model."""
    return job["overrides"]["ckpt"].startswith("world:")


def run_learned(
    folder: Path, models: list[dict], num_samples: int, steps: tuple[int, ...], cdlm_eval: str
) -> None:
    """Every learned model's ``cdlm-eval -m`` jobs (``learned.commands``; the goals' groups of
    every model first), then each world's ``task=infill`` over them; a group whose jobs all
    finished is skipped."""
    files = prompt_files(folder)
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    runs = [r for m in models for r in learned.commands(folder, m, files[m["world"]], steps,
                                                         num_samples)]  # fmt: skip
    runs.sort(key=lambda r: not r[1].name.endswith("_goal"))  # stable: the goals first
    runs += [learned.infill_command(folder, w, models, INFILL_CASES, INFILL_STEPS, INFILL_SPANS)
             for w in TASKS]  # fmt: skip
    for cmd, group, jobs in runs:
        if not finished(group, jobs):
            print(" ".join(cmd), flush=True)
            subprocess.run([cdlm_eval, *cmd[1:]], check=True, env=env)


def at_floor(row: dict) -> bool:
    """The KL rate within two s.d. of one exact set above the floor (module docstring)."""
    spread = row["kl_floor_se"] * math.sqrt(FLOOR_SETS)
    return row["kl_rate"] <= row["kl_floor"] + 2 * spread


def oracle_rows(found: dict) -> list[dict]:
    """One row per finished job of the table (its report's one prompts line)."""
    out = []
    for job in study.rows(found):
        o, m = job["overrides"], job["metrics"]
        if "rows/0/kl_rate" not in m or not is_oracle(job):  # task=infill: infill_rows
            continue
        process = o["process"]
        task = Path(o["prompts"]).stem.split("_", 1)[1]
        free, nfe = m["rows/0/free"], m["nfe"]
        row = {
            "world": o["ckpt"].removeprefix("world:"),
            "process": process,
            "model": "oracle",
            "sampler": o["sampler"] + ("_l2r" if o.get("sampler.block_length") == "1" else ""),
            "steps": None
            if process == "autoregressive" or "sampler.block_length" in o
            else int(o["steps"]),
            "task": task,
            "free": int(free),
            "nfe": nfe,
            "tokens_per_call": free / nfe,
        }
        row |= {k: m[f"rows/0/{k}"] for k in ("kl_rate", "kl_floor", "kl_floor_se")}
        row |= {k: m[f"rows/0/{k}"] for k in ("violation_rate", "nll_cond", "nll_cond_se")}
        row |= {"entropy_cond": m["rows/0/entropy_cond"], "tv_rate": m["rows/0/tv_rate"]}
        if process == "gaussian":
            row["prompt_view"] = o["process.prompt_view"]
        row["at_floor"] = at_floor(row)
        out.append(row)
    order = {(w, t): i for i, (w, t) in enumerate((w, t) for w in TASKS for t in TASKS[w])}
    procs = list(SAMPLERS)
    return sorted(
        out,
        key=lambda r: (order[(r["world"], r["task"])], procs.index(r["process"]),
                       r["sampler"], r.get("prompt_view", ""), r["steps"] or 0),
    )  # fmt: skip


def infill_rows(found: dict) -> list[dict]:
    """One row per span of each finished ``task=infill`` job (its report beside it)."""
    out = []
    for job in study.rows(found):
        if job["overrides"].get("task") != "infill" or not is_oracle(job):
            continue
        (path,) = Path(job["folder"]).glob("*eval_task_infill.json")
        report = json.loads(path.read_text())
        world = job["overrides"]["ckpt"].removeprefix("world:")
        for r in report["rows"]:
            keep = ("span", "cases", "token_accuracy", "token_accuracy_se", "exact_token_accuracy",
                    "best_token_accuracy", "span_exact", "span_exact_se", "exact_span_exact",
                    "fixed_intact", "nfe")  # fmt: skip
            row = {"world": world, "process": report["process"], "model": "oracle"}
            row |= {"sampler": report["sampler"], "steps": report["steps"], "task": "task_infill"}
            out.append(row | {k: r.get(k) for k in keep})
    return out


def goals(rows: list[dict]) -> dict:
    """The issue's goals read off the rows: ``single``, the rows of masked, block and AR
    samplers that draw (not ``GREEDY``) at one token per call or fewer, and those of them off
    the floor; ``ode``, each gaussian ODE solver's first step count at the floor per world,
    task and prompt view (None: not within the grid)."""
    single = [
        r
        for r in rows
        if r["process"] in ("masked", "block", "autoregressive")
        and r["sampler"] not in GREEDY
        and r["tokens_per_call"] <= 1
    ]
    ode = []
    for world in TASKS:
        for task in TASKS[world]:
            firsts = {}
            for sampler in ODE:
                for view in VIEWS:
                    mine = [
                        r
                        for r in rows
                        if (r["world"], r["task"], r["sampler"]) == (world, task, sampler)
                        and r.get("prompt_view") == view
                    ]
                    firsts[f"{sampler} {view}"] = next(
                        (r["steps"] for r in mine if r["at_floor"]), None
                    )
            ode.append({"world": world, "task": task, "first_steps_at_floor": firsts})
    return {
        "single": [(r["world"], r["task"], r["process"], r["sampler"], r["steps"]) for r in single],
        "single_off_floor": [
            {
                k: r[k]
                for k in (
                    "world",
                    "task",
                    "process",
                    "sampler",
                    "steps",
                    "tokens_per_call",
                    "kl_rate",
                    "kl_floor",
                    "kl_floor_se",
                )
            }
            for r in single
            if not r["at_floor"]
        ],  # fmt: skip
        "ode": ode,
    }


def goal_lines(found: dict) -> list[str]:
    """The goals as the doc says them."""
    single, off = found["single"], found["single_off_floor"]
    lines = [
        f"- **One token per call or fewer, masked, block and AR** (samplers that draw; "
        f"{len(single)} rows): {len(single) - len(off)} at the floor" + (":" if off else "."),
        *[
            f"  - off: {r['world']} {r['task']}, {r['process']} {r['sampler']} @{r['steps']} "
            f"({r['tokens_per_call']:.2f} tokens/call): KL {r['kl_rate']:.4f} against "
            f"{r['kl_floor']:.4f} ± {r['kl_floor_se']:.4f}"
            for r in off
        ],
        "- **Gaussian ODE solvers: the first step count at the floor** (of "
        f"{', '.join(map(str, STEPS))}; `-`: none):",
        "",
    ]
    columns = ["world", "task", *found["ode"][0]["first_steps_at_floor"]] if found["ode"] else []
    cells = [[o["world"], o["task"], *o["first_steps_at_floor"].values()] for o in found["ode"]]
    return lines + [study.markdown_table(columns, cells)] if cells else lines


def markdown(report: dict) -> str:
    """The doc's generated body: the goals, then a table per world and task."""
    lines = [
        f"{report['num_samples']} samples per row, seed 0, each set scored against the world's "
        "exact conditional; floor: the same estimator on as many exact conditional samples (mean "
        f"± s.e. over {FLOOR_SETS} sets). `at floor`: KL rate ≤ floor + 2 s.d. of one set. "
        "Tokens per call: free tokens over network calls.",
        "",
        "### Goals",
        "",
        *goal_lines(report["goals"]),
    ]
    for world in TASKS:
        for task in TASKS[world]:
            mine = [r for r in report["rows"] if (r["world"], r["task"]) == (world, task)]
            if not mine:
                continue
            fixed = json.dumps(TASKS[world][task])
            lines += ["", f"### {world}: {task} (`{fixed}`, {mine[0]['free']} free tokens)", ""]
            cells = [
                [r["process"], r["sampler"], r.get("prompt_view", "-"), r["steps"] or "-",
                 r["tokens_per_call"], r["kl_rate"],
                 f"{r['kl_floor']:.4f} ± {r['kl_floor_se']:.4f}", r["violation_rate"],
                 f"{r['nll_cond'] - r['entropy_cond']:+.3f} ± {r['nll_cond_se']:.3f}",
                 "yes" if r["at_floor"] else "no"]
                for r in mine
            ]  # fmt: skip
            columns = ["process", "sampler", "prompt view", "steps", "tokens/call", "KL rate",
                       "floor ± s.e.", "violations", "NLL − entropy", "at floor"]  # fmt: skip
            lines.append(study.markdown_table(columns, cells))
    infill = report["task_infill"]
    if infill:
        lines += [
            "",
            f"### `task=infill` on exact world samples ({INFILL_CASES} cases, {INFILL_STEPS} "
            "steps, each process's default sampler)",
            "",
            "Measured token accuracy and span exact-match (± s.e. over the cases) beside the exact "
            "conditional's: what an exact sampler averages, and the best token accuracy of any "
            "infill.",
            "",
        ]
        cells = [
            [r["world"], r["process"], r["sampler"], r["span"],
             f"{r['token_accuracy']:.3f} ± {r['token_accuracy_se']:.3f}",
             r["exact_token_accuracy"], r["best_token_accuracy"],
             f"{r['span_exact']:.3f} ± {r['span_exact_se']:.3f}", r["exact_span_exact"],
             r["fixed_intact"]]
            for r in infill
        ]  # fmt: skip
        columns = ["world", "process", "sampler", "span", "token accuracy", "exact sampler's",
                   "best", "span exact", "exact sampler's", "fixed intact"]  # fmt: skip
        lines.append(study.markdown_table(columns, cells))
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder", type=Path, help="the study's sweep folder")
    p.add_argument("--run", action="store_true", help="run the cdlm-eval jobs first")
    p.add_argument(
        "--skip-oracles", action="store_true", help="with --run: run the learned jobs only"
    )
    p.add_argument("--num-samples", type=int, default=NUM_SAMPLES)
    p.add_argument(
        "--models", type=Path, nargs="*", default=[],
        help="experiment=worlds_conditional sweep folders: their models' learned rows",
    )  # fmt: skip
    p.add_argument(
        "--learned-steps", type=lambda v: tuple(map(int, v.split(","))), default=STEPS,
        help="the learned rows' step counts, e.g. 16,64,128",
    )  # fmt: skip
    p.add_argument("--results", type=Path, default=study.RESULTS, help="where the doc goes")
    return p.parse_args(argv)


def main() -> None:
    args = parse()
    models = learned.models(*args.models)
    if args.run:
        cdlm_eval = str(Path(sys.executable).with_name("cdlm-eval"))
        if not args.skip_oracles:
            run_all(args.folder, args.num_samples, cdlm_eval)
        run_learned(args.folder, models, args.num_samples, args.learned_steps, cdlm_eval)
    found = study.table(args.folder, *args.models)
    rows = oracle_rows(found)
    report = {"num_samples": args.num_samples, "rows": rows, "goals": goals(rows)}
    report["task_infill"] = infill_rows(found)
    body = markdown(report)
    commands = [f"python experiments/worlds_conditional.py {args.folder} --run"]
    if models:
        body += learned_report(report, found, models, rows)
        steps = ",".join(map(str, args.learned_steps))
        models_arg = " ".join(map(str, args.models))
        commands = [LEARNED_TRAIN, f"{commands[0]} --models {models_arg} --learned-steps {steps}"]
    title = "Conditioning scored against a world's exact conditional (issue 50)"
    path = study.write("worlds_conditional", title, body, report, commands, found, args.results)
    print(path.read_text())


LEARNED_TRAIN = (
    "cdlm-train -m experiment=worlds_conditional hydra/launcher=joblib hydra.launcher.n_jobs=1"
)


def learned_report(report: dict, found: dict, models: list[dict], oracle: list[dict]) -> str:
    """Adds the learned models' rows (to ``rows``, beside the oracles'), their ``task=infill``
    rows and goals to ``report``; returns their part of the doc."""
    mine = learned.learned_rows(found, models, at_floor)
    report["rows"] = oracle + mine
    report["learned_task_infill"] = learned.learned_infill_rows(found, models)
    view, violation = learned.view_goal(mine), learned.violation_goal(mine)
    report["learned_goals"] = {"prompt_view": view, "violations": violation}
    lines = learned.goal_lines(view, violation) + learned.table_lines(mine, oracle, TASKS)
    return "\n".join(lines + learned.infill_lines(report["learned_task_infill"])) + "\n"


if __name__ == "__main__":
    main()
