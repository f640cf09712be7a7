"""The learned rows of the conditional worlds table (issue 50), beside worlds_conditional.py's
oracle rows: small models trained in each world with prompt rows (``experiment=
worlds_conditional``), each sampled with its process's default sampler on the same fixed texts
and step counts as the oracles and scored against the exact conditional, and ``task=infill``.

Two goals are read off them, each with a standard error over ``SETS`` sample sets of
``num_samples`` (a KL rate is a plug-in estimate of one set, so its spread comes from sets):

- the learned gaussian model's continuation KL with fixed text shown ``clean`` against
  ``noised`` (process.prompt_view, trained and sampled in that view), per world and step count;
- in the agreement world, the bridge's violation rate (a span whose name disagrees with a fixed
  end) of the best learned diffusion model against AR-FIM's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import study

from cdlm.evaluation.world_score import _mean_se

# recipe (conf/recipe/, the rows of conf/experiment/worlds_conditional_models.yaml) -> (process, its
# default sampler, the tasks it takes: a plain AR model sees only left context)
RECIPES = {
    "gaussian_clean_prompt": ("gaussian", "rolling", None),
    "gaussian_noised_prompt": ("gaussian", "rolling", None),
    "masked": ("masked", "ancestral", None),
    "block_default": ("block", "block", None),
    "autoregressive": ("autoregressive", "ar", ("continuation",)),
    "autoregressive_fim": ("autoregressive", "ar", None),
}
DIFFUSION = ("gaussian_clean_prompt", "gaussian_noised_prompt", "masked", "block_default")
# the diffusion models that read fixed text on both sides: block reads only the blocks before
# its current one, so a bridge's closing name is invisible to it (its infills are unsupported)
BOTH_SIDES = ("gaussian_clean_prompt", "gaussian_noised_prompt", "masked")
SETS = 4  # sample sets of the goals' rows (the first set's in the table)


def seeds(num_samples: int) -> list[int]:
    """The sets' seeds, ``num_samples`` apart: when this study ran, cdlm-eval seeded sample i of
    a set with seed + i, so seeds 0, 1, 2, ... shared all but one sample between neighbouring
    sets (now ``cdlm.rng.member_seed`` keeps any two seeds' sets apart; the grid is kept so that
    its command still names the shipped sets' seeds)."""
    return [k * num_samples for k in range(SETS)]


COMPARED = ("kl_rate", "kl_rate_possible", "violation_rate")  # the view goal's figure, in turn
INFILL_RECIPES = (*DIFFUSION, "autoregressive_fim")  # task=infill: those that take a gap


def models(*folders: Path) -> list[dict]:
    """The finished training jobs of ``folders`` (``experiment=worlds_conditional_models`` sweeps):
    world, recipe, model folder and, for gaussian, the prompt view. A gaussian model is named
    by the view its model file records (a file from before the option: noised), whatever recipe
    trained it: the first models were trained as ``gaussian`` (noised then) and
    ``gaussian_clean_prompts``, today ``gaussian_noised_prompt`` and ``gaussian_clean_prompt``."""
    out = []
    for job in study.rows(study.table(*folders)) if folders else []:
        o, folder = job["overrides"], Path(job["folder"]).resolve()
        recipe, view = o["recipe"], None
        if recipe.startswith("gaussian"):
            process = json.loads((folder / "config.json").read_text())["process"]
            view = process.get("prompt_view", "noised")
            recipe = f"gaussian_{view}_prompt"
        world = o["data.world"].replace("\\:", ":").removeprefix("world:")
        out.append({"world": world, "recipe": recipe, "folder": str(folder), "prompt_view": view})
    return out


def goal_tasks(world: str, recipe: str) -> list[str]:
    """The tasks a model runs with every seed: continuation for gaussian (the view goal), the
    bridge for every model that takes a gap in the agreement world (the violation goal)."""
    out = ["continuation"] if RECIPES[recipe][0] == "gaussian" else []
    return out + (["bridge"] if world == "agreement" and takes(recipe, "bridge") else [])


def takes(recipe: str, task: str) -> bool:
    allowed = RECIPES[recipe][2]
    return allowed is None or task in allowed


def commands(
    folder: Path, model: dict, files: dict[str, Path], steps: tuple[int, ...], num_samples: int
) -> list[tuple[list[str], Path, int]]:
    """(the ``cdlm-eval -m``, its sweep folder, its job count) of one learned model, one group
    per task it takes: the continuation at every count of ``steps`` (issue item 2), an infill or
    a bridge at the first only (time); a sequential AR model once. A goal's task (``goal_tasks``)
    runs with every seed (its group ``<recipe>_<task>_goal``), the others with seed 0."""
    recipe, world = model["recipe"], model["world"]
    process, sampler, _ = RECIPES[recipe]
    goal = goal_tasks(world, recipe)
    out = []
    for task in (t for t in files if takes(recipe, t)):
        step_list = (64,) if process == "autoregressive" else steps
        step_list = step_list if task == "continuation" else step_list[:1]
        sets = seeds(num_samples) if task in goal else [0]
        group = folder / "learned" / world / f"{recipe}_{task}{'_goal' if task in goal else ''}"
        cmd = [
            "cdlm-eval", "-m", f"ckpt={model['folder']}", "scorer=world",
            f"num_samples={num_samples}", "wandb=false", f"sampler={sampler}",
            f"steps={','.join(map(str, step_list))}", f"prompts={files[task].resolve()}",
            f"seed={','.join(map(str, sets))}", f"hydra.sweep.dir={group}",
        ]  # fmt: skip
        out.append((cmd, group, len(step_list) * len(sets)))
    return out


def infill_command(
    folder: Path, world: str, found: list[dict], cases: int, steps: int, spans: tuple[int, ...]
) -> tuple[list[str], Path, int]:
    """The ``cdlm-eval -m task=infill`` over one world's learned models that take a gap."""
    ckpts = [m["folder"] for m in found if m["world"] == world and m["recipe"] in INFILL_RECIPES]
    group = folder / "learned" / world / "task_infill"
    cmd = [
        "cdlm-eval", "-m", f"ckpt={','.join(ckpts)}", "task=infill", "scorer=none",
        f"cases={cases}", f"steps={steps}", f"task.spans=[{','.join(map(str, spans))}]",
        "wandb=false", "seed=0", f"hydra.sweep.dir={group}",
    ]  # fmt: skip
    return cmd, group, len(ckpts)


def model_of(ckpt: str | None, found: list[dict]) -> dict | None:
    """The model (of ``models``) whose folder ``ckpt`` is; None for an oracle (``world:``) or
    a training job (no ``ckpt``)."""
    if ckpt is None or ckpt.startswith("world:"):
        return None
    return next((m for m in found if m["folder"] == str(Path(ckpt).resolve())), None)


def learned_rows(evals: dict, found: list[dict]) -> list[dict]:
    """One row per finished conditional job of the learned models (each seed its own row; an
    infinite KL rate stays infinite here)."""
    out = []
    for job in study.rows(evals):
        o, m = job["overrides"], job["metrics"]
        model = model_of(o.get("ckpt"), found)
        if "rows/0/kl_floor" not in m or model is None:  # an infinite KL is no metric
            continue
        recipe = model["recipe"]
        process, sampler, _ = RECIPES[recipe]
        free, nfe = m["rows/0/free"], m["nfe"]
        row = {
            "world": model["world"],
            "process": process,
            "model": "learned",
            "recipe": recipe,
            "sampler": sampler + ("_fim" if recipe == "autoregressive_fim" else ""),
            "steps": None if process == "autoregressive" else int(o["steps"]),
            "task": Path(o["prompts"]).stem.split("_", 1)[1],
            "seed": int(o["seed"]),
            "free": int(free),
            "nfe": nfe,
            "tokens_per_call": free / nfe,
        }
        for key in ("kl_rate", "kl_floor", "kl_floor_se", "violation_rate", "nll_cond",
                    "nll_cond_se", "entropy_cond", "tv_rate", "kl_rate_possible"):  # fmt: skip
            row[key] = m.get(f"rows/0/{key}", math.inf)  # null in the report: infinite
        if model["prompt_view"]:
            row["prompt_view"] = model["prompt_view"]
        out.append(row)
    return sorted(out, key=lambda r: (r["world"], r["task"], list(RECIPES).index(r["recipe"]),
                                      r["steps"] or 0, r["seed"]))  # fmt: skip


def learned_infill_rows(evals: dict, found: list[dict]) -> list[dict]:
    """One row per span of each learned model's finished ``task=infill`` job, keyed as the
    conditional rows are (``world``, ``process``, ``model``, ``sampler``, ``steps``, ``task``,
    and ``prompt_view`` for gaussian)."""
    out = []
    for job in study.rows(evals):
        model = model_of(job["overrides"].get("ckpt"), found)
        if job["overrides"].get("task") != "infill" or model is None:
            continue
        (path,) = Path(job["folder"]).glob("*eval_task_infill.json")
        report = json.loads(path.read_text())
        for r in report["rows"]:
            row = {"world": model["world"], "process": report["process"], "model": "learned"}
            row |= {"recipe": model["recipe"], "sampler": report["sampler"]}
            row |= {"steps": report["steps"], "task": "task_infill"}
            row |= {"prompt_view": model["prompt_view"]} if model["prompt_view"] else {}
            out.append(row | r)
    order = list(RECIPES)
    return sorted(out, key=lambda r: (r["world"], r["span"], order.index(r["recipe"])))


def spread(rows: list[dict], key: str) -> dict:
    """Mean and standard error of ``key`` over the rows' sample sets."""
    mean, se = _mean_se([r[key] for r in rows])
    return {"mean": mean, "se": se, "sets": len(rows)}


def view_goal(rows: list[dict]) -> list[dict]:
    """Per world and step count: the learned gaussian continuation's KL rate, clean and noised
    (mean ± s.e. over the seeds), and whether clean is lower by at least 2 s.e. of the
    difference. Where a set's KL is infinite (a sample the conditional rules out), the KL over
    the samples it allows (``kl_rate_possible``) is compared instead, and where it allows none
    of a set's samples, the violation rate (``COMPARED``)."""
    out = []
    for world in sorted({r["world"] for r in rows}, reverse=True):
        steps = sorted({r["steps"] for r in rows if r["process"] == "gaussian"})
        for n in steps:
            mine = [
                r
                for r in rows
                if (r["world"], r["task"], r["process"], r["steps"])
                == (world, "continuation", "gaussian", n)
            ]
            views = {v: [r for r in mine if r["prompt_view"] == v] for v in ("clean", "noised")}
            if min(len(v) for v in views.values()) < 2:
                continue
            key = next(k for k in COMPARED if all(r[k] is not None for r in mine))
            by = {v: spread(r, key) for v, r in views.items()}
            gap = by["noised"]["mean"] - by["clean"]["mean"]
            se = math.hypot(by["noised"]["se"], by["clean"]["se"])
            violations = {v: spread(r, "violation_rate")["mean"] for v, r in views.items()}
            out.append({"world": world, "steps": n, "metric": key, "clean": by["clean"],
                        "noised": by["noised"], "gap": gap, "gap_se": se, "met": gap > 0 and gap >= 2 * se,
                        "violation_rate": violations})  # fmt: skip
    return out


def violation_goal(rows: list[dict]) -> dict | None:
    """The agreement bridge: each learned model's violation rate per step count (mean ± s.e.
    over the seeds' sets), the best row of a diffusion model that reads both sides
    (``BOTH_SIDES``), AR-FIM's, and whether the best breaks fewer
    agreements by at least 2 s.e. of the difference."""
    bridge = [r for r in rows if (r["world"], r["task"]) == ("agreement", "bridge")]
    cells = {}
    for r in bridge:
        cells.setdefault((r["recipe"], r["steps"]), []).append(r)
    table = [{"recipe": k[0], "steps": k[1], **spread(v, "violation_rate")}
             for k, v in cells.items() if len(v) > 1]  # fmt: skip
    diffusion = [t for t in table if t["recipe"] in BOTH_SIDES]
    fim = [t for t in table if t["recipe"] == "autoregressive_fim"]
    if not diffusion or not fim:
        return None
    best, ar = min(diffusion, key=lambda t: t["mean"]), fim[0]
    gap, se = ar["mean"] - best["mean"], math.hypot(ar["se"], best["se"])
    return {"rows": table, "best": best, "fim": ar, "gap": gap, "gap_se": se,
            "met": gap > 0 and gap >= 2 * se}  # fmt: skip


def goal_lines(view: list[dict], violation: dict | None) -> list[str]:
    """The two learned goals as the doc says them."""
    lines = ["", "### Learned models: goals", ""]
    lines.append(
        f"**Clean against noised gaussian prompts** (continuation KL rate, mean ± s.e. over "
        f"{SETS} sets; gap = noised − clean):"
    )
    cells = [[v["world"], v["steps"], v["metric"],
              f"{v['clean']['mean']:.4f} ± {v['clean']['se']:.4f}",
              f"{v['noised']['mean']:.4f} ± {v['noised']['se']:.4f}",
              f"{v['gap']:+.4f} ± {v['gap_se']:.4f}", "yes" if v["met"] else "no",
              v["violation_rate"]["clean"], v["violation_rate"]["noised"]]
             for v in view]  # fmt: skip
    columns = ["world", "steps", "compared", "clean", "noised", "gap", "gap ≥ 2 s.e.",
               "violations clean", "violations noised"]  # fmt: skip
    lines += ["", study.markdown_table(columns, cells) if cells else "(no rows)", ""]
    if violation is None:
        return lines + ["**Agreement bridge violations**: no rows.", ""]
    lines.append(
        f"**Agreement bridge violations** (mean ± s.e. over {SETS} sets; the best diffusion "
        f"model that reads both sides: {violation['best']['recipe']} "
        f"@{violation['best']['steps']}, "
        f"{violation['best']['mean']:.3f} ± {violation['best']['se']:.3f}; AR-FIM "
        f"{violation['fim']['mean']:.3f} ± {violation['fim']['se']:.3f}; AR-FIM − best "
        f"{violation['gap']:+.3f} ± {violation['gap_se']:.3f}: goal "
        f"{'met' if violation['met'] else 'missed'}):"
    )
    cells = [[t["recipe"], t["steps"] or "-", f"{t['mean']:.3f} ± {t['se']:.3f}"]
             for t in violation["rows"]]  # fmt: skip
    return lines + ["", study.markdown_table(["model", "steps", "violation rate"], cells), ""]


def table_lines(rows: list[dict], oracle: list[dict], tasks: dict) -> list[str]:
    """Per world and task, each learned row (seed 0) beside the oracle row of the same process,
    sampler, prompt view and steps."""
    lines = []

    def key(r: dict) -> tuple:
        sampler = r["sampler"].removesuffix("_fim")
        return r["world"], r["task"], r["process"], sampler, r.get("prompt_view"), r["steps"]

    oracles = {key(r): r for r in oracle}
    for world in tasks:
        for task in tasks[world]:
            mine = [r for r in rows if (r["world"], r["task"], r["seed"]) == (world, task, 0)]
            if not mine:
                continue
            lines += ["", f"### {world}: {task}, learned models beside their oracles", ""]
            cells = []
            for r in mine:
                o = oracles.get(key(r))
                cells.append([r["recipe"], r["sampler"], r.get("prompt_view", "-"),
                              r["steps"] or "-", r["tokens_per_call"], kl(r), kl(o) if o else None,
                              f"{r['kl_floor']:.4f} ± {r['kl_floor_se']:.4f}",
                              r["violation_rate"], o["violation_rate"] if o else None,
                              excess_nll(r)])  # fmt: skip
            columns = ["model", "sampler", "prompt view", "steps", "tokens/call", "KL rate",
                       "oracle's", "floor ± s.e.", "violations", "oracle's", "NLL − entropy"]  # fmt: skip
            lines.append(study.markdown_table(columns, cells))
    return lines


def excess_nll(row: dict) -> str:
    """NLL − entropy ± s.e. (bits per free token); a dash where no sample is allowed."""
    if row["nll_cond"] is None:
        return "-"
    se = "-" if row["nll_cond_se"] is None else f"{row['nll_cond_se']:.3f}"
    return f"{row['nll_cond'] - row['entropy_cond']:+.3f} ± {se}"


def kl(row: dict) -> object:
    """A KL rate cell: ∞ where it is infinite (None in the row)."""
    return "∞" if row["kl_rate"] is None else row["kl_rate"]


def infill_lines(rows: list[dict], oracle: list[dict]) -> list[str]:
    """The learned models' ``task=infill`` rows beside their oracle's (same world, process and
    span) and the exact conditional's ceiling on their own cases: ``exact`` is what a sampler
    drawing from the exact conditional averages, ``best`` the argmax's; ``of exact`` is the
    token accuracy as a fraction of ``exact`` (± its s.e.)."""
    if not rows:
        return []
    oracles = {(r["world"], r["process"], r["span"]): r for r in oracle}
    cells = []
    for r in rows:
        o = oracles.get((r["world"], r["process"], r["span"]))
        exact = r["exact_token_accuracy"]
        cells.append([r["world"], r["span"], r["recipe"], r["sampler"], r["cases"],
                      f"{r['token_accuracy']:.3f} ± {r['token_accuracy_se']:.3f}",
                      f"{r['token_accuracy'] / exact:.2f} ± {r['token_accuracy_se'] / exact:.2f}",
                      f"{o['token_accuracy']:.3f} ± {o['token_accuracy_se']:.3f}" if o else "-",
                      exact, r["best_token_accuracy"],
                      f"{r['span_exact']:.3f} ± {r['span_exact_se']:.3f}",
                      f"{o['span_exact']:.3f}" if o else "-", r["exact_span_exact"]])  # fmt: skip
    columns = ["world", "span", "model", "sampler", "cases", "token accuracy", "of exact",
               "oracle's", "exact", "best", "span exact", "oracle's", "exact"]  # fmt: skip
    return ["", "### `task=infill`, learned models beside their oracles and the exact ceiling",
            "", study.markdown_table(columns, cells)]  # fmt: skip
