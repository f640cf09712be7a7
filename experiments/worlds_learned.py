"""Learned models in exact worlds (issue 39): docs/results/worlds_learned.{md,json,png} from the
study's sweep folders (conf/experiment/worlds_learned*.yaml; the commands below).

    cdlm-train -m experiment=worlds_learned hydra/launcher=joblib hydra.launcher.n_jobs=2
    cdlm-train -m experiment=worlds_learned name=worlds_learned_levers data.world=world:chars \
      recipe=gaussian_self_cond,candi,gaussian_embed16,gaussian_importance,masked_no_ar_phase
    cdlm-train -m experiment=worlds_learned name=worlds_learned_checks data.world=world:chars \
      recipe=gaussian,gaussian_self_cond seed=1
    cdlm-train -m experiment=worlds_learned_distil process=masked module=distill_sdtt \
      teacher=multirun/worlds_learned/4/model.safetensors \
      hydra.sweep.dir=multirun/worlds_learned_distil/masked
    cdlm-train -m experiment=worlds_learned_distil process=gaussian module=distill_progressive \
      teacher=multirun/worlds_learned/6/model.safetensors \
      hydra.sweep.dir=multirun/worlds_learned_distil/gaussian
    cdlm-train -m experiment=worlds_learned_austen hydra/launcher=joblib hydra.launcher.n_jobs=2
    OUT=out bash scripts/gpu_crossover.sh        # the data-constrained runs, on a lent GPU
    python experiments/worlds_learned.py multirun/worlds_learned multirun/worlds_learned_levers \
      multirun/worlds_learned_checks multirun/worlds_learned_distil/masked \
      multirun/worlds_learned_distil/gaussian --austen multirun/worlds_learned_austen \
      --crossover out/curves

AR, masked, block (an AR phase, then block size 4, in the same clock) and gaussian are trained
on the character chain and the agreement world; the gaussian levers and masked without its AR
phase on the character world at the same clock; SDTT of the masked model and progressive
distillation of the gaussian one (students at 16, 8 and 4 steps); AR and masked on a fixed
finite sample for many epochs (the data-constrained runs); the Austen quickstart of each recipe
beside its lever. Evaluation scores everything exactly (worlds_learned_eval.py), each learned
row beside the world's own oracle of the same process under the same sampler, steps, samples and
seed; each model once, in a child process of its own, its rows cached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import study

# recipe (conf/recipe/) -> the model's label in the doc's tables
LABELS = {
    "autoregressive": "autoregressive",
    "block": "block",
    "masked": "masked",
    "gaussian": "gaussian",
    "gaussian_self_cond": "gaussian+self_cond",
    "candi": "gaussian+candi",
    "gaussian_embed16": "gaussian+embed16",
    "gaussian_importance": "gaussian+importance",
    "masked_no_ar_phase": "masked+no_ar_phase",
}
# checks of the character world's rows (a second seed, masked without its AR phase): their
# architectures are timed already, so they get no speed rows
CHECKS = {"gaussian@seed1", "gaussian+self_cond@seed1", "masked+no_ar_phase"}
# the Austen before/after pairs the report sets side by side: a recipe, then its lever
AUSTEN_PAIRS = [
    ("gaussian", "gaussian+self_cond"),
    ("masked", "masked+no_ar_phase"),
    ("masked@30min", "masked+no_ar_phase@30min"),
]
# each Austen run's bound: this many draws on up to this many val sequences, the same seeds for
# every run (a pair's difference is then read without most of the estimator's noise)
AUSTEN_DRAWS, AUSTEN_SEQUENCES = 8, 256


def label_of(row: dict) -> str:
    """A job's label: its recipe's, ``@seed<n>`` for another seed, ``@30min`` for 30 minutes."""
    o = row["overrides"]
    label = LABELS[o["recipe"]]
    if int(o.get("seed", 0)):
        label += f"@seed{o['seed']}"
    if o.get("trainer.max_time") == "00:00:30:00":
        label += "@30min"
    return label


def austen_bound(folder: Path) -> dict:
    """One Austen run's bound at ``AUSTEN_DRAWS`` draws (``val_bits_per_token``'s, seed 0),
    cached."""
    path = folder / "bound.json"
    if not path.is_file():
        from cdlm.evaluation.bound import val_bits_per_token
        from cdlm.likelihood.evaluate import validation_tokens
        from cdlm.model_file import load_model

        model = load_model(folder / "model.safetensors")
        val = validation_tokens(model)[:AUSTEN_SEQUENCES]
        bound = val_bits_per_token(model, val, 0, draws=AUSTEN_DRAWS)
        path.write_text(json.dumps(bound, indent=1) + "\n")
    return json.loads(path.read_text())


def austen_runs(found: dict, args: argparse.Namespace) -> tuple[list[dict], dict]:
    """(the Austen rows, each scored as docs/results/duo.md scores a model, and the bounds by
    label) of the Austen sweeps."""
    specs, bounds, steps = [], {}, {}
    for row in study.rows(found):
        label = label_of(row)
        specs.append({"name": f"austen-{label}", "ckpt": str(Path(row["folder"]) / "model.safetensors"),
                      "row": {"corpus": "austen", "recipe": label, "role": "trained",
                              "parallel_runs": (row["cost"] or {}).get("parallel_jobs")},
                      "austen": True})  # fmt: skip
        bounds[label] = austen_bound(Path(row["folder"]))
        steps[label] = row["steps"]
    rows = study.evaluate_children(Path(__file__), specs, args.evaluated, args.jobs, [])
    minutes = {label: 30.0 if label.endswith("@30min") else 10.0 for label in steps}
    return [
        r | {"train_steps": steps[r["recipe"]], "minutes": minutes[r["recipe"]]} for r in rows
    ], bounds


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweeps", type=Path, nargs="*", help="the world sweeps and distillation jobs")
    p.add_argument("--austen", type=Path, nargs="*", default=[], help="the Austen sweeps")
    p.add_argument("--crossover", type=Path, nargs="*", default=[],
                   help="folders of data-constrained jobs (scripts/gpu_crossover.sh's curves)")  # fmt: skip
    p.add_argument("--evaluated", type=Path, default=Path("multirun/worlds_learned_evaluated"))
    p.add_argument("--results", type=Path, default=study.RESULTS, help="where the doc goes")
    p.add_argument("--jobs", type=int, default=2, help="models evaluated at a time")
    p.add_argument("--samples", type=int, default=64, help="samples per sampler row")
    p.add_argument("--likelihood-sequences", type=int, default=64)
    p.add_argument("--evaluate-one", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> None:
    args = parse()
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # one thread a run unless told otherwise
        os.environ.setdefault(key, "1")
    if args.evaluate_one:  # a child of study.evaluate_children
        spec = json.loads(args.evaluate_one)
        if spec.get("austen"):
            rows = study.sample_rows(spec, 16, 64)
        else:
            from worlds_learned_eval import evaluate_model

            rows = evaluate_model(spec, args)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
        return
    from worlds_learned_report import report

    found = study.table(*args.sweeps)
    austen = austen_runs(study.table(*args.austen), args) if args.austen else ([], {})
    report(args, found, austen, CHECKS, AUSTEN_PAIRS)


if __name__ == "__main__":
    sys.exit(main())
