"""Learning efficiency (issue 49): how many optimizer steps and training FLOPs each process needs
to come within ε bits/token of its world's oracle, divided by AR's: the compute multiplier,
measured exactly. docs/results/learning.{md,json,png} from the study's sweep folders.

    cdlm-train -m experiment=learning hydra/launcher=joblib hydra.launcher.n_jobs=2
    cdlm-train -m experiment=learning_tokens hydra/launcher=joblib hydra.launcher.n_jobs=1
    python experiments/learning.py multirun/learning multirun/learning_tokens [more folders]

Every job validates on its world's fixed sequences and logs ``val/excess_bits`` (its bound
minus the same-process oracle's on the same draws) and ``train/flops`` (the running total);
this script reads those curves through the study's table (``cdlm-table``'s collector). The
crossing of ε is interpolated between validations; "not reached" keeps the last value and the
final slope. A crossing at a job's first validation is only a bound (it may have come sooner),
so jobs may validate at different intervals: AR's reference crossing comes from its jobs that
measured it (``trainer.val_check_interval=10`` over the first steps of the same schedule,
``trainer.max_steps=150 lr_scheduler.total_steps=600``), at AR's best learning rate. A
multiplier divides a job's crossing by that reference in the same world. Leaving the unigram
plateau (the excess below half of a context-free model's, exact from the world) is measured
against AR's in the same way.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import study

from cdlm.evaluation.excess import GroupBits, paired_bound

EPSILONS = (0.2, 0.1, 0.05)
EXCESS, SE, FLOPS = "val/excess_bits", "val/excess_se", "train/flops"
# overrides that name a row rather than a lever
NAMING = {"process", "seed", "optimizer.lr", "data.world", "data", "resume", "experiment"}
# how a job ran or was measured, not what it trained (steps and schedule are columns of their own)
QUIET = ("hydra", "trainer.enable_progress_bar", "trainer.max_steps", "trainer.val_check_interval",
         "lr_scheduler.total_steps")  # fmt: skip
AR = "autoregressive"
LEAVE = "plateau/2"  # "left the plateau": the excess below half of the unigram model's


@functools.cache
def plateau_bits(world: str) -> float:
    """The unigram plateau of ``world:<world>`` (at the study's length, 128): the excess, bits
    per token, of the best model that ignores context (each position's own marginal; in a
    stationary chain, the unigram): the world's total correlation over its length, exactly. A
    model on it has learned the token frequencies and nothing else."""
    from cdlm import worlds

    found = worlds.load(f"world:{world}")
    return found.total_correlation() / found.length / math.log(2)


def label(overrides: dict[str, str]) -> str:
    """The lever of a job: its overrides that are not its process, seed, world or rate, with a
    recipe read as the settings it stands for."""
    lever = {k: v for k, v in overrides.items() if k not in NAMING and not k.startswith(QUIET)}
    if "recipe" in lever:
        lever = recipe_settings(lever.pop("recipe")) | lever
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


@dataclass
class Ran:
    """How a job ran, read from its Hydra folder: its process and world (a recipe or an
    experiment picks them, so the overrides need not name them), optimizer.lr and its schedule's
    length in steps; None where the folder lacks them."""

    process: str | None = None
    world: str | None = None
    lr: float | None = None
    schedule: int | None = None


def ran_with(row: dict) -> Ran:
    """The job's ``Ran`` (its ``.hydra/config.yaml`` and ``hydra.yaml``)."""
    from omegaconf import OmegaConf

    folder = Path(row["folder"]) / ".hydra"
    if not (folder / "config.yaml").is_file():
        return Ran()
    ran = OmegaConf.load(folder / "config.yaml")
    hydra = OmegaConf.load(folder / "hydra.yaml") if (folder / "hydra.yaml").is_file() else None
    process = OmegaConf.select(hydra, "hydra.runtime.choices.process") if hydra else None
    world = OmegaConf.select(ran, "data.world")
    return Ran(process, world, float(ran.optimizer.lr), int(ran.lr_scheduler.total_steps))


def recipe_settings(name: str) -> dict[str, str]:
    """What ``recipe=name`` (conf/recipe/) sets besides its process and learning rate, as the
    overrides that set it by hand (``masked_no_ar_phase``: ``phases=none``), so that a recipe's
    row and the same settings given on the command line share a lever. Read from this checkout's
    conf/, not the job's commit."""
    from omegaconf import OmegaConf

    from cdlm import config_dir

    recipe = OmegaConf.to_container(OmegaConf.load(config_dir() / "recipe" / f"{name}.yaml"))
    found = {}
    for entry in recipe.pop("defaults", []):
        for key, value in entry.items():  # {"override /phases": "none"}
            group = key.removeprefix("override ").lstrip("/")
            if group != "process":
                found[group] = str(value)

    def flat(node: dict, prefix: str = "") -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                flat(value, f"{prefix}{key}.")
            elif not f"{prefix}{key}".startswith("optimizer."):  # the lr is a column
                found[f"{prefix}{key}"] = str(value)

    flat(recipe)
    return found


def job(row: dict) -> dict | None:
    """One job's row of the study (the issue's fields), None without an excess curve."""
    curve = study.job_curve(row, EXCESS)
    if not curve:
        return None
    flops = study.job_curve(row, FLOPS)
    ses = study.job_curve(row, SE)
    overrides = row["overrides"]
    steps_to = {str(e): study.crossing(curve, e) for e in EPSILONS}
    ran = ran_with(row)
    world = (ran.world or overrides.get("data.world", "world:chars")).removeprefix("world:")
    plateau = plateau_bits(world)
    leave = study.crossing(curve, plateau / 2)
    return {
        "world": world,
        "process": ran.process or overrides.get("process", "gaussian"),
        "lever": label(overrides),
        "seed": int(overrides.get("seed", 0)),
        "lr": ran.lr,
        "steps": row["steps"],
        "schedule_steps": ran.schedule,
        "val_every": curve[1][0] - curve[0][0] if len(curve) > 1 else None,
        "flops": flops[-1][1] if flops else None,
        "excess_bits": curve[-1][1],
        "excess_se": ses[-1][1] if ses else None,
        "final_slope_per_100_steps": (s * 100 if (s := study.slope(curve)) is not None else None),
        "steps_to_eps": steps_to,
        "flops_to_eps": {e: flops_at(flops, s) for e, s in steps_to.items()},
        # below ε at its first validation: the crossing is an upper bound, not a measurement
        "first_validation_bound": {str(e): curve[0][1] <= e for e in EPSILONS}
        | {LEAVE: curve[0][1] <= plateau / 2},
        "plateau_bits": plateau,
        "steps_to_leave": {LEAVE: leave},
        "flops_to_leave": {LEAVE: flops_at(flops, leave)},
        "curve": curve,
        "job": row["folder"],
    }


def reference(rows: list[dict], world: str, field: str, eps: str) -> dict | None:
    """AR's crossing of ``eps`` in ``world`` (``field``: steps_to_eps or flops_to_eps): the mean
    over the seeds of AR's fastest learning rate. Jobs that crossed after their first validation
    measured it; a crossing at the first validation counts only when no job measured one (then
    ``bound`` is True: every multiplier over it is a lower bound). A rate at which some AR job
    never got there gives no reference."""
    ar = [r for r in rows if r["world"] == world and r["process"] == AR]
    measured = [r for r in ar if r[field][eps] is not None and not r["first_validation_bound"][eps]]
    bound = not measured
    usable = measured or [r for r in ar if r[field][eps] is not None]
    best = None
    for lr in {r["lr"] for r in usable}:
        if any(r[field][eps] is None for r in ar if r["lr"] == lr):
            continue
        at = [r[field][eps] for r in usable if r["lr"] == lr]
        if best is None or statistics.mean(at) < best["value"]:
            best = {"value": statistics.mean(at), "lr": lr, "seeds": len(at), "bound": bound}
    return best


def multipliers(rows: list[dict]) -> dict:
    """Each row's multiplier per ε, and to leave the plateau: its steps (and FLOPs) over AR's
    reference in its world; returns the references, by world, field and ε (or ``LEAVE``)."""
    refs = {}
    fields = (
        ("multiplier", "steps_to_eps", EPSILONS),
        ("flops_multiplier", "flops_to_eps", EPSILONS),
        ("leave_multiplier", "steps_to_leave", (LEAVE,)),
        ("leave_flops_multiplier", "flops_to_leave", (LEAVE,)),
    )
    for key, field, levels in fields:
        if not all(field in r for r in rows):
            continue
        for world in {r["world"] for r in rows}:
            refs.setdefault(world, {})[field] = {
                str(e): reference(rows, world, field, str(e)) for e in levels
            }
        for row in rows:
            row[key] = {}
            for e in map(str, levels):
                ref, mine = refs[row["world"]][field][e], row[field][e]
                row[key][e] = mine / ref["value"] if ref and mine is not None else None
    return refs


def spread(values: list, bounds: list[bool] | None = None) -> str:
    """Median [min, max] over seeds; "≤" where a crossing came at the first validation."""
    got = [v for v in values if v is not None]
    if not got:
        return "not reached"
    text = f"{statistics.median(got):.3g}"
    if len(got) > 1:
        text += f" [{min(got):.3g}, {max(got):.3g}]"
    if bounds and all(bounds):
        text = "≤ " + text
    return text + (f" ({len(values) - len(got)} not reached)" if len(got) < len(values) else "")


def groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows by what they trained: world, process, lever, learning rate, steps of which schedule."""
    found: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["world"], r["process"], r["lever"], r["lr"], r["steps"], r["schedule_steps"])
        found.setdefault(key, []).append(r)
    return dict(sorted(found.items(), key=lambda kv: tuple(map(str, kv[0]))))


def summary(rows: list[dict]) -> str:
    """One line per group: median and range over seeds."""
    cells = []
    for (world, process, lever, lr, steps, schedule), found in groups(rows).items():
        every = {r["val_every"] for r in found}
        cells.append([
            world, process, lever, f"{lr:g}" if lr else None, len(found),
            f"{steps} of {schedule}, val every {'/'.join(map(str, sorted(every)))}",
            spread([r["excess_bits"] for r in found]), spread([r["excess_se"] for r in found]),
            spread([r["final_slope_per_100_steps"] for r in found]),
            *(spread([r["steps_to_eps"][str(e)] for r in found],
                     [r["first_validation_bound"][str(e)] for r in found]) for e in EPSILONS),
            *(spread([r["multiplier"][str(e)] for r in found]) for e in EPSILONS),
            spread([r["flops_multiplier"]["0.1"] for r in found]),
        ])  # fmt: skip
    columns = ["world", "process", "lever", "lr", "seeds", "steps", "final excess (bits)",
               "its SE", "slope /100 steps", *(f"steps to ε={e}" for e in EPSILONS),
               *(f"× AR, ε={e}" for e in EPSILONS), "× AR FLOPs, ε=0.1"]  # fmt: skip
    return study.markdown_table(columns, cells)


def references(refs: dict) -> str:
    """What every multiplier divides by: AR's crossing per world and ε."""
    lines = []
    for world, fields in sorted(refs.items()):
        for e, ref in fields["steps_to_eps"].items():
            if ref is None:
                lines.append(f"- {world}, ε={e}: AR never got there; no multiplier")
                continue
            flops = fields["flops_to_eps"][e]
            lines.append(
                f"- {world}, ε={e}: AR at {'≤ ' if ref['bound'] else ''}{ref['value']:.3g} steps"
                + (f", {flops['value']:.3g} FLOPs" if flops else "")
                + f" (lr {ref['lr']:g}, mean of {ref['seeds']} seed(s))"
                + (
                    "; crossed by its first validation, so the multipliers are lower bounds"
                    if ref["bound"]
                    else ""
                )  # fmt: skip
            )
    return "AR's crossings, the multipliers' denominator:\n\n" + "\n".join(lines) + "\n"


def leaving(rows: list[dict], refs: dict) -> str:
    """Each group's steps to leave its world's unigram plateau (the excess below half the
    unigram model's), and the multiple of AR's."""
    cells = []
    for (world, process, lever, lr, steps, _), found in groups(rows).items():
        plateau = found[0]["plateau_bits"]
        cells.append([
            world, process, lever, f"{lr:g}" if lr else None, len(found), steps,
            f"{plateau:.3f}", f"{plateau / 2:.3f}",
            spread([r["steps_to_leave"][LEAVE] for r in found],
                   [r["first_validation_bound"][LEAVE] for r in found]),
            spread([r["leave_multiplier"][LEAVE] for r in found]),
            spread([r["leave_flops_multiplier"][LEAVE] for r in found]),
        ])  # fmt: skip
    lines = []
    for world, fields in sorted(refs.items()):
        ref = fields["steps_to_leave"][LEAVE]
        lines.append(
            f"- {world}: AR at {'≤ ' if ref['bound'] else ''}{ref['value']:.3g} steps "
            f"(lr {ref['lr']:g}, mean of {ref['seeds']} seed(s))"
            if ref
            else f"- {world}: AR never left it; no multiplier"
        )
    columns = ["world", "process", "lever", "lr", "seeds", "steps", "unigram plateau (bits)",
               "leaves below (bits)", "steps to leave", "× AR steps", "× AR FLOPs"]  # fmt: skip
    return (
        "Leaving the unigram plateau (the excess of the best model that ignores context, exact "
        "from the world):\n\n" + study.markdown_table(columns, cells)
        + "\nAR's steps to leave it, the multipliers' denominator:\n\n" + "\n".join(lines) + "\n"
    )  # fmt: skip


def best_rates(rows: list[dict]) -> str:
    """Each process and lever at its best learning rate (RePlaid's protocol): among one seed's
    jobs of equal steps that tried more than one rate, the lowest final excess."""
    trials: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["seed"] == min(x["seed"] for x in rows):
            trials.setdefault((r["world"], r["process"], r["lever"], r["steps"]), []).append(r)
    cells = []
    for (world, process, lever, steps), found in sorted(trials.items()):
        if len({r["lr"] for r in found}) < 2:
            continue
        best = min(found, key=lambda r: r["excess_bits"])
        tried = ", ".join(
            f"{r['lr']:g}: {r['excess_bits']:.3g}" for r in sorted(found, key=lambda r: r["lr"])
        )
        cells.append([world, process, lever, steps, tried, f"{best['lr']:g}",
                      best["steps_to_eps"]["0.1"], best["multiplier"]["0.1"],
                      best["flops_multiplier"]["0.1"]])  # fmt: skip
    if not cells:
        return ""
    columns = ["world", "process", "lever", "steps", "final excess by lr (one seed)", "best lr",
               "steps to ε=0.1", "× AR, ε=0.1", "× AR FLOPs, ε=0.1"]  # fmt: skip
    return "Each process at its best learning rate:\n\n" + study.markdown_table(columns, cells)


def group_bits_of(folder: Path) -> GroupBits | None:
    """The job's val bound in groups (``bound.json``, written by ``scripts/gpu_learning.py
    bounds``), None before it is scored."""
    path = folder / "bound.json"
    if not path.is_file():
        return None
    return GroupBits.from_json(json.loads(path.read_text()))


def reports(sweep: Path, metric: str) -> dict[str, dict]:
    """The ``cdlm-eval -m metric=<metric>`` reports of a sweep folder (each job's one JSON file),
    keyed by the training job their ``ckpt`` names (its folder's last part)."""
    if not sweep.is_dir():
        return {}
    found = {}
    for row in study.rows(study.table(sweep)):
        files = [p for p in Path(row["folder"]).glob("*.json") if p.name != "run.json"]
        report = next((json.loads(p.read_text()) for p in files), None)
        if report and report.get("metric") == metric:
            found[Path(row["overrides"]["ckpt"]).name] = report
    return found


def austen_row(row: dict, frontier: dict | None, mauve: dict | None) -> dict:
    """One Austen job: its bound, frontier points and MAUVE (the pairing comes after)."""
    recipe = row["overrides"]["recipe"]
    process = recipe.split("_")[0]
    out = {"world": "austen", "process": process, "lever": recipe.removeprefix(process)[1:]
           or "default", "recipe": recipe, "seed": int(row["overrides"].get("seed", 0)),
           "steps": row["steps"], "flops": row["metrics"].get(FLOPS), "job": row["folder"]}  # fmt: skip
    if frontier:
        out["frontier"] = [{"temperature": p["temperature"], "entropy": p["entropy"],
                            "gen_ppl": p["gen_ppl"], "gen_ppl_se": p["quality"].get("gen_ppl_se")}
                           for p in frontier["points"]]  # fmt: skip
        out["real_entropy"] = frontier["reference"]["token_entropy_bits"]
        out["real_gen_ppl"] = frontier["reference"].get("gen_ppl")
        out["gen_ppl_at_real_entropy"] = frontier["gen_ppl_at_reference_entropy"]
        at_one = [p for p in out["frontier"] if p["temperature"] == 1.0]
        out["entropy_over_real_at_t1"] = (
            at_one[0]["entropy"] / out["real_entropy"] if at_one else None
        )
        out["frontier_samples"] = frontier["num_samples"]
        out["sampler"] = f"{frontier['sampler']['name']} {frontier['sampler']['steps']} steps"
    if mauve:
        out["mauve"] = {k: mauve["mauve"][k] for k in ("mean", "min", "median", "max")}
        out["mauve_seeds"] = len(mauve["mauve"]["per_seed"])
        out["mauve_samples"] = mauve["num_samples"]
    return out


def austen(root: Path) -> tuple[list[dict], dict]:
    """Issue 49 item 7: the jobs of ``root/austen`` (``experiment=learning_austen_cpu``), each
    with its bound, its lever's gain over its process's default paired at the same draws
    (positive: the lever is better), and the frontier and MAUVE of ``root/frontier`` and
    ``root/mauve``; returns the rows and the table of every job read."""
    found = study.table(
        *(p for p in (root / d for d in ("austen", "frontier", "mauve")) if p.is_dir())
    )
    frontiers, mauves = reports(root / "frontier", "frontier"), reports(root / "mauve", "mauve")
    rows, bits = [], {}
    for row in study.rows(found):
        if row["command"] != "cdlm-train":
            continue
        name = Path(row["folder"]).name
        got = austen_row(row, frontiers.get(name), mauves.get(name))
        if (b := group_bits_of(Path(row["folder"]))) is not None:
            bits[got["recipe"]] = b
            bound, se = b.bound()
            got |= {"bound_bits": bound, "bound_se": se,
                    "draws": b.bits.shape[0], "sequences": b.sequences}  # fmt: skip
        rows.append(got)
    for got in rows:
        default = bits.get(got["process"])
        if got["lever"] != "default" and default is not None and got["recipe"] in bits:
            pair = paired_bound(bits[got["recipe"]], default)
            got |= {"paired_gain_bits": -pair.excess_bits, "paired_gain_se": pair.excess_se}
    return rows, found


def austen_table(rows: list[dict]) -> str:
    """The Austen rows: bound and paired gain, then gen-PPL ± SE and entropy per temperature,
    gen-PPL at real text's entropy, and MAUVE."""
    cells = []
    for r in rows:
        gain = r.get("paired_gain_bits")
        points = "; ".join(f"T {p['temperature']:g}: {study.fmt(p['gen_ppl'], 0)} ± "
                           f"{study.fmt(p['gen_ppl_se'], 0)} at {p['entropy']:.2f}"
                           for p in r.get("frontier", []))  # fmt: skip
        m = r.get("mauve")
        cells.append([
            r["process"], r["lever"], r["steps"],
            f"{r['bound_bits']:.3f} ± {r['bound_se']:.3f}" if "bound_bits" in r else None,
            f"{gain:+.3f} ± {r['paired_gain_se']:.3f} ({gain / r['paired_gain_se']:+.1f} SE)"
            if gain is not None else "-",
            r.get("sampler"), points or None, study.fmt(r.get("gen_ppl_at_real_entropy"), 0),
            study.fmt(r.get("entropy_over_real_at_t1")),
            (f"{m['mean']:.3f} ({m['min']:.3f}-{m['max']:.3f})" if r["mauve_seeds"] > 1
             else f"{m['mean']:.3f} (1 seed)") if m else None,
        ])  # fmt: skip
    columns = ["process", "lever", "steps", "val bound (bits/token)", "paired gain over default",
               "sampler", "gen-PPL ± SE at entropy, by T", "gen-PPL at real entropy",
               "entropy / real, T=1", "MAUVE mean (min-max over seeds)"]  # fmt: skip
    real = next((r for r in rows if "real_entropy" in r), None)
    line = (f"\nReal val text under the same scorer: entropy {real['real_entropy']:.2f} bits, "
            f"gen-PPL {study.fmt(real['real_gen_ppl'], 1)}.\n" if real else "")  # fmt: skip
    return (
        "Austen, 10 minutes, a pair trained together:\n\n"
        + study.markdown_table(columns, cells)
        + line
    )


def figure(rows: list[dict], path: Path) -> None:
    """Excess against steps (top) and training FLOPs (bottom), a column per world."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted({r["world"] for r in rows})
    fig, axes = plt.subplots(2, len(worlds), figsize=(7 * len(worlds), 9), squeeze=False)
    keys = sorted({(r["process"], r["lever"], r["lr"]) for r in rows}, key=str)
    cmap = plt.get_cmap("tab20")
    colour = {k: cmap(i % 20) for i, k in enumerate(keys)}
    for column, world in enumerate(worlds):
        for r in (r for r in rows if r["world"] == world):
            key = (r["process"], r["lever"], r["lr"])
            flops = dict(study.job_curve({"folder": r["job"]}, FLOPS)) if r["flops"] else {}
            xs, ys = zip(*r["curve"], strict=True)
            ys = [max(y, 1e-3) for y in ys]
            style = {"color": colour[key], "ls": "-:--"[r["seed"] % 3], "lw": 1}
            axes[0][column].plot(xs, ys, label=f"{r['process']} {r['lever']} lr {r['lr']:g} "
                                 f"s{r['seed']}", **style)  # fmt: skip
            at = [(flops[x], y) for x, y in zip(xs, ys, strict=True) if x in flops]
            if at:
                axes[1][column].plot(*zip(*at, strict=True), **style)
        for row, xlabel in enumerate(("optimizer steps", "training FLOPs")):
            ax = axes[row][column]
            ax.set(yscale="log", xlabel=xlabel, ylabel="excess over oracle (bits/token)")
            ax.set_xscale("log" if row else "linear")
            ax.set_title(world)
            # leaving the unigram plateau: below this line
            ax.axhline(plateau_bits(world) / 2, color="k", ls=":", lw=0.8, label="plateau / 2")
        axes[0][column].legend(fontsize=5, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def sweep_command(sweep: Path) -> str:
    """The ``cdlm-train -m`` command that made a sweep folder (Hydra's ``multirun.yaml``), its
    ``hydra.sweep.dir`` named as this script was given it (a results doc names no machine path)."""
    from omegaconf import OmegaConf

    made = OmegaConf.load(sweep / "multirun.yaml").hydra.overrides
    words = [str(o) for o in [*made.task, *made.hydra]]
    words = [f"hydra.sweep.dir={sweep}" if w.startswith("hydra.sweep.dir=/") else w for w in words]
    return "cdlm-train -m " + " ".join(words)


def austen_commands(root: Path) -> list[str]:
    """The Austen training sweep's command, the bounds that pair it, and the eval sweeps' own
    commands (Hydra's ``multirun.yaml``)."""
    from omegaconf import OmegaConf

    found = [study.sweep_command(root / "austen"), f"python scripts/gpu_learning.py bounds {root} "
             f"--out {root}/bounds.json"]  # fmt: skip
    for metric in ("frontier", "mauve"):
        if (root / metric / "multirun.yaml").is_file():
            made = OmegaConf.load(root / metric / "multirun.yaml").hydra.overrides
            found.append("cdlm-eval -m " + " ".join(str(o) for o in [*made.task, *made.hydra]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sweeps", type=Path, nargs="+", help="the study's sweep folders")
    parser.add_argument("--name", default="learning", help="docs/results/<name>.{md,json,png}")
    parser.add_argument("--results", type=Path, default=study.RESULTS, help="where the doc goes")
    parser.add_argument("--austen", type=Path, help="the Austen root: austen/, frontier/, mauve/")
    args = parser.parse_args()
    found = study.table(*args.sweeps)
    austen_rows, austen_found = austen(args.austen) if args.austen else ([], {"rows": []})
    found["rows"] += austen_found["rows"]
    rows = [got for row in study.rows(found) if (got := job(row)) is not None]
    if not rows:
        raise SystemExit(f"learning.py: no finished job logged {EXCESS} under {args.sweeps}")
    refs = multipliers(rows)
    commands = [
        *map(sweep_command, args.sweeps),
        *(austen_commands(args.austen) if args.austen else []),
        "python experiments/learning.py "
        + " ".join(map(str, args.sweeps))
        + (f" --austen {args.austen}" if args.austen else ""),
    ]
    body = "\n".join(
        [
            summary(rows),
            references(refs),
            leaving(rows, refs),
            best_rates(rows),
            austen_table(austen_rows) if austen_rows else "",
            f"![excess against steps and FLOPs]({args.name}.png)\n",
        ]
    )
    title = "Learning efficiency in exact worlds"
    path = study.write(
        args.name,
        title,
        body,
        {"ar_reference": refs, "rows": rows + austen_rows},
        commands,
        found,
        args.results,
    )
    figure(rows, path.with_suffix(".png"))
    print(path.read_text())


if __name__ == "__main__":
    main()
