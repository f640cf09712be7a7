"""The conditional table of the exact worlds (issue 50): docs/results/worlds_conditional.{md,json}.

    python experiments/worlds_conditional.py multirun/worlds_conditional --run

Every process's oracle (``ckpt=world:chars`` and ``world:agreement``, ``process=masked | block |
gaussian | autoregressive | uniform``) samples each task's fixed text with every sampler family
that takes fixed text, each set scored against the world's exact conditional (``cdlm-eval
scorer=world prompts=FILE``, ``cdlm.evaluation.world_conditional``). The tasks: ``continuation``
(a prompt continued to the canvas's end), ``infill`` (a middle span between fixed text), and in
the agreement world ``bridge`` (a span between two fixed names, each of the span's names bound to
one of them). A group (``GROUPS``) is one ``cdlm-eval -m`` into ``<folder>/<world>/<group>``; a
group whose jobs all finished is not run again. Without ``--run`` the folder's jobs are only
collected, through the toolkit's table (``study.table``), and the doc written
(``worlds_conditional_doc``). The same run adds ``cdlm-eval -m task=infill`` per world over the
oracles (span exact-match and token accuracy on the world's exact samples, beside the exact
conditional's ceiling).

Two kinds of sampler decide about one token per call. Those that decide *exactly* one
(``EXACT``: exact-k at k = 1, masked ancestral left to right, AR) draw from the exact
conditional by construction on an oracle, as does speculative decoding (its drafts verified
against the AR pass): the issue's goal is judged on these. The rest (ancestral, ReMDM, block's
MDLM rule) decide one *on average*, several at once on some steps, and are kept beside them.

With ``--models`` (the ``experiment=worlds_conditional_models`` training sweep), every learned model
there is sampled too, into ``<folder>/learned/<world>/<recipe>_<task>``, and its rows (``model:
learned``) stand beside the oracles' (``worlds_conditional_learned``), its ``task=infill`` rows
beside the oracles' and the exact ceiling.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import study
import worlds_conditional_doc as doc
import worlds_conditional_learned as learned

from cdlm.evaluation.world_score import finite_row

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
VIEWS = ("clean", "noised")  # the gaussian process's prompt views (process.prompt_view)
UNSHIFTED = ("process.shift=false", "process.causal_clean=false", "process.ar_weight=0")


@dataclass(frozen=True)
class Group:
    """One ``cdlm-eval -m`` per world: a process's oracle under ``samplers`` (conf/sampler/
    names) at ``steps``, with ``extra`` overrides; ``tag`` marks its rows' sampler name, and
    ``stepless`` says that the steps do not change what it does (AR, left to right,
    speculative): its rows carry no step count."""

    process: str
    samplers: tuple[str, ...]
    steps: tuple[int, ...] = STEPS
    extra: tuple[str, ...] = ()
    tag: str = ""
    stepless: bool = False
    continuation_only: bool = False  # a plain AR model takes no fixed text after a gap

    def jobs(self, tasks: int) -> int:
        sweeps = math.prod(len(e.split("=", 1)[1].split(",")) for e in self.extra)
        tasks = 1 if self.continuation_only else tasks
        return len(self.samplers) * len(self.steps) * tasks * sweeps


GROUPS = {
    "masked": Group("masked", ("ancestral", "confidence", "remdm")),
    "block": Group("block", ("block",)),
    "autoregressive": Group("autoregressive", ("ar",), (64,), stepless=True,
                            continuation_only=True),
    "uniform": Group("uniform", ("duo_ancestral", "duo_psi")),
    # masked ancestral left to right: one token per call whatever the steps
    "masked_l2r": Group("masked", ("ancestral",), (64,), ("sampler.block_length=1",), "_l2r",
                        stepless=True),
    # exact-k at k = 1 (cdlm.samplers.rules.ExactK): 128 steps cover every task's free tokens
    "masked_exact": Group("masked", ("exact_k",), (128,)),
    "block_exact": Group("block", ("exact_k",), (128,)),
    "block_exact_unshifted": Group("block", ("exact_k",), (128,), UNSHIFTED),  # rows' layout
    "block_speculative": Group("block", ("speculative",), (64,), stepless=True,
                               continuation_only=True),
    # last: the longest group (150 jobs), unchanged by the exact samplers' rows
    "gaussian": Group("gaussian", ("ddpm", "rolling", "euler", "heun", "dpmpp_2m"),
                      extra=(f"process.prompt_view={','.join(VIEWS)}",)),
}  # fmt: skip
# the groups the goal is judged on: exact by construction on an oracle (module docstring)
EXACT = ("masked_l2r", "masked_exact", "block_exact", "block_exact_unshifted", "autoregressive",
         "block_speculative")  # fmt: skip
# processes whose samplers see only the blocks before the current one: fixed text to the right
# of a free block is unseen (cdlm warns), so an infill or a bridge is not supported
LEFT_ONLY = ("block",)
# task=infill on the world's exact samples: each process's default sampler (the oracle AR has no
# fill-in-the-middle form, and a plain AR model takes no infill)
INFILL_PROCESSES = ("masked", "block", "gaussian", "uniform")
INFILL_SPANS, INFILL_CASES, INFILL_STEPS = (1, 4, 16), 32, 64
LEARNED_INFILL_CASES = 64  # a learned model's cases (issue 50 item 5); the oracles' stay at 32


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
    folder: Path, world: str, name: str, files: dict[str, Path], num_samples: int
) -> list[str]:
    """The ``cdlm-eval -m`` of one world's group ``name``: every sampler, step count, task (and
    extra sweep) a job, each in its own folder."""
    group = GROUPS[name]
    tasks = [p for t, p in files.items() if not group.continuation_only or t == "continuation"]
    return [
        "cdlm-eval",
        "-m",
        f"ckpt=world:{world}",
        f"process={group.process}",
        "scorer=world",
        f"num_samples={num_samples}",
        "wandb=false",
        "seed=0",
        f"sampler={','.join(group.samplers)}",
        f"steps={','.join(map(str, group.steps))}",
        f"prompts={','.join(str(p.resolve()) for p in tasks)}",
        f"hydra.sweep.dir={folder / world / name}",
        *group.extra,
    ]


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


def finished(group: Path, jobs: int) -> bool:
    """Whether ``group`` holds ``jobs`` finished jobs (a rerun skips it)."""
    if not group.is_dir():
        return False
    try:
        return len(study.rows(study.table(group))) == jobs
    except FileNotFoundError:
        return False


def run_all(folder: Path, num_samples: int, cdlm_eval: str) -> None:
    """Every world's groups and its ``task=infill`` (before the gaussian group, the longest), one
    after another; a group whose jobs all finished is skipped."""
    files = prompt_files(folder)
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for world in TASKS:
        runs = [
            (command(folder, world, g, files[world], num_samples), g,
             GROUPS[g].jobs(len(files[world])))
            for g in GROUPS
        ]  # fmt: skip
        infill = (infill_command(folder, world), "task_infill", len(INFILL_PROCESSES))
        runs.insert(len(runs) - 1, infill)  # before the gaussian group, the longest
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
    """Each world's ``task=infill`` over its learned models, then every learned model's
    ``cdlm-eval -m`` jobs (``learned.commands``; the goals' groups of every model first); a
    group whose jobs all finished is skipped."""
    files = prompt_files(folder)
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    runs = [r for m in models for r in learned.commands(folder, m, files[m["world"]], steps,
                                                         num_samples)]  # fmt: skip
    runs.sort(key=lambda r: not r[1].name.endswith("_goal"))  # stable: the goals first
    # task=infill first: a few CPU-seconds a model
    runs[:0] = [learned.infill_command(folder, w, models, LEARNED_INFILL_CASES, INFILL_STEPS,
                                       INFILL_SPANS)
                for w in TASKS if any(m["world"] == w for m in models)]  # fmt: skip
    for cmd, group, jobs in runs:
        if not finished(group, jobs):
            print(" ".join(cmd), flush=True)
            subprocess.run([cdlm_eval, *cmd[1:]], check=True, env=env)


def at_floor(row: dict) -> bool:
    """The KL rate within two s.d. of one exact set above the floor (an infinite KL, None in
    the row, is not)."""
    if row["kl_rate"] is None:
        return False
    spread = row["kl_floor_se"] * math.sqrt(FLOOR_SETS)
    return row["kl_rate"] <= row["kl_floor"] + 2 * spread


def oracle_rows(found: dict) -> list[dict]:
    """One row per finished job of the table (its report's one prompts line)."""
    out = []
    for job in study.rows(found):
        o, m = job["overrides"], job["metrics"]
        if "rows/0/kl_floor" not in m or not is_oracle(job):  # task=infill: infill_rows
            continue
        name = Path(job["folder"]).parent.name
        group, task = GROUPS[name], Path(o["prompts"]).stem.split("_", 1)[1]
        free, nfe = m["rows/0/free"], m["nfe"]
        row = {
            "world": o["ckpt"].removeprefix("world:"),
            "process": group.process,
            "model": "oracle",
            "group": name,
            "sampler": o["sampler"] + group.tag,
            "steps": None if group.stepless else int(o["steps"]),
            "task": task,
            "free": int(free),
            "nfe": nfe,
            "tokens_per_call": free / nfe,
            "exact_rule": name in EXACT,
            "supported": group.process not in LEFT_ONLY or task == "continuation",
        }
        keys = ("kl_rate", "kl_floor", "kl_floor_se", "violation_rate", "nll_cond", "nll_cond_se",
                "entropy_cond", "tv_rate")  # fmt: skip
        # a figure the report wrote as null (infinite: finite_row) is not among the metrics
        row = finite_row(row | {k: m.get(f"rows/0/{k}", math.inf) for k in keys})
        if group.process == "gaussian":
            row["prompt_view"] = o["process.prompt_view"]
        if group.process == "block":
            row["layout"] = "unshifted" if "process.shift" in o else "shifted, with its tail"
        row["at_floor"] = at_floor(row)
        out.append(row)
    return ordered(out)


def ordered(rows: list[dict]) -> list[dict]:
    """Rows by world and task, then process, the exact samplers last, sampler and steps."""
    order = {(w, t): i for i, (w, t) in enumerate((w, t) for w in TASKS for t in TASKS[w])}
    procs = list(dict.fromkeys(g.process for g in GROUPS.values()))
    return sorted(
        rows,
        key=lambda r: (order[(r["world"], r["task"])], procs.index(r["process"]),
                       r["exact_rule"], r["sampler"], r.get("prompt_view", ""), r["steps"] or 0),
    )  # fmt: skip


def carried(previous: Path, rows: list[dict], infill: list[dict]) -> tuple[list, list]:
    """``rows`` and ``infill`` with what they lack of an earlier results JSON of the same
    settings and seed (``--previous``): gaussian rows, and a world's ``task=infill`` rows (the
    groups this study's changes leave as they were, and the longest to rerun), where the folder
    has no job of theirs. Each carried row names that run's commits in ``carried_from``."""
    old = json.loads(previous.read_text(encoding="utf-8"))
    mark = {"carried_from": old["commits"]}

    def key(r: dict) -> tuple:
        return r["world"], r["task"], r["sampler"], r.get("prompt_view"), r["steps"]

    have = {key(r) for r in rows}
    more = []
    for r in old["rows"]:
        if r["process"] == "gaussian" and key(r) not in have:
            r = finite_row(r | {"group": "gaussian", "exact_rule": False, "supported": True}) | mark
            more.append(r | {"at_floor": at_floor(r)})
    worlds = {r["world"] for r in infill}
    infill = infill + [r | mark for r in old["task_infill"] if r["world"] not in worlds]
    return ordered(rows + more), infill


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
        help="experiment=worlds_conditional_models sweep folders: their models' learned rows",
    )  # fmt: skip
    p.add_argument(
        "--learned-steps", type=lambda v: tuple(map(int, v.split(","))), default=STEPS,
        help="the learned rows' step counts, e.g. 16,64,128",
    )  # fmt: skip
    p.add_argument("--results", type=Path, default=study.RESULTS, help="where the doc goes")
    p.add_argument("--previous", type=Path, help="an earlier results JSON: see carried()")
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
    rows, infill = oracle_rows(found), infill_rows(found)
    if args.previous:
        rows, infill = carried(args.previous, rows, infill)
    settings = {"num_samples": args.num_samples, "floor_sets": FLOOR_SETS, "steps": STEPS}
    settings |= {"tasks": TASKS, "infill_cases": INFILL_CASES, "infill_steps": INFILL_STEPS}
    settings |= {"learned_infill_cases": LEARNED_INFILL_CASES}
    report = settings | {"rows": rows, "goals": doc.goals(rows, TASKS)}
    report["task_infill"] = infill
    body = doc.markdown(report)
    commands = [f"python experiments/worlds_conditional.py {args.folder} --run"]
    if args.previous:
        commands[0] += f" --previous {args.previous}"
    if models:
        body += learned_report(report, found, models, rows)
        steps = ",".join(map(str, args.learned_steps))
        models_arg = " ".join(map(str, args.models))
        evaluate = f"{commands[0]} --models {models_arg} --learned-steps {steps}"
        commands = [*(study.sweep_command(m) for m in args.models), evaluate]
    title = "Conditioning scored against a world's exact conditional (issue 50)"
    path = study.write("worlds_conditional", title, body, report, commands, found, args.results)
    print(path.read_text())


def learned_report(report: dict, found: dict, models: list[dict], oracle: list[dict]) -> str:
    """Adds the learned models' rows (to ``rows``, beside the oracles'), their ``task=infill``
    rows and goals to ``report``; returns their part of the doc."""
    mine = [finite_row(r) for r in learned.learned_rows(found, models)]
    mine = [r | {"at_floor": at_floor(r)} for r in mine]
    report["rows"] = oracle + mine
    report["learned_task_infill"] = learned.learned_infill_rows(found, models)
    view, violation = learned.view_goal(mine), learned.violation_goal(mine)
    report["learned_goals"] = {"prompt_view": view, "violations": violation}
    lines = learned.goal_lines(view, violation) + learned.table_lines(mine, oracle, TASKS)
    lines += learned.infill_lines(report["learned_task_infill"], report["task_infill"])
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
