"""docs/results/worlds_learned.{md,json,png} from the study's jobs (experiments/worlds_learned.py):
the tables, the validation curves, the data-constrained curves and every goal of issue 39."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import study
from worlds_learned_eval import evaluate_all, specs_of, world_of

from cdlm.io import atomic_path
from cdlm.run import logs


def val_nll(spec: str) -> float:
    """The world's exact NLL (bits/token) of the validation set every run of it scores."""
    from cdlm import worlds
    from cdlm.worlds.data import draw

    world = worlds.load(spec)
    val = draw(world, 256, world.length, "val", spec)
    return float(-world.log_prob(val).mean()) / world.length / math.log(2)


def curve(folder: Path, nll: float) -> list[tuple[int, float]]:
    """(optimizer step, val bound minus the val set's exact NLL) at every validation; Lightning
    logs a validation at the step before the one it follows, hence the +1."""
    points = logs.curve(logs.rows(folder), "val/bits_per_token")
    return [(step + 1, bits - nll) for step, bits in points]


def crossover(folder: Path, nll: float) -> list[dict]:
    """The data-constrained jobs' curves under ``folder`` (``--crossover``), in epochs."""
    out = []
    for job in study.table(folder)["rows"]:
        o, points = job["overrides"], curve(Path(job["folder"]), nll)
        if not points:
            continue
        sequences = int(o["data.train_size"])
        epochs = [(s * 32 / sequences, e) for s, e in points]  # batch 32
        best = min(epochs, key=lambda p: p[1])
        out.append({"world": "chars", "process": o["process"], "recipe": folder.name,
                    "train_tokens": sequences * 128, "train_sequences": sequences,
                    "steps": points[-1][0], "epochs": epochs[-1][0], "best_excess_bits": best[1],
                    "best_at_epochs": best[0], "curve": epochs, "overrides": o,
                    "cost": job["cost"]})  # fmt: skip
    return out


def paired_se(a: list[float], b: list[float]) -> float:
    """The standard error of the mean of a - b over paired draws."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    mean = sum(d) / len(d)
    return math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))


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
    for ckpt in sorted(folder.glob("**/model.safetensors")):
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
    found: dict,
    austen: tuple[list[dict], dict],
    unsped: set[str],
    pairs: list[tuple[str, str]],
) -> None:
    from worlds_learned import label_of
    from worlds_learned_goals import goals, markdown

    specs = specs_of(found, label_of, unsped)
    rows = evaluate_all(specs, args)
    nll = {w: val_nll(f"world:{w}") for w in ("chars", "agreement")}
    curves = {}
    for job in study.rows(found):
        if "teacher" not in job["overrides"]:
            world = world_of(job)
            curves[f"{world}/{label_of(job)}"] = curve(Path(job["folder"]), nll[world])
    cross, checks = [], []
    for folder in args.crossover:
        cross += crossover(Path(folder), nll["chars"])
        checks += settled(Path(folder))
    austen_rows, bounds = austen
    report = {
        "samples": args.samples,
        "likelihood_sequences": args.likelihood_sequences,
        "val_exact_nll_bits": nll,
        "jobs": [
            {k: j[k] for k in ("job", "overrides", "steps", "cost", "commit")}
            for j in found["rows"]
        ],
        "rows": rows,
        "curves": curves,
        "crossover": cross,
        "crossover_bounds": checks,
        "austen": austen_rows,
        "austen_bounds": austen_bounds(bounds, pairs),
    }
    report["goals"] = goals(report)
    out = args.results / "worlds_learned"
    commands = [
        "cdlm-train -m experiment=worlds_learned hydra/launcher=joblib hydra.launcher.n_jobs=2",
        "(the further sweeps in conf/experiment/worlds_learned.yaml)",
        "python experiments/worlds_learned.py "
        + " ".join(map(str, args.sweeps))
        + (" --austen " + " ".join(map(str, args.austen)) if args.austen else "")
        + (" --crossover " + " ".join(map(str, args.crossover)) if args.crossover else ""),
    ]
    title = "Learned models in exact worlds (issue 39)"
    path = study.write(
        "worlds_learned", title, markdown(report), report, commands, found, args.results
    )
    plot(curves, out.with_suffix(".png"), "optimizer step", "validation bound against the truth")
    if cross:
        plot({f"{c['recipe']} {c['process']} {c['train_tokens'] // 1000}k": c["curve"] for c in cross},
             out.with_name(out.name + "_crossover.png"), "epochs over the fixed sample",
             "data-constrained: a fixed sample of the character world")  # fmt: skip
    print(path.read_text())
