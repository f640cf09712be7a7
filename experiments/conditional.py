"""Issue 41's measurement: prompt→response training, docs/results/conditional.md and .json from one run.

    python experiments/conditional.py --runs /work/runs/conditional --out docs/results/conditional
    python experiments/conditional.py --quick --runs /tmp/cond --out /tmp/cond/doc   # smoke

Rows:
1. Plan puzzles (Sudoku, Countdown from ``scripts/plan_data.py``, one shuffled set): AR and
   masked, each trained on whole lines (one puzzle line per sequence, docs/results/historical/tasks.md's plan set)
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
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from budget import last_step
from duo import commit, fmt, run_once, with_prose

EXPERIMENTS = Path(__file__).resolve().parent
# row -> (process, data format); plan rows share one shuffled puzzle set in two files
PLAN_ROWS = {
    "ar, whole line": ("autoregressive", "text"),
    "ar, prompt→answer": ("autoregressive", "pairs"),
    "masked, whole line": ("masked", "text"),
    "masked, prompt→answer": ("masked", "pairs"),
}
DROPOUTS = (0.0, 0.1)  # docs/guide/conditioning.md's label dropout default, for the prompt
SCALES = (0.0, 1.0, 2.0, 4.0)
RESPONSE_WORDS = 48  # Austen responses up to this many words: one fits a 128-token row
CONTINUATION = 64  # tokens of the blank after each held-out prompt
PROMPT_TOKENS = 128 - CONTINUATION
VAL_SHARE = 0.02  # data.val_fraction's default: the held-out end of each novel
# a small model for every row: on 2 CPU cores shared with other work the quickstart network
# (7.7M parameters) reached ~3 optimizer steps a minute on Austen pairs, too few for the budget
SMALL = ["network.d_model=128", "network.n_layers=2", "network.n_heads=4"]
AUSTEN_VOCAB = 2048  # the Austen BPE: its readout is most of a small model's step
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
    for out, kind in (("plan.txt", "text"), ("plan.jsonl", "pairs")):
        if not (folder / out).is_file():
            script = str(EXPERIMENTS / "plan_data.py")
            cmd = [sys.executable, script, str(folder / out), "--format", kind, *count]
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
    else:
        common += SMALL
    for name, (process, kind) in PLAN_ROWS.items():
        path = data / ("plan.jsonl" if kind == "pairs" else "plan.txt")
        extra = ["data.format=pairs"] if kind == "pairs" else ["data.packing=false"]
        out.append({"set": "plan", "name": name, "steps": args.plan_steps,
                    "overrides": [f"process={process}", f"data.path={path}",
                                  "data.vocab_size=512", *extra]})  # fmt: skip
    for p in DROPOUTS:
        out.append({"set": "austen", "name": f"masked, prompt dropout {p:g}",
                    "steps": args.austen_steps,
                    "overrides": ["process=masked", "data.format=pairs",
                                  f"data.path={data / 'austen_pairs.jsonl'}",
                                  f"condition.prompt_dropout={p}",
                                  f"data.vocab_size={AUSTEN_VOCAB}"]})  # fmt: skip
    for job in out:
        job["dir"] = str(args.runs / job["set"] / slug(job["name"]))
        job["overrides"] = [*common, *job["overrides"], f"trainer.max_steps={job['steps']}",
                            f"trainer.val_check_interval={max(1, job['steps'] // 4)}",
                            f"hydra.run.dir={job['dir']}"]  # fmt: skip
    return out


def train_one(job: dict) -> dict:
    return run_once(job["overrides"], Path(job["dir"]))


def mean_se(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error (0 for fewer than two values)."""
    if not values:
        return math.nan, math.nan
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return statistics.fmean(values), se


def held_puzzles(path: Path, per_game: int, seed: int) -> list:
    """``per_game`` puzzles of each game drawn by ``seed`` from the validation split that the
    text and the pairs file share: their last ``VAL_SHARE`` of puzzles (data.val_fraction)."""
    from cdlm.tasks import games

    lines = [line.strip() for line in path.read_text().split("\n\n") if line.strip()]
    held = [games.parse(line) for line in lines[len(lines) - round(len(lines) * VAL_SHARE) :]]
    rng = random.Random(seed)
    return [
        p for game in games.GAMES for p in rng.sample([p for p in held if p.game == game], per_game)
    ]


def plan_rows(model, args: argparse.Namespace) -> list[dict]:
    """task=plan's checker on the held-out puzzles, decoded as experiments/tasks.py decodes
    them; solve rate and cells correct with their standard errors over puzzles."""
    from tasks import GREEDY, PLAN_STEPS

    from cdlm.generation import named_sampler
    from cdlm.tasks import games

    puzzles = held_puzzles(args.runs / "data" / "plan.txt", args.puzzles, args.seed)
    kind = model.process.kind
    name, options, _ = GREEDY[kind]
    steps = 1 if kind == "autoregressive" else PLAN_STEPS
    rows = games.run(model, named_sampler(name, **options), puzzles, steps=steps, seed=args.seed)
    for row in rows:
        mine = [p for p in puzzles if p.game == row["game"]]
        wins = [float(games.solved(p, a)) for p, a in zip(mine, row["answers"], strict=True)]
        cells = [games.cells_correct(p, a) for p, a in zip(mine, row["answers"], strict=True)]
        row["solved"], row["solve_se"] = int(sum(wins)), mean_se(wins)[1]
        row["cells_correct"], row["cells_se"] = mean_se(cells)
        row["sampler"], row["steps"] = name, steps
        row["example"] = {"prompt": mine[0].prompt, "answer": row["answers"][0]}
        del row["spread"], row["answers"]
    return rows


def nll_after(scorer, prompts: list[str], texts: list[str], batch: int = 8) -> list[float | None]:
    """The scorer's mean NLL (nats) per token of each text read right after its prompt; None
    for an empty text."""
    import torch

    from cdlm.evaluation.quality import padded

    tok, device = scorer.tokenizer, next(scorer.model.parameters()).device
    seqs, spans = [], []
    for prompt, text in zip(prompts, texts, strict=True):
        a = tok(prompt, add_special_tokens=False)["input_ids"]
        b = tok(text, add_special_tokens=False)["input_ids"]
        seqs.append(a + b)
        spans.append((len(a), len(b)))
    out: list[float | None] = []
    with torch.no_grad():
        for start in range(0, len(seqs), batch):
            ids, valid = padded(seqs[start : start + batch], device)
            logits = scorer.model(input_ids=ids, attention_mask=valid.long()).logits
            logp = logits[:, :-1].double().log_softmax(-1)
            nll = -logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
            for row, (a, b) in enumerate(spans[start : start + batch]):
                out.append(float(nll[row, a - 1 : a - 1 + b].mean()) if b else None)
    return out


def continuation_scores(prompts, texts, ids, reference, scorer, args) -> dict:
    """gen-PPL and entropy, MAUVE against the true next paragraphs over k-means seeds, and
    the prompt dependence: NLL after a shuffled prompt (the next row's) minus after its own.
    ``reference``: the scorer's MAUVE features of the true next paragraphs."""
    from cdlm.evaluation.harness import text_quality
    from cdlm.evaluation.mauve import features, mauve_score

    q = text_quality(ids, texts, scorer)
    own = nll_after(scorer, prompts, texts)
    other = nll_after(scorer, prompts[1:] + prompts[:1], texts)
    diffs = [s - o for o, s in zip(own, other, strict=True) if o is not None]
    dependence, se = mean_se(diffs)
    mine = features(texts, scorer)
    mauves = [mauve_score(mine, reference, seed=k).value for k in range(args.mauve_seeds)]
    return {
        "gen_ppl": q.get("gen_ppl"),
        "entropy": q["token_entropy_bits"],
        "dependence": dependence,
        "dependence_se": se,
        "nll_own": mean_se([o for o in own if o is not None])[0],
        "scored": len(diffs),
        "empty": sum(not t.strip() for t in texts),
        "mean_tokens": statistics.fmean(len(i) for i in ids),
        "mauve": statistics.fmean(mauves),
        "mauve_min": min(mauves),
        "mauve_max": max(mauves),
    }


def austen_rows(model, job: dict, args: argparse.Namespace, scorer) -> list[dict]:
    """One continuation per held-out prompt at every guidance scale (guidance on the prompt,
    the default sampler, seed ``args.seed + i`` for prompt i at every scale), and the true next
    paragraphs scored alike as the reference."""
    from cdlm.evaluation.mauve import features
    from cdlm.generation import Plan, generate, named_sampler
    from cdlm.generation.inputs import fill_id
    from cdlm.guidance import Guidance
    from cdlm.tasks.passages import word_ids
    from cdlm.tasks.runs import canvas

    lines = (args.runs / "data" / "austen_held.jsonl").read_text().splitlines()
    held = [json.loads(line) for line in lines]
    picked = random.Random(args.seed).sample(held, min(args.prompts, len(held)))
    tok, fill, eos = model.tokenizer, fill_id(model.tokenizer), model.tokenizer.eos_token_id
    heads = [word_ids(tok, r["prompt"])[-PROMPT_TOKENS:] for r in picked]
    prompts = [tok.decode(h) for h in heads]  # the prompt as the model saw it, cut from the left
    truths = [r["response"] for r in picked]
    truth_ids = [word_ids(tok, t) for t in truths]
    sampler = named_sampler(model.process.default_sampler)
    reference = features(truths, scorer)
    rows = [{"scale": None, "sampler": "real next paragraph", "nfe": None}
            | continuation_scores(prompts, truths, truth_ids, reference, scorer, args)]  # fmt: skip
    for scale in SCALES:
        outs, nfe = [], []
        for i, head in enumerate(heads):
            editable = [False] * len(head) + [True] * CONTINUATION
            layout = canvas(head + [fill] * CONTINUATION, editable, fill)
            guidance = Guidance(scale=scale, on="prompt")
            plan = Plan(1, len(editable), CONTINUATION, args.seed + i, layout=layout,
                        guidance=guidance, cut_at_eos=False)  # fmt: skip
            gen = generate(model, sampler, plan)
            out = gen.samples[0].token_ids[len(head) :]
            outs.append(out[: out.index(eos)] if eos in out else out)
            nfe.append(gen.nfe)
        texts = [tok.decode(o) for o in outs]
        row = {"scale": scale, "sampler": model.process.default_sampler, "nfe": max(nfe)}
        row |= continuation_scores(prompts, texts, outs, reference, scorer, args)
        row["example"] = {"prompt": prompts[0][-200:], "continuation": texts[0]}
        rows.append(row)
        print(f"{job['name']} @ scale {scale:g}: {row}", flush=True)
    return rows


def evaluate_model(job: dict, args: argparse.Namespace) -> list[dict]:
    import torch

    from cdlm.model_file import load_model

    torch.set_num_threads(1)
    model = load_model(str(Path(job["dir"]) / "model.safetensors"))
    if job["set"] == "plan":
        rows = plan_rows(model, args)
    else:
        from cdlm.evaluation.quality import load_scorer

        rows = austen_rows(model, job, args, load_scorer(None))
    return [{"set": job["set"], "model": job["name"]} | r for r in rows]


def evaluate_all(todo: list[dict], args: argparse.Namespace) -> list[dict]:
    """Each model in its own child process (``--evaluate-one``), ``--jobs`` at a time; a model
    evaluated before is read back."""
    folder = args.runs / "evaluated"
    folder.mkdir(parents=True, exist_ok=True)

    def one(job: dict) -> list[dict]:
        path = folder / f"{job['set']}-{slug(job['name'])}.json"
        if not path.is_file():
            cmd = [
                sys.executable,
                __file__,
                "--evaluate-one",
                json.dumps(job | {"result": str(path)}),
            ]
            cmd += ["--runs", str(args.runs), "--puzzles", str(args.puzzles)]
            cmd += ["--prompts", str(args.prompts), "--seed", str(args.seed)]
            cmd += ["--mauve-seeds", str(args.mauve_seeds)]
            subprocess.run(cmd, check=True)
        return json.loads(path.read_text())

    with ThreadPoolExecutor(args.jobs) as pool:
        return [r for rows in pool.map(one, todo) for r in rows]


def solved(rows: list[dict], model: str) -> tuple[int, int]:
    """(puzzles solved, puzzles) by one plan row, both games."""
    mine = [r for r in rows if r["model"] == model]
    return sum(r["solved"] for r in mine), sum(r["cases"] for r in mine)


def goals(plan: list[dict], austen: list[dict]) -> list[str]:
    out = []
    for process in ("ar", "masked"):
        (a, n), (b, _) = (
            solved(plan, f"{process}, prompt→answer"),
            solved(plan, f"{process}, whole line"),
        )
        out.append(
            f"{process}: prompt→answer solved {a}/{n} held-out puzzles, whole line {b}/{n}: goal "
            f"(prompt→answer solves more) {'met' if a > b else 'missed'}."
        )
    for fmt_name in ("prompt→answer", "whole line"):
        (a, n), (b, _) = solved(plan, f"masked, {fmt_name}"), solved(plan, f"ar, {fmt_name}")
        out.append(
            f"{fmt_name}: masked solved {a}/{n}, AR {b}/{n}: goal (masked beats AR) "
            f"{'met' if a > b else 'missed'}."
        )
    for p in DROPOUTS:
        by = {r["scale"]: r for r in austen if r["model"] == f"masked, prompt dropout {p:g}"}
        if not all(s in by for s in (0.0, 1.0, 2.0)):
            continue
        deps = [by[s]["dependence"] for s in (0.0, 1.0, 2.0)]
        said = ", ".join(
            f"{d:.3f} ± {by[s]['dependence_se']:.3f}" for s, d in zip((0, 1, 2), deps, strict=True)
        )
        rising = deps[0] < deps[1] < deps[2]
        goal = (
            f"goal (rises monotonically 0 → 2) {'met' if rising else 'missed'}"
            if p > 0
            else (
                f"{'rises' if rising else 'does not rise'} monotonically (no goal without dropout)"
            )
        )
        out.append(
            f"Prompt dependence, dropout {p:g}, at scales 0, 1, 2: {said} nats/token: {goal}."
        )
    return out


def markdown(report: dict) -> str:
    lines = [f"<!-- measured: {report['command']} -->", ""]
    commits = ", ".join(f"{phase} `{c[:7]}`" for phase, c in report["commits"].items())
    lines.append(
        f"Commits: {commits}. Plan rows {report['plan_steps']} optimizer steps each, "
        f"Austen rows {report['austen_steps']}; {report['jobs']} runs at a time, one CPU thread "
        f"each, on 2 cores shared with other work. Held-out: {report['puzzles']} puzzles per "
        f"game, {report['prompts']} Austen prompts, seed {report['seed']}."
    )
    # wall clock only: launch's CPU time counts every child that ended while a run lasted, and
    # with --jobs runs side by side those are the other runs' too
    lines += ["", "### Training", "", "| set | row | steps | wall (min) |", "|---|---|---|---|"]
    for t in report["training"]:
        lines.append(f"| {t['set']} | {t['name']} | {t['steps']} | {t['wall_seconds'] / 60:.1f} |")
    lines += ["", "### Plan: held-out puzzles (task=plan's checker)", "",
              "| row | game | sampler | steps | puzzles | solved | solve rate ± SE "
              "| cells correct ± SE |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in report["plan"]:
        lines.append(
            f"| {r['model']} | {r['game']} | {r['sampler']} | {r['steps']} | {r['cases']} "
            f"| {r['solved']} | {r['solve_rate']:.3f} ± {r['solve_se']:.3f} "
            f"| {r['cells_correct']:.3f} ± {r['cells_se']:.3f} |"
        )
    lines += ["", "### Austen: prompt guidance (guidance.on=prompt)", "",
              "| row | scale | NFE | gen-PPL | entropy (bits) | tokens | empty | MAUVE (min–max) "
              "| dependence ± SE (nats/token) |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in report["austen"]:
        scale = "real text" if r["scale"] is None else f"{r['scale']:g}"
        lines.append(
            f"| {r['model']} | {scale} | {fmt(r['nfe'], 0)} | {fmt(r['gen_ppl'], 0)} "
            f"| {r['entropy']:.2f} | {r['mean_tokens']:.1f} | {r['empty']} "
            f"| {r['mauve']:.3f} ({r['mauve_min']:.3f}–{r['mauve_max']:.3f}) "
            f"| {r['dependence']:.3f} ± {r['dependence_se']:.3f} |"
        )
    lines += ["", "### Goals", "", *[f"- {g}" for g in report["goals"]]]
    return "\n".join(lines) + "\n" + END + "\n"


def write_report(rows: list[dict], todo: list[dict], state: dict, args) -> None:
    from cdlm.io import atomic_write_text

    training = []
    for job in todo:
        record = json.loads((Path(job["dir"]) / "duo_run.json").read_text())
        training.append({"set": job["set"], "name": job["name"], "steps": last_step(Path(job["dir"])),
                         "wall_seconds": record["wall_seconds"], "cpu_seconds": record["cpu_seconds"],
                         "overrides": job["overrides"]})  # fmt: skip
    plan = [r for r in rows if r["set"] == "plan"]
    austen = [r for r in rows if r["set"] == "austen"]
    report = {
        "command": "experiments/conditional.py " + " ".join(sys.argv[1:]),
        "commits": state["commits"],
        "plan_steps": args.plan_steps,
        "austen_steps": args.austen_steps,
        "jobs": args.jobs,
        "puzzles": args.puzzles,
        "prompts": args.prompts,
        "seed": args.seed,
        "mauve_seeds": args.mauve_seeds,
        "training": training,
        "plan": plan,
        "austen": austen,
        "goals": goals(plan, austen),
    }
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(report, indent=1) + "\n")
    md = args.out.with_suffix(".md")
    atomic_write_text(md, with_prose(md, markdown(report), "experiments/conditional.py"))
    print(markdown(report))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=Path, default=Path("outputs/conditional"))
    p.add_argument("--out", type=Path, default=Path("docs/results/conditional"))
    p.add_argument("--plan-steps", type=int, default=300)
    p.add_argument("--austen-steps", type=int, default=200)
    p.add_argument("--jobs", type=int, default=3, help="runs at a time, one CPU thread each")
    p.add_argument("--puzzles", type=int, default=64, help="held-out puzzles per game")
    p.add_argument("--prompts", type=int, default=32, help="held-out Austen prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mauve-seeds", type=int, default=5, help="k-means seeds of each MAUVE")
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
