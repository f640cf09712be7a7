"""docs/results/worlds_learned.{md,json,png} from experiments/worlds_learned.py's runs: the tables, the
validation curves, the data-constrained curves and every goal of issue 39, said plainly."""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

from duo import with_prose
from worlds_learned_eval import evaluate_all, specs_of

from cdlm.io import atomic_path, atomic_write_text

SCRIPT = "experiments/worlds_learned.py"
END = "<!-- end measured -->"


def val_nll(spec: str) -> float:
    """The world's exact NLL (bits/token) of the validation set every run of it scores."""
    from cdlm import worlds
    from cdlm.worlds.data import draw

    world = worlds.load(spec)
    val = draw(world, 256, world.length, "val", spec)
    return float(-world.log_prob(val).mean()) / world.length / math.log(2)


def curve(run_dir: Path, nll: float) -> list[tuple[int, float]]:
    """(optimizer step, val bound minus the val set's exact NLL) at every validation."""
    found = sorted(run_dir.rglob("metrics.csv"))
    if not found:
        return []
    rows = [r for r in csv.DictReader(found[0].open()) if r.get("val/bits_per_token")]
    return [(int(r["step"]) + 1, float(r["val/bits_per_token"]) - nll) for r in rows]


def crossover(folder: Path, nll: float) -> list[dict]:
    """The data-constrained runs' curves (``--crossover``: one folder per run), in epochs."""
    out = []
    for run in sorted(p for p in folder.glob("*") if p.is_dir()):
        record = (
            json.loads((run / "duo_run.json").read_text())
            if (run / "duo_run.json").is_file()
            else {}
        )
        process, size = run.name.rsplit("-", 1)
        tokens = int(size.removesuffix("k")) * 1000
        points = curve(run, nll)
        if not points:
            continue
        sequences = tokens // 128
        epochs = [(s * 32 / sequences, e) for s, e in points]  # batch 32
        best = min(epochs, key=lambda p: p[1])
        out.append({"world": "chars", "process": process, "recipe": folder.name, "train_tokens": tokens,
                    "train_sequences": sequences, "steps": points[-1][0], "epochs": epochs[-1][0],
                    "best_excess_bits": best[1], "best_at_epochs": best[0], "curve": epochs,
                    "args": record.get("args"), "wall_seconds": record.get("wall_seconds")})  # fmt: skip
    return out


def paired_se(a: list[float], b: list[float]) -> float:
    """The standard error of the mean of a - b over paired draws."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    mean = sum(d) / len(d)
    return math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))


def clock_minutes(run_dir: Path) -> float:
    """The wall clock a run was given: its ``trainer.max_time=DD:HH:MM:SS`` override."""
    args = json.loads((run_dir / "duo_run.json").read_text())["args"]
    given = next(a.split("=", 1)[1] for a in args if a.startswith("trainer.max_time="))
    days, hours, minutes, seconds = map(int, given.split(":"))
    return days * 1440 + hours * 60 + minutes + seconds / 60


def austen_bounds(bounds: dict[str, dict], pairs: list[tuple[str, str]]) -> list[dict]:
    """Each Austen pair (the recipe, then its lever) at the same draws: both bounds and the
    lever's paired difference."""
    out = []
    for before, after in pairs:
        if before in bounds and after in bounds:
            a, b = bounds[before], bounds[after]
            out.append({"before": before, "after": after, "draws": a["draws"],
                        "sequences": a["sequences"], "before_bits": a["bits_per_token"],
                        "before_se": a["std_error"], "after_bits": b["bits_per_token"],
                        "after_se": b["std_error"], "difference": b["bits_per_token"] - a["bits_per_token"],
                        "difference_se": paired_se(b["per_draw"], a["per_draw"])})  # fmt: skip
    return out


def settled(folder: Path, draws: int = 16) -> list[dict]:
    """For each crossover run that kept its model: the bound at ``draws`` draws on the
    validation set beside the masked oracle's at the same seeds (the paired difference is the
    model's excess without most of the estimator's noise)."""
    from cdlm import worlds
    from cdlm.evaluation.bound import val_bits_per_token
    from cdlm.model_file import load_model, oracle_model
    from cdlm.worlds.data import draw

    out = []
    for ckpt in sorted(folder.glob("*/model.safetensors")):
        model = load_model(ckpt)
        world = worlds.load(model.config["world"])
        oracle = oracle_model(world, model.config["process"])
        val = draw(world, 256, world.length, "val", model.config["world"])
        nll = float(-world.log_prob(val).mean()) / world.length / math.log(2)
        mine, theirs = (val_bits_per_token(m, val, 0, draws=draws) for m in (model, oracle))
        out.append({"run": ckpt.parent.name, "recipe": folder.name, "draws": draws,
                    "bound_minus_nll": mine["bits_per_token"] - nll,
                    "bound_se": mine.get("std_error"),
                    "oracle_bound_minus_nll": theirs["bits_per_token"] - nll,
                    "oracle_bound_se": theirs.get("std_error"),
                    "excess_over_oracle": mine["bits_per_token"] - theirs["bits_per_token"],
                    "excess_se": paired_se(mine["per_draw"], theirs["per_draw"])})  # fmt: skip
    return out


def plot(curves: dict[str, list[tuple[float, float]]], path: Path, xlabel: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for label, points in curves.items():
        if points:
            x, y = zip(*points, strict=True)
            ax.plot(x, y, marker=".", label=label)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xlabel=xlabel, ylabel="val bound - exact NLL (bits/token)", yscale="symlog", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")


def report(
    args: argparse.Namespace,
    runs: Path,
    state: dict,
    trained,
    evaluate: bool,
    unsped: set[str],
    pairs: list[tuple[str, str]],
) -> None:
    from budget import last_step
    from worlds_learned_goals import goals, markdown

    specs = specs_of(runs, trained, args, unsped)
    if evaluate:
        evaluate_all(specs, args, runs)
    rows = []
    for s in specs:  # each row with its run's steps as counted now, not as its cache has them
        done = runs / "evaluated" / f"{s['name']}.json"
        steps = {"train_steps": s["row"]["train_steps"]}
        rows += [r | steps for r in json.loads(done.read_text())] if done.is_file() else []
    nll = {w: val_nll(f"world:{w}") for w in ("chars", "agreement")}
    curves = {f"{w}/{label}": curve(d, nll[w]) for w, label, _, _, d in trained}
    cross, checks = [], []
    for folder in args.crossover or []:
        cross += crossover(Path(folder), nll["chars"])
        checks += settled(Path(folder))
    austen, bounds = [], {}
    found = (runs / "austen" / "evaluated").glob("austen-*.json")
    for p in sorted(found, key=lambda p: p.stem):  # by label: "+" sorts before ".json"
        label = p.stem.removeprefix("austen-")
        run_dir = runs / "austen" / label
        if (run_dir / "bound.json").is_file():
            bounds[label] = json.loads((run_dir / "bound.json").read_text())
        run = {"train_steps": last_step(run_dir), "minutes": clock_minutes(run_dir)}
        austen += [r | run for r in json.loads(p.read_text())]
    report = {
        "command": f"{SCRIPT} " + " ".join(sys.argv[1:]),
        "commits": state["commits"],
        "minutes": args.minutes,
        "jobs": args.jobs,
        "samples": args.samples,
        "likelihood_sequences": args.likelihood_sequences,
        "val_exact_nll_bits": nll,
        "rows": rows,
        "curves": curves,
        "crossover": cross,
        "crossover_bounds": checks,
        "austen": austen,
        "austen_bounds": austen_bounds(bounds, pairs),
    }
    report["goals"] = goals(report)
    out = args.out
    plot(curves, out.with_suffix(".png"), "optimizer step",
         f"validation bound against the truth, {args.minutes:g} min per model")  # fmt: skip
    if cross:
        plot({f"{c['recipe']} {c['process']} {c['train_tokens'] // 1000}k": c["curve"] for c in cross},
             out.with_name(out.name + "_crossover.png"), "epochs over the fixed sample",
             "data-constrained: a fixed sample of the character world")  # fmt: skip
    atomic_write_text(out.with_suffix(".json"), json.dumps(report, indent=1) + "\n")
    md = out.with_suffix(".md")
    atomic_write_text(md, with_prose(md, markdown(report), SCRIPT))
    print(markdown(report))
