"""The continuous-process recipes of docs/results/continuous.md against masked and AR, same budget, one run.

    python experiments/continuous.py --train --minutes 10 --jobs 2   # the Hydra multirun
    python experiments/continuous.py --out docs/results/continuous            # evaluate those runs

Training is the toolkit's own sweep path: one ``cdlm-train -m experiment=quickstart
recipe=a,b,... hydra/launcher=joblib`` multirun over the rows of ``conf/recipe/`` (each a piece
added to today's recipe, all pieces, masked, AR), ``--jobs`` at a time with one CPU thread each,
so that every row gets the same wall clock on the same share of the machine. Evaluation, per
run: the val bound (bits/token, ± standard error over noise draws) through
``cdlm.evaluation.harness``; gen-PPL (SmolLM2-135M) beside token entropy for each sampler in
SAMPLERS, at each step count and temperature; for diffusion models the context gain over the
no-context readout at t = 0.7, 0.8, 0.9 (``cdlm.evaluation.context``). Writes ``<out>.json``
(``{"rows": [...]}``) and the measured section of ``<out>.md`` (prose around the markers kept).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from budget import duration, last_step
from omegaconf import OmegaConf

from cdlm.evaluation.context import context_use
from cdlm.evaluation.frontier import at_entropy
from cdlm.evaluation.harness import evaluate_checkpoint
from cdlm.evaluation.quality import load_scorer
from cdlm.generation import named_sampler, with_temperature
from cdlm.io import atomic_path, atomic_write_text
from cdlm.likelihood.evaluate import corpus_split
from cdlm.model_file import load_model

RECIPES = [
    "today", "shared", "logit_normal", "gumbel", "xpred", "self_cond", "combined", "masked",
    "autoregressive",
]  # fmt: skip
# process -> [(sampler label, conf/sampler name, options)]; each at every --steps count
SAMPLERS = {
    "gaussian": [
        ("ddpm", "ddpm", {}),
        ("ddim (eta 0: the probability-flow ODE)", "ddim", {}),
        ("dpmpp_2m (2nd-order ODE)", "dpmpp_2m", {}),
        ("sde (euler_maruyama, churn 1)", "euler_maruyama", {}),
        ("rolling", "rolling", {}),
    ],
    "masked": [("ancestral", "ancestral", {})],
    "autoregressive": [("ar", "ar", {"stop_at_eos": False})],
}
CONTEXT_TIMES = (0.7, 0.8, 0.9)
END = "<!-- end measured -->"


def begin(minutes: float, seed: int = 0) -> str:
    """The marker of one (budget, seed)'s measured section: each is its own run and section."""
    again = f" --seed {seed}" if seed else ""
    return f"<!-- measured: experiments/continuous.py --minutes {minutes:g}{again} -->"


def train(recipes: str, minutes: float, jobs: int, runs: Path, seed: int) -> None:
    """The multirun: the ``recipes`` on one budget, ``jobs`` at a time, one thread each."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    args = [
        "-m",
        "experiment=quickstart",
        f"recipe={recipes}",
        f"trainer.max_time={duration(minutes * 60)}",
        f"seed={seed}",
        "logger=csv",
        "hydra/launcher=joblib",
        f"hydra.launcher.n_jobs={jobs}",
        f"hydra.sweep.dir={runs}",
        "hydra.sweep.subdir=${hydra:runtime.choices.recipe}",
        "+trainer.enable_progress_bar=false",
    ]
    subprocess.run([sys.executable, "-m", "cdlm.cli.train", *args], check=True, env=env)


def evaluate(recipe: str, ckpt: Path, args: argparse.Namespace, scorer) -> list[dict]:
    model = load_model(ckpt)
    process = model.process.kind
    common = {"process": process, "recipe": recipe, "budget_minutes": args.minutes}
    common["seed"] = OmegaConf.load(ckpt.parent / ".hydra" / "config.yaml").seed
    if common["seed"] != args.seed:
        raise SystemExit(f"{ckpt} was trained with seed {common['seed']}, not --seed {args.seed}")
    # the runs at a time, as the multirun launched them (not as this evaluation is told)
    launched = OmegaConf.load(ckpt.parent.parent / "multirun.yaml")
    common["parallel_runs"] = launched.hydra.launcher.n_jobs
    common["train_steps"] = last_step(ckpt.parent)
    context = {}
    if model.process.noise_levels:
        data = corpus_split(model)
        tokens = data.val_set.tokens[: args.likelihood_sequences]
        levels = context_use(model, tokens, data.log_unigram(), CONTEXT_TIMES)
        context = {f"context_gain_t{c['t']:g}": c["context_gain"] for c in levels}
        common["context_gain"] = context["context_gain_t0.8"]
    rows = []
    for i, (label, name, options, steps, temperature) in enumerate(configs(process, args)):
        report = measure(str(ckpt), process, (name, options, steps, temperature), args, scorer, i)
        if i == 0:
            bound = report["likelihood"]
            common |= {"bits_per_token": bound["bits_per_token"]}
            common |= {"bits_std_error": bound.get("std_error"), "bound": bound["kind"]}
            reference = report["quality"]["reference"]
        q = report["quality"]["samples"]
        rows.append(
            common
            | context
            | {
                "sampler": label,
                "steps": steps,
                "nfe": report["speed"]["steady"]["nfe"]["median"],
                "temperature": temperature,
                "gen_ppl": q.get("gen_ppl"),
                "entropy": q["token_entropy_bits"],
                "distinct_2": q["distinct_2"],
                "example": report["samples"][0][:200],
                "reference_gen_ppl": reference.get("gen_ppl"),
                "reference_entropy": reference["token_entropy_bits"],
            }
        )
        print(f"{recipe}: {label} @{steps} T={temperature:g}: {q.get('gen_ppl')}", flush=True)
    return rows


def measure(
    ckpt: str, process: str, config: tuple, args: argparse.Namespace, scorer, i: int
) -> dict:
    """The harness report of one (sampler, options, steps, temperature) config: temperature goes
    to the x0 softmax for gaussian (the process's sampling denoiser) and to the sampler (a masked
    sampler's step rule) for token processes, which refuse the process-level one. The bound on the first config only."""
    name, options, steps, temperature = config
    sampler, x0_temperature = sampler_at(process, named_sampler(name, **options), temperature)
    return evaluate_checkpoint(
        ckpt,
        sampler,
        steps=steps,
        num_samples=args.num_samples,
        seed=0,
        repeats=1,
        grid="uniform",
        scorer=scorer,
        device=torch.device("cpu"),
        likelihood_sequences=args.likelihood_sequences if i == 0 else 1,
        likelihood_draws=args.likelihood_draws if i == 0 else 1,
        cut_at_eos=False,
        temperature=x0_temperature,
    )


def sampler_at(process: str, sampler, temperature: float):
    """(the sampler, the gaussian x0 temperature): gaussian's temperature goes to its sampling
    denoiser, every token sampler draws at it itself (``with_temperature``)."""
    if process == "gaussian":
        return sampler, temperature
    return with_temperature(sampler, temperature), 1.0


def configs(process: str, args: argparse.Namespace) -> list[tuple]:
    """(label, sampler, options, steps, temperature) for one model: each sampler at every
    ``--steps`` count at temperature 1, then at ``--frontier-steps`` at every other
    ``--temperatures`` value (the frontier). AR takes one step count: it has none.
    ``--samplers`` keeps those of a process's samplers it names (all when it names none)."""
    steps = [1] if process == "autoregressive" else args.steps
    at = 1 if process == "autoregressive" else args.frontier_steps
    out = []
    chosen = [c for c in SAMPLERS[process] if not args.samplers or c[1] in args.samplers]
    for label, name, options in chosen or SAMPLERS[process]:
        out += [(label, name, options, s, 1.0) for s in steps]
        out += [(label, name, options, at, t) for t in args.temperatures if t != 1.0]
    return out


def table(rows: list[dict], args: argparse.Namespace) -> str:
    shares = sorted({r["parallel_runs"] for r in rows})
    lines = [
        f"Budget: {args.minutes:g} minutes of wall clock per row{_seed(args)}, "
        f"{' or '.join(map(str, shares))} runs at a time on the 2-core CPU (`parallel_runs` "
        "in the JSON), one thread each (the `--train` multirun). "
        f"{args.num_samples} samples of 128 tokens per row, scored by SmolLM2-135M; bound over "
        f"{args.likelihood_sequences} val sequences x {args.likelihood_draws} noise draws.",
        "",
        "| recipe | train steps | bits/token | gain t=0.7 / 0.8 / 0.9 | sampler | steps | NFE | T "
        "| gen-PPL | entropy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    seen = set()
    for r in rows:
        first = r["recipe"] not in seen
        seen.add(r["recipe"])
        error = f" ± {r['bits_std_error']:.3f}" if r.get("bits_std_error") else ""
        gains = " / ".join(
            f"{r[f'context_gain_t{t:g}']:.2f}" for t in CONTEXT_TIMES if f"context_gain_t{t:g}" in r
        )
        head = (
            f"| {r['recipe']} | {r['train_steps']} | {r['bits_per_token']:.3f}{error} | {gains} "
            if first
            else "| | | | "
        )
        ppl = r["gen_ppl"] if r["gen_ppl"] is not None else float("nan")
        lines.append(
            f"{head}| {r['sampler']} | {r['steps']} | {r.get('nfe', '')} | {r['temperature']:g} "
            f"| {ppl:.0f} | {r['entropy']:.2f} |"
        )
    ref = rows[0]
    lines.append(
        f"| real val text | | | | | | | | {ref['reference_gen_ppl']:.0f} "
        f"| {ref['reference_entropy']:.2f} |"
    )
    return "\n".join(lines) + "\n"


def curves(rows: list[dict], steps: int) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(recipe, sampler) -> its (entropy, gen-PPL) points at ``steps`` over the temperatures,
    by entropy (AR's at its one step count)."""
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in rows:
        if r["gen_ppl"] and r["steps"] == (1 if r["process"] == "autoregressive" else steps):
            out.setdefault((r["recipe"], r["sampler"]), []).append((r["entropy"], r["gen_ppl"]))
    return {key: sorted(points) for key, points in out.items()}


def frontier(rows: list[dict], args: argparse.Namespace) -> str:
    """The temperature frontier at ``--frontier-steps``: each (recipe, sampler)'s gen-PPL read
    at the entropy of masked ancestral at T = 1 and at real text's, so that no row wins by
    collapsing its entropy (Franca & Tong 2026)."""
    masked = [
        r["entropy"]
        for r in rows
        if r["recipe"] == "masked" and r["temperature"] == 1.0 and r["steps"] == args.frontier_steps
    ]
    targets = [("masked ancestral, T=1", masked[0])] if masked else []
    targets.append(("real val text", rows[0]["reference_entropy"]))
    head = " | ".join(f"gen-PPL at {h:.2f} bits ({name})" for name, h in targets)
    lines = [
        "",
        f"Temperature frontier at {args.frontier_steps} steps (AR at its own), T in "
        f"{', '.join(f'{t:g}' for t in args.temperatures)}: gen-PPL interpolated in log between "
        "the two temperatures whose entropies bracket the target (n/a: outside the sweep).",
        "",
        f"| recipe | sampler | {head} |",
        "|---|---|" + "---|" * len(targets),
    ]
    for (recipe, sampler), points in curves(rows, args.frontier_steps).items():
        reads = [at_entropy(points, h) for _, h in targets]
        cells = " | ".join(f"{v:.0f}" if v else "n/a" for v in reads)
        lines.append(f"| {recipe} | {sampler} | {cells} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], args: argparse.Namespace, path: Path) -> None:
    """Gen-PPL (log) against entropy, one line per (recipe, sampler) over the temperatures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    for (recipe, sampler), points in curves(rows, args.frontier_steps).items():
        h, p = zip(*points, strict=True)
        ax.plot(h, p, marker="o", label=f"{recipe}: {sampler.split(' (')[0]}")
    ref = rows[0]
    ax.plot(ref["reference_entropy"], ref["reference_gen_ppl"], "k*", ms=12, label="real text")
    ax.set(xlabel="token entropy (bits)", ylabel="gen-PPL (SmolLM2-135M)", yscale="log")
    ax.set_title(
        f"{args.minutes:g} minutes{_seed(args)}: temperature frontier at {args.frontier_steps} steps"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


def with_table(path: Path, text: str, minutes: float, seed: int = 0) -> str:
    """The doc with this (budget, seed)'s measured section replaced (appended when new);
    hand-written prose and the other sections kept."""
    doc = path.read_text(encoding="utf-8") if path.is_file() else ""
    mark = begin(minutes, seed)
    if mark not in doc:
        return f"{doc}\n{mark}\n{text}{END}\n"
    head, rest = doc.split(mark, 1)
    return f"{head}{mark}\n{text}{END}{rest.split(END, 1)[1]}"


def merged(path: Path, rows: list[dict]) -> list[dict]:
    """The JSON's rows with those of each (budget, seed, recipe) in ``rows`` replaced, so that
    a retrained recipe replaces its own rows and leaves the rest of its run standing."""
    old = json.loads(path.read_text(encoding="utf-8"))["rows"] if path.is_file() else []
    new = {_run(r) for r in rows}
    kept = [r for r in old if _run(r) not in new]
    order = {name: i for i, name in enumerate(RECIPES)}
    return sorted(kept + rows, key=lambda r: (*_run(r)[:2], order.get(r["recipe"], 99)))


def _seed(args: argparse.Namespace) -> str:
    return f" (training seed {args.seed})" if args.seed else ""


def _run(row: dict) -> tuple:
    """A row's (budget, seed, recipe); rows from before ``--seed`` were seed 0."""
    return row["budget_minutes"], row.get("seed", 0), row["recipe"]


def write(rows: list[dict], args: argparse.Namespace) -> str:
    """Merges ``rows`` into ``<out>.json`` and redraws this budget's section of ``<out>.md``."""
    out = Path(args.out)
    json_path, md_path = out.with_suffix(".json"), out.with_suffix(".md")
    every = merged(json_path, rows)
    budget = [r for r in every if _run(r)[:2] == (args.minutes, args.seed)]
    atomic_write_text(json_path, json.dumps({"rows": every}, indent=2) + "\n")
    text = table(budget, args)
    if len(args.temperatures) > 1:
        text += frontier(budget, args)
    if args.plot:
        plot(budget, args, args.plot)
    atomic_write_text(md_path, with_table(md_path, text, args.minutes, args.seed))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", action="store_true", help="run the multirun, then stop")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (--train)")
    parser.add_argument("--seed", type=int, default=0, help="the training seed: a replicate")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--runs", default="outputs/continuous/runs")
    parser.add_argument("--out", default="docs/results/continuous")
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--likelihood-sequences", type=int, default=32)
    parser.add_argument("--likelihood-draws", type=int, default=2)
    parser.add_argument("--steps", default="64", help="step counts, each at temperature 1")
    parser.add_argument("--temperatures", default="1", help="the frontier's temperatures")
    parser.add_argument("--frontier-steps", type=int, default=64)
    parser.add_argument("--samplers", default="", help="conf/sampler names to keep (all)")
    parser.add_argument("--plot", type=Path, help="draw the frontier here (a .png)")
    args = parser.parse_args()
    args.steps = [int(s) for s in args.steps.split(",")]
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    args.samplers = [s for s in args.samplers.split(",") if s]
    runs = Path(args.runs)
    if args.train:
        train(args.recipes, args.minutes, args.jobs, runs.resolve(), args.seed)
        return
    scorer = load_scorer()
    rows = []
    for recipe in args.recipes.split(","):  # written after each recipe: a crash keeps the rest
        rows += evaluate(recipe, runs / recipe / "model.safetensors", args, scorer)
        text = write(rows, args)
    print(text)


if __name__ == "__main__":
    main()
