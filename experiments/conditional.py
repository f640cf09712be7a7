"""Issue 41's measurement: prompt→response training, docs/conditional.md and .json from one run.

    python experiments/conditional.py --runs /work/runs/conditional --out docs/conditional
    python experiments/conditional.py --quick --runs /tmp/cond --out /tmp/cond/doc   # smoke

Rows:
1. Plan puzzles (Sudoku, Countdown from ``experiments/plan_data.py``, one shuffled set): AR and
   masked, each trained on whole lines (one puzzle line per sequence, docs/tasks.md's plan set)
   and on prompt→answer pairs (``data.format=pairs``: the puzzle as prompt, its solution as
   response), all at one optimizer-step budget. Scored on the same held-out puzzles (drawn by
   ``--seed`` from the validation split both formats share) by ``task=plan``'s checker: solve
   rate and cells correct; masked decodes greedily by confidence, AR at T = 0 (experiments/
   tasks.py's greedy samplers and steps).
2. Prompt guidance with and without prompt dropout: a masked model on Austen "previous paragraph
   → next paragraph" pairs (the novels' training split; held-out prompts from the validation
   split), trained at ``condition.prompt_dropout`` 0 and 0.1. At guidance scales 0, 1, 2, 4
   (``guidance.on=prompt``), one continuation per held-out prompt (the default sampler, seed 0):
   gen-PPL and entropy under SmolLM2-135M, MAUVE against the true next paragraphs, and the prompt
   dependence: the scorer's NLL per token of a continuation after a shuffled prompt (another
   row's) minus after its own, mean ± SE over prompts.

Phases (``--phases data,train,evaluate``) reuse what an earlier run finished (training runs by
their ``duo_run.json`` record, evaluated models by their JSON), so a run can be resumed; each
phase's commit is recorded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from budget import last_step
from duo import commit, run_once

EXPERIMENTS = Path(__file__).resolve().parent
# row -> (process, data format); plan rows share one shuffled puzzle set in two files
PLAN_ROWS = {
    "ar, whole line": ("autoregressive", "text"),
    "ar, prompt→answer": ("autoregressive", "pairs"),
    "masked, whole line": ("masked", "text"),
    "masked, prompt→answer": ("masked", "pairs"),
}
DROPOUTS = (0.0, 0.1)  # docs/conditioning.md's label dropout default, for the prompt
SCALES = (0.0, 1.0, 2.0, 4.0)
RESPONSE_WORDS = 48  # Austen responses up to this many words: one fits a 128-token row
CONTINUATION = 64  # tokens of the blank after each held-out prompt
PROMPT_TOKENS = 128 - CONTINUATION
VAL_SHARE = 0.02  # data.val_fraction's default: the held-out end of each novel
END = "<!-- end measured -->"


def slug(name: str) -> str:
    return name.replace(", ", "-").replace("→", "-").replace(" ", "_")


def austen_pairs(folder: Path, quick: bool) -> dict[str, Path]:
    """Consecutive paragraphs of each novel as (previous → next) pairs, the next at most
    ``RESPONSE_WORDS`` words: those in the first 98% of a novel's characters for training, those
    in its last 2% (the text datamodule's validation split) held out."""
    from cdlm.data.corpus import load_documents

    train, held = [], []
    for doc in load_documents(None):
        paragraphs = doc.text.split("\n")
        cut, seen = (1 - VAL_SHARE) * len(doc.text), 0
        for prev, nxt in zip(paragraphs, paragraphs[1:], strict=False):
            seen += len(prev) + 1
            if prev and nxt and len(nxt.split()) <= RESPONSE_WORDS:
                row = {"prompt": prev, "response": " " + nxt}
                (held if seen >= cut else train).append(row | {"novel": doc.label})
    random.Random(0).shuffle(train)
    if quick:
        train = train[:400]
    paths = {"train": folder / "austen_pairs.jsonl", "held": folder / "austen_held.jsonl"}
    for key, rows in (("train", train), ("held", held)):
        paths[key].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def make_data(folder: Path, quick: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    count = ["--count", "300"] if quick else []
    for out, fmt in (("plan.txt", "text"), ("plan.jsonl", "pairs")):
        if not (folder / out).is_file():
            script = str(EXPERIMENTS / "plan_data.py")
            cmd = [sys.executable, script, str(folder / out), "--format", fmt, *count]
            subprocess.run(cmd, check=True)
    if not (folder / "austen_held.jsonl").is_file():
        austen_pairs(folder, quick)


def jobs(args: argparse.Namespace) -> list[dict]:
    """Every training run: its row, run folder and ``cdlm-train`` overrides."""
    data, out = args.runs / "data", []
    common = ["experiment=quickstart", "lr_scheduler=warmup_cosine", "trainer.max_time=null"]
    common += ["logger=csv", "seed=0", "+trainer.enable_progress_bar=false"]
    if args.quick:
        common += ["network.d_model=32", "network.n_layers=1", "network.n_heads=2"]
        common += ["data.batch_size=4", "callbacks.model_folder.bound_sequences=0"]
    for name, (process, fmt) in PLAN_ROWS.items():
        path = data / ("plan.jsonl" if fmt == "pairs" else "plan.txt")
        extra = ["data.format=pairs"] if fmt == "pairs" else ["data.packing=false"]
        out.append({"set": "plan", "name": name, "steps": args.plan_steps,
                    "overrides": [f"process={process}", f"data.path={path}",
                                  "data.vocab_size=512", *extra]})  # fmt: skip
    for p in DROPOUTS:
        out.append({"set": "austen", "name": f"masked, prompt dropout {p:g}",
                    "steps": args.austen_steps,
                    "overrides": ["process=masked", "data.format=pairs",
                                  f"data.path={data / 'austen_pairs.jsonl'}",
                                  f"condition.prompt_dropout={p}"]})  # fmt: skip
    for job in out:
        job["dir"] = str(args.runs / job["set"] / slug(job["name"]))
        job["overrides"] = [*common, *job["overrides"], f"trainer.max_steps={job['steps']}",
                            f"trainer.val_check_interval={max(1, job['steps'] // 4)}",
                            f"hydra.run.dir={job['dir']}"]  # fmt: skip
    return out


def train_one(job: dict) -> dict:
    return run_once(job["overrides"], Path(job["dir"]))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=Path, default=Path("outputs/conditional"))
    p.add_argument("--out", type=Path, default=Path("docs/conditional"))
    p.add_argument("--plan-steps", type=int, default=400)
    p.add_argument("--austen-steps", type=int, default=300)
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one CPU thread each")
    p.add_argument("--puzzles", type=int, default=64, help="held-out puzzles per game")
    p.add_argument("--prompts", type=int, default=32, help="held-out Austen prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--phases", default="data,train,evaluate")
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny models, 3 steps")
    p.add_argument("--evaluate-one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.plan_steps = args.austen_steps = 3
        args.puzzles, args.prompts = 2, 4
    args.runs = args.runs.resolve()
    return args


def main() -> None:
    args = parse()
    os.environ |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    if args.evaluate_one:  # a child of evaluate_all
        job = json.loads(args.evaluate_one)
        rows = evaluate_model(job, args)
        Path(job["result"]).write_text(json.dumps(rows, indent=1) + "\n")
        return
    phases = args.phases.split(",")
    args.runs.mkdir(parents=True, exist_ok=True)
    state_path = args.runs / "state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {"commits": {}}
    if "data" in phases:
        state["commits"]["data"] = commit()
        make_data(args.runs / "data", args.quick)
    todo = jobs(args)
    if "train" in phases:
        state["commits"]["train"] = commit()
        state_path.write_text(json.dumps(state, indent=2) + "\n")
        todo_sorted = sorted(todo, key=lambda j: j["set"] != "austen")  # the slowest first
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(train_one, todo_sorted))
    state_path.write_text(json.dumps(state, indent=2) + "\n")
    if "evaluate" not in phases:
        return
    state["commits"]["evaluate"] = commit()
    state_path.write_text(json.dumps(state, indent=2) + "\n")
    write_report(evaluate_all(todo, args), todo, state, args)


if __name__ == "__main__":
    main()
