"""AR, masked and gaussian under the same wall-clock training budget on this machine, one run.

    python experiments/budget.py --minutes 10 --out docs/results/historical/budget

Each recipe trains through the real CLI (``cdlm-train experiment=quickstart process=...``) with
``trainer.max_time`` set to the budget; a recipe with stages (e.g. AR pre-training, then masked
adaptation) splits the budget between them, so pre-training counts inside it. Then, per final
checkpoint:
  * the val bound in bits/token over the whole val split (AR exact NLL, masked ELBO, gaussian
    VDM ELBO), through ``cdlm.evaluation.harness``;
  * ``--num-samples`` whole canvases per sampler (EOS written as line breaks, equal length for
    every model), their gen-PPL under the external scorer (SmolLM2-135M) with token entropy and
    distinct-n beside it, and the same for real val text of the same length;
  * for diffusion models, accuracy/CE per noise level beside the no-context readout
    (``cdlm.evaluation.context``): the evidence that a model uses context.
Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import launch
import torch

from cdlm.evaluation.context import context_ceiling, context_use
from cdlm.evaluation.harness import evaluate_checkpoint
from cdlm.evaluation.oracle import bigram_transition
from cdlm.evaluation.quality import load_scorer
from cdlm.generation import named_sampler
from cdlm.io import atomic_write_text
from cdlm.likelihood.evaluate import corpus_split
from cdlm.model_file import load_model

# name -> stages: (share of the budget, cdlm-train overrides). A later stage starts from the
# previous stage's model (init_from).
RECIPES: dict[str, list[tuple[float, list[str]]]] = {
    "autoregressive": [(1.0, ["process=autoregressive"])],
    "masked": [(1.0, ["process=masked"])],
    "gaussian": [(1.0, ["process=gaussian"])],
}
# name -> [(label, sampler config, options, steps, gaussian x0 temperature, grid)]; the first is
# the recipe's headline (the process's default sampler, chosen before any result was seen).
SAMPLERS: dict[str, list[tuple[str, str, dict, int, float, str]]] = {
    "autoregressive": [
        ("ar, T=1", "ar", {"stop_at_eos": False}, 1, 1.0, "uniform"),
        ("ar, T=0.9", "ar", {"stop_at_eos": False, "temperature": 0.9}, 1, 1.0, "uniform"),
    ],
    "masked": [
        ("ancestral", "ancestral", {}, 128, 1.0, "uniform"),
        (
            "ancestral, left to right (blocks of 1)",
            "ancestral",
            {"block_length": 1},
            128,
            1.0,
            "uniform",
        ),
        ("confidence, T=0 (LLaDA default)", "confidence", {}, 128, 1.0, "uniform"),
    ],
    "gaussian": [
        ("ddpm", "ddpm", {}, 128, 1.0, "uniform"),
        ("dpmpp_2m (2nd-order ODE)", "dpmpp_2m", {}, 128, 1.0, "uniform"),
        ("rolling (left to right), T=1", "rolling", {}, 128, 1.0, "uniform"),
        ("rolling (left to right), T=0.9", "rolling", {"temperature": 0.9}, 128, 1.0, "uniform"),
    ],
}
# Levels of the context table (the exact bigram denoiser beside the model and the readout).
CONTEXT_TIMES = (0.1, 0.5, 0.7, 0.8, 0.9)


def duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"00:{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def train(name: str, out: Path, budget_s: float, extra: list[str]) -> dict:
    """Runs the recipe's stages; returns the final checkpoint and the stages' wall times."""
    init, stages = None, []
    for k, (share, overrides) in enumerate(RECIPES[name]):
        run_dir = out / "runs" / name / f"stage{k}"
        args = [
            "experiment=quickstart",
            *overrides,
            f"trainer.max_time={duration(share * budget_s)}",
            f"hydra.run.dir={run_dir}",
            "logger=csv",
            *extra,
            *([f"init_from={init}"] if init else []),
        ]
        wall = launch.train(args, wandb=False).wall_seconds
        init = run_dir / "model.safetensors"
        stages.append({"overrides": args, "wall_seconds": wall, "steps": last_step(run_dir)})
    return {"ckpt": str(init), "stages": stages}


def metrics(run_dir: Path) -> list[dict]:
    """The CSV logger's rows of a run's last attempt (a failed start leaves an earlier version)."""
    versions = sorted(run_dir.glob("csv/version_*"), key=lambda p: int(p.name.split("_")[1]))
    with open(versions[-1] / "metrics.csv") as f:
        return list(csv.DictReader(f))


def last_step(run_dir: Path) -> int:
    """The optimizer steps a run finished: its model card's count (written at the end of
    training), else its newest ``step-<n>.ckpt`` (a run cut short), else 0. Not the CSV log's
    largest step: the end-of-training rows sit one past the last step's."""
    card = run_dir / "config.json"
    if card.exists():
        return json.loads(card.read_text())["card"]["training"]["steps"]
    found = [int(p.stem.split("-")[1]) for p in run_dir.glob("checkpoints/step-*.ckpt")]
    return max(found, default=0)


def context_tables(ckpt: str) -> dict:
    """Diffusion models: context use per level beside the bigram oracle; gaussian: the ceiling."""
    model = load_model(ckpt)
    data = corpus_split(model)
    result: dict = {}
    if model.process.noise_levels:
        transition = bigram_transition(data.train_set.tokens, model.process.vocab_size)
        result["context"] = context_use(
            model, data.val_set.tokens, data.log_unigram(), CONTEXT_TIMES, transition=transition
        )
    if model.process.kind == "gaussian":
        result["ceiling"] = context_ceiling(model, data.val_set.tokens, data.log_unigram())
    return result


def evaluate(name: str, ckpt: str, args: argparse.Namespace, scorer) -> dict:
    result: dict = {"samplers": [], **context_tables(ckpt)}
    for i, (label, config, options, steps, temperature, grid) in enumerate(SAMPLERS[name]):
        report = evaluate_checkpoint(
            ckpt,
            named_sampler(config, **options),
            steps=steps,
            num_samples=args.num_samples,
            seed=0,
            repeats=1,
            grid=grid,
            scorer=scorer,
            device=torch.device("cpu"),
            likelihood_sequences=None if i == 0 else 1,
            likelihood_draws=args.likelihood_draws if i == 0 else 1,
            cut_at_eos=False,
            temperature=temperature,
        )
        if i == 0:
            result["likelihood"] = report["likelihood"]
            result["reference"] = report["quality"]["reference"]
        result["samplers"].append(
            {
                "label": label,
                "steps": steps,
                "quality": report["quality"]["samples"],
                "sampling_seconds": report["speed"]["steady"]["wall_seconds"]["median"],
                "examples": report["samples"][:3],
            }
        )
    return result


def markdown(report: dict) -> str:
    rows = report["recipes"]
    ar = rows.get("autoregressive")
    lines = [
        f"# Same wall-clock budget: {report['minutes']:g} minutes of training on "
        f"{report['threads']} CPU threads",
        "",
        "Generated by `experiments/budget.py` in one run; samples are whole "
        f"{report['seq_len']}-token canvases ({report['num_samples']} per row, EOS as line "
        "breaks), scored by SmolLM2-135M. Real text: val sequences cut to the same lengths.",
        "",
        "| recipe | steps | val bits/token | sampler | gen-PPL | entropy (bits) | distinct-2 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lk = r["likelihood"]
        steps = "+".join(str(s["steps"]) for s in r["stages"])
        for k, s in enumerate(r["samplers"]):
            q = s["quality"]
            error = f" ± {lk['std_error']:.3f}" if "std_error" in lk else ""
            head = (
                f"| {name} | {steps} | {lk['bits_per_token']:.3f}{error} ({lk['kind']}) "
                if k == 0
                else "| | | "
            )
            lines.append(
                f"{head}| {s['label']}, {s['steps']} steps | {q.get('gen_ppl', float('nan')):.0f} "
                f"| {q['token_entropy_bits']:.2f} | {q['distinct_2']:.3f} |"
            )
    ref = next(iter(rows.values()))["reference"]
    lines.append(
        f"| real val text | | | | {ref.get('gen_ppl', float('nan')):.0f} "
        f"| {ref['token_entropy_bits']:.2f} | {ref['distinct_2']:.3f} |"
    )
    if ar is not None:
        lines += [
            "",
            "## Against the AR baseline (its T=1 samples) and real text",
            "",
            "| recipe | bound / AR NLL | sampler | gen-PPL / AR | entropy / real |",
            "|---|---|---|---|---|",
        ]
        ar_bits = ar["likelihood"]["bits_per_token"]
        ar_ppl = ar["samplers"][0]["quality"].get("gen_ppl", float("nan"))
        for name, r in rows.items():
            for k, s in enumerate(r["samplers"]):
                q = s["quality"]
                bound = f"{r['likelihood']['bits_per_token'] / ar_bits:.3f}" if k == 0 else ""
                lines.append(
                    f"| {name if k == 0 else ''} | {bound} | {s['label']} "
                    f"| {q.get('gen_ppl', float('nan')) / ar_ppl:.2f} "
                    f"| {q['token_entropy_bits'] / ref['token_entropy_bits']:.3f} |"
                )
    for name, r in rows.items():
        if "context" not in r:
            continue
        lines += [
            "",
            f"## {name}: does it use context?",
            "",
            "Accuracy and CE (nats) per noise level over the val split: the model, the no-context "
            "readout, and the exact denoiser of a bigram LM of the training data (forward-backward, "
            "`cdlm.evaluation.oracle`): what bigram-level use of context reaches at that level.",
            "",
            "| t | accuracy | no-context | bigram oracle | gain | oracle gain | CE | no-context CE "
            "| oracle CE |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for c in r["context"]:
            lines.append(
                f"| {c['t']:g} | {c['acc']:.3f} | {c['base_acc']:.3f} | {c['oracle_acc']:.3f} "
                f"| {c['context_gain']:.2f} | {c['oracle_gain']:.2f} | {c['ce']:.3f} "
                f"| {c['base_ce']:.3f} | {c['oracle_ce']:.3f} |"
            )
        if "ceiling" in r:
            lines += [
                "",
                f"Context ceiling ({name}): target tokens (every 8th position, each offset in "
                "turn) at t = 0.9 while the rest sits at the context level "
                "(`cdlm.evaluation.context.context_ceiling`). With the context as noisy as the "
                "target this is the row above; with it clean, the most context gives this model "
                "at that noise level.",
                "",
                "| context t | target t | accuracy | no-context | gain | CE | no-context CE |",
                "|---|---|---|---|---|---|---|",
            ]
            for c in r["ceiling"]:
                lines.append(
                    f"| {c['context_t']:g} | {c['target_t']:g} | {c['acc']:.3f} "
                    f"| {c['base_acc']:.3f} | {c['context_gain']:.2f} | {c['ce']:.3f} "
                    f"| {c['base_ce']:.3f} |"
                )
    lines += ["", "## Sample excerpts", ""]
    for name, r in rows.items():
        for s in r["samplers"]:
            text = s["examples"][0].replace("\n", " / ")[:300]
            lines.append(f"- **{name}, {s['label']}**: {text}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--num-samples", type=int, default=32)
    parser.add_argument(
        "--likelihood-draws", type=int, default=8, help="noise draws averaged in each val bound"
    )
    parser.add_argument("--out", default="docs/results/historical/budget")
    parser.add_argument("--runs", default="outputs/budget")
    parser.add_argument("--skip-training", action="store_true", help="evaluate existing runs")
    parser.add_argument("--train-only", action="store_true", help="train, evaluate later")
    parser.add_argument("--train-override", action="append", default=[])
    parser.add_argument(
        "--update-context",
        action="store_true",
        help="recompute only the context tables of an existing <out>.json (no sampling)",
    )
    args = parser.parse_args()
    names = args.recipes.split(",")
    out = Path(args.out)
    if args.update_context:
        report = json.loads(out.with_suffix(".json").read_text())
        for name in names:
            report["recipes"][name] |= context_tables(report["recipes"][name]["ckpt"])
        atomic_write_text(out.with_suffix(".json"), json.dumps(report, indent=2) + "\n")
        atomic_write_text(out.with_suffix(".md"), markdown(report))
        return
    runs = Path(args.runs)
    trained = {}
    for name in names:
        if args.skip_training:
            last = runs / "runs" / name / f"stage{len(RECIPES[name]) - 1}"
            stages = [
                {"steps": last_step(runs / "runs" / name / f"stage{k}")}
                for k in range(len(RECIPES[name]))
            ]
            trained[name] = {"ckpt": str(last / "model.safetensors"), "stages": stages}
        else:
            trained[name] = train(name, runs, args.minutes * 60, args.train_override)
    if args.train_only:
        return
    scorer = load_scorer()
    report = {
        "minutes": args.minutes,
        "threads": torch.get_num_threads(),
        "num_samples": args.num_samples,
        "seq_len": load_model(trained[names[0]]["ckpt"]).config["seq_len"],
        "recipes": {},
    }
    for name in names:
        report["recipes"][name] = trained[name] | evaluate(
            name, trained[name]["ckpt"], args, scorer
        )
        print(f"{name}: evaluated", flush=True)
    atomic_write_text(out.with_suffix(".json"), json.dumps(report, indent=2) + "\n")
    atomic_write_text(out.with_suffix(".md"), markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
