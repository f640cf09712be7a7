"""The Python half of scripts/gpu_learning.sh (issue 49 item 8): each finished job's val bound
at the same draws, and on Austen each lever's paired gain over its process's default.

    python scripts/gpu_learning.py bounds RUNS --out learning_gpu.json [--draws 8]

RUNS holds the script's sweep folders (``austen/``: experiment=learning_austen; ``start/``: a
masked model without shift, then uniform started from it, the two sharing the sweep's budget;
``crossover/``: experiment=learning_crossover). Every finished job with a model file gets
``bound.json``: its bound in groups of val sequences at ``draws`` draws keyed on (seed, draw,
group) alone (``cdlm.evaluation.excess.group_bits``), so two models of one process read the
same levels and noise and their difference is paired (``paired_bound``). An Austen lever row
(recipe ``<process>_<lever>``, or ``uniform_from_masked``) is paired with its process's default
row (recipe ``<process>``): ``paired_gain_bits`` is the default's bound minus the lever's
(positive: the lever is better), with its standard error over groups. Writes the rows to
``--out`` and a table to stdout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from cdlm.evaluation.excess import GroupBits, group_bits, paired_bound
from cdlm.likelihood.evaluate import validation_tokens
from cdlm.model_file import load_model
from cdlm.run.table import jobs

PROCESSES = ("masked", "gaussian", "uniform")
SWEEPS = ("austen", "start", "crossover")
_VAL: dict[tuple, torch.Tensor] = {}  # (corpus, vocabulary) -> its val split: tokenised once


def val_split(model, path: str | None) -> torch.Tensor:
    """The val sequences of the corpus at ``path`` under the model's tokenizer; every job of
    the script shares one tokenizer, so Austen is tokenised once, not once a job."""
    key = (path, model.config["seq_len"], frozenset(model.tokenizer.get_vocab().items()))
    if key not in _VAL:
        _VAL[key] = validation_tokens(model, path)
    return _VAL[key]


def job_bits(folder: Path, overrides: dict, draws: int, sequences: int, group: int) -> GroupBits:
    """One job's bound in groups of val sequences, cached in its ``bound.json``."""
    path = folder / "bound.json"
    if not path.is_file():
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = load_model(folder / "model.safetensors", device)
        val = val_split(model, overrides.get("data.path"))[:sequences]
        found = group_bits(model, val, seed=0, draws=draws, group_size=group)
        record = found.to_json() | {"draws": draws, "group_size": group}
        path.write_text(json.dumps(record) + "\n")
    return GroupBits.from_json(json.loads(path.read_text()))


def label_of(o: dict) -> str:
    """A job's recipe, ``_unshifted`` for masked with ``process.shift=false`` (the start of
    ``start/``), ``_from_masked`` for a run started from it (``init_from``)."""
    recipe = o.get("recipe", o.get("process", "?"))
    if o.get("process.shift") == "false":
        recipe += "_unshifted"
    return recipe + "_from_masked" if o.get("init_from") else recipe


def bounds(root: Path, draws: int, sequences: int, group: int) -> list[dict]:
    """A row per finished job (its bound ± SE, steps, FLOPs); each Austen lever, and the
    uniform run started from a masked one (``start/``), with its paired gain over the default of
    its process."""
    rows, found = [], {}
    for sweep in SWEEPS:
        if not (root / sweep).is_dir():
            continue
        for job in jobs(root / sweep):
            folder = root / sweep / job["job"]
            if job["status"] != "finished" or not (folder / "model.safetensors").is_file():
                print(f"{sweep}/{job['job']}: unfinished, no bound")
                continue
            o = job["overrides"]
            bits = job_bits(folder, o, draws, sequences, group)
            bound, se = bits.bound()
            recipe = label_of(o)
            row = {"sweep": sweep, "job": job["job"], "recipe": recipe, "bound_bits": bound,
                   "bound_se": se, "draws": bits.bits.shape[0], "groups": bits.bits.shape[1],
                   "sequences": bits.sequences, "steps": job["steps"],
                   "flops": job["metrics"].get("train/flops"),
                   "train_size": o.get("data.train_size")}  # fmt: skip
            rows.append(row)
            found[sweep, recipe] = bits
    for row in rows:
        process = row["recipe"].split("_")[0]
        lever = row["sweep"] == "austen" or row["recipe"].endswith("_from_masked")
        if not lever or process not in PROCESSES or row["recipe"] == process:
            continue
        if ("austen", process) in found:
            pair = paired_bound(found[row["sweep"], row["recipe"]], found["austen", process])
            row |= {"world": "austen", "process": process, "lever": row["recipe"],
                    "paired_gain_bits": -pair.excess_bits, "paired_gain_se": pair.excess_se}  # fmt: skip
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| sweep | recipe | train_size | steps | bound (bits/token) | paired gain vs default |"
    ]
    lines.append("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        gain = (
            f"{r['paired_gain_bits']:+.4f} ± {r['paired_gain_se']:.4f}"
            if "paired_gain_bits" in r
            else ""
        )
        lines.append(f"| {r['sweep']} | {r['recipe']} | {r['train_size'] or ''} | {r['steps']} | "
                     f"{r['bound_bits']:.4f} ± {r['bound_se']:.4f} | {gain} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("bounds", help="each job's bound; Austen levers paired")
    b.add_argument("runs", type=Path, help="the folder holding austen/ and crossover/")
    b.add_argument("--out", type=Path, required=True, help="the JSON rows to write")
    b.add_argument("--draws", type=int, default=8)
    b.add_argument("--sequences", type=int, default=256, help="val sequences at most")
    b.add_argument("--group", type=int, default=8, help="val sequences per group (one batch)")
    args = parser.parse_args()
    rows = bounds(args.runs, args.draws, args.sequences, args.group)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    text = table(rows)
    args.out.with_suffix(".md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
