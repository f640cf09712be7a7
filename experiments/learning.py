"""Learning efficiency (issue 49): how many optimizer steps and training FLOPs each process needs
to come within ε bits/token of its world's oracle, divided by AR's: the compute multiplier,
measured exactly. docs/results/learning.{md,json,png} from the study's sweep folders.

    cdlm-train -m experiment=learning hydra/launcher=joblib hydra.launcher.n_jobs=2
    python experiments/learning.py multirun/learning [more sweep folders: levers, learning rates]

Every job validates on its world's fixed sequences and logs ``val/excess_bits`` (its bound
minus the same-process oracle's on the same draws) and ``train/flops`` (the running total);
this script reads those curves through the study's table (``cdlm-table``'s collector). The
crossing of ε is interpolated between validations; "not reached" keeps the last value and the
final slope. A multiplier divides by AR's mean over seeds in the same world.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import study

EPSILONS = (0.2, 0.1, 0.05)
EXCESS, SE, FLOPS = "val/excess_bits", "val/excess_se", "train/flops"
# overrides that name a row rather than a lever
NAMING = {"process", "seed", "optimizer.lr", "data.world", "data", "resume", "experiment"}
QUIET = ("hydra", "trainer.enable_progress_bar")  # how a job ran, not what it trained
AR = "autoregressive"


def label(overrides: dict[str, str]) -> str:
    """The lever of a job: its overrides that are not its process, seed, world or rate."""
    lever = {k: v for k, v in overrides.items() if k not in NAMING and not k.startswith(QUIET)}
    return " ".join(f"{k}={v}" for k, v in sorted(lever.items())) or "default"


def flops_at(flops: list[tuple[int, float]], step: float | None) -> float | None:
    """The running FLOP count at a (fractional) step, linear between logged steps."""
    if step is None:
        return None
    previous = (0, 0.0)
    for s, f in flops:
        if s >= step:
            s0, f0 = previous
            return f0 + (f - f0) * (step - s0) / (s - s0) if s > s0 else f
        previous = (s, f)
    return None


def learning_rate(row: dict) -> float | None:
    """The job's optimizer.lr as it ran (its Hydra config), None where the folder lacks it."""
    from omegaconf import OmegaConf

    config = Path(row["folder"]) / ".hydra" / "config.yaml"
    return float(OmegaConf.load(config).optimizer.lr) if config.is_file() else None


def job(row: dict) -> dict | None:
    """One job's row of the study (the issue's fields), None without an excess curve."""
    curve = study.job_curve(row, EXCESS)
    if not curve:
        return None
    flops = study.job_curve(row, FLOPS)
    ses = study.job_curve(row, SE)
    overrides = row["overrides"]
    steps_to = {str(e): study.crossing(curve, e) for e in EPSILONS}
    return {
        "world": overrides.get("data.world", "world:chars").removeprefix("world:"),
        "process": overrides.get("process", "gaussian"),
        "lever": label(overrides),
        "seed": int(overrides.get("seed", 0)),
        "lr": learning_rate(row),
        "steps": row["steps"],
        "flops": flops[-1][1] if flops else None,
        "excess_bits": curve[-1][1],
        "excess_se": ses[-1][1] if ses else None,
        "final_slope_per_100_steps": (s * 100 if (s := study.slope(curve)) is not None else None),
        "steps_to_eps": steps_to,
        "flops_to_eps": {e: flops_at(flops, s) for e, s in steps_to.items()},
        "curve": curve,
        "job": row["folder"],
    }


def multipliers(rows: list[dict]) -> None:
    """Each row's multiplier per ε: its steps (and FLOPs) over AR's mean in its world."""
    for key, field in (("multiplier", "steps_to_eps"), ("flops_multiplier", "flops_to_eps")):
        for row in rows:
            ar = [r[field] for r in rows if r["world"] == row["world"] and r["process"] == AR]
            row[key] = {}
            for e in map(str, EPSILONS):
                reached = [a[e] for a in ar if a[e] is not None]
                mine = row[field][e]
                ok = reached and mine is not None and len(reached) == len(ar)
                row[key][e] = mine / statistics.mean(reached) if ok else None


def summary(rows: list[dict]) -> str:
    """One line per (world, process, lever): median and range over seeds."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["world"], r["process"], r["lever"]), []).append(r)
    cells = []
    for (world, process, lever), found in sorted(groups.items()):

        def spread(values: list) -> str:
            got = [v for v in values if v is not None]
            if not got:
                return "not reached"
            text = f"{statistics.median(got):.3g}"
            if len(got) > 1:
                text += f" [{min(got):.3g}, {max(got):.3g}]"
            return text + (
                f" ({len(values) - len(got)} not reached)" if len(got) < len(values) else ""
            )

        cells.append([
            world, process, lever, len(found), statistics.median(r["steps"] for r in found),
            spread([r["excess_bits"] for r in found]), spread([r["excess_se"] for r in found]),
            spread([r["final_slope_per_100_steps"] for r in found]),
            *(spread([r["steps_to_eps"][str(e)] for r in found]) for e in EPSILONS),
            *(spread([r["multiplier"][str(e)] for r in found]) for e in EPSILONS),
            spread([r["flops_multiplier"]["0.1"] for r in found]),
        ])  # fmt: skip
    columns = ["world", "process", "lever", "seeds", "steps", "final excess (bits)", "its SE",
               "slope /100 steps", *(f"steps to ε={e}" for e in EPSILONS),
               *(f"× AR, ε={e}" for e in EPSILONS), "× AR FLOPs, ε=0.1"]  # fmt: skip
    return study.markdown_table(columns, cells)


def figure(rows: list[dict], path: Path) -> None:
    """Excess against steps, a panel per world."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted({r["world"] for r in rows})
    fig, axes = plt.subplots(1, len(worlds), figsize=(6 * len(worlds), 4), squeeze=False)
    keys = sorted({(r["process"], r["lever"]) for r in rows})
    colour = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(keys)}
    for ax, world in zip(axes[0], worlds, strict=True):
        for r in (r for r in rows if r["world"] == world):
            xs, ys = zip(*r["curve"], strict=True)
            key = (r["process"], r["lever"])
            ax.plot(xs, [max(y, 1e-3) for y in ys], color=colour[key], ls="-:--"[r["seed"] % 3],
                    label=f"{r['process']} {r['lever']} s{r['seed']}")  # fmt: skip
        ax.set(yscale="log", xlabel="optimizer steps", ylabel="excess over oracle (bits/token)")
        ax.set_title(world)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def sweep_command(sweep: Path) -> str:
    """The ``cdlm-train -m`` command that made a sweep folder (Hydra's ``multirun.yaml``)."""
    from omegaconf import OmegaConf

    made = OmegaConf.load(sweep / "multirun.yaml").hydra.overrides
    return "cdlm-train -m " + " ".join(str(o) for o in [*made.task, *made.hydra])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sweeps", type=Path, nargs="+", help="the study's sweep folders")
    parser.add_argument("--name", default="learning", help="docs/results/<name>.{md,json,png}")
    parser.add_argument("--results", type=Path, default=study.RESULTS, help="where the doc goes")
    args = parser.parse_args()
    found = study.table(*args.sweeps)
    rows = [got for row in study.rows(found) if (got := job(row)) is not None]
    if not rows:
        raise SystemExit(f"learning.py: no finished job logged {EXCESS} under {args.sweeps}")
    multipliers(rows)
    commands = [
        *map(sweep_command, args.sweeps),
        "python experiments/learning.py " + " ".join(map(str, args.sweeps)),
    ]
    body = summary(rows) + f"\n![excess against steps]({args.name}.png)\n"
    title = "Learning efficiency in exact worlds"
    path = study.write(args.name, title, body, {"rows": rows}, commands, found, args.results)
    figure(rows, path.with_suffix(".png"))
    print(path.read_text())


if __name__ == "__main__":
    main()
