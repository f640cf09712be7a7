"""Issue 41's measurement: prompt→response training, docs/results/conditional.{md,json}.

    python experiments/conditional.py data multirun/conditional_data       # the puzzle files
    cdlm-train -m experiment=conditional_plan hydra/launcher=joblib hydra.launcher.n_jobs=2
    cdlm-train -m experiment=conditional_austen hydra/launcher=joblib hydra.launcher.n_jobs=2
    python experiments/conditional.py report multirun/conditional_plan multirun/conditional_austen

Rows (conf/experiment/conditional_*.yaml):
1. Plan puzzles (Sudoku, Countdown from ``scripts/plan_data.py``, one shuffled set): AR and
   masked, each trained on whole lines (one puzzle line per sequence) and on prompt→answer pairs
   (``data.format=pairs``: the puzzle as prompt, its solution as response), all at one
   optimizer-step budget. Scored on the same held-out puzzles (drawn by ``--seed`` from the
   validation split both formats share) by ``task=plan``'s checker: solve rate and cells
   correct; masked decodes greedily by confidence, AR at T = 0.
2. Prompt guidance with and without prompt dropout: a masked model on Austen "previous paragraph
   → next paragraph" pairs (the novels' training split; held-out prompts from the validation
   split), trained at ``condition.prompt_dropout`` 0 and 0.1. At guidance scales 0, 1, 2, 4
   (``guidance.on=prompt``), one continuation per held-out prompt (the default sampler, seed 0):
   gen-PPL and entropy under SmolLM2-135M, MAUVE against the true next paragraphs, and the prompt
   dependence: the scorer's NLL per token of a continuation after a shuffled prompt (another
   row's) minus after its own, mean ± SE over prompts.

Each model is evaluated once, in a child process of its own, its rows cached.
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
from pathlib import Path

import study

ROOT = Path(__file__).resolve().parents[1]
DROPOUTS = (0.0, 0.1)  # docs/guide/conditioning.md's label dropout default, for the prompt
SCALES = (0.0, 1.0, 2.0, 4.0)
RESPONSE_WORDS = 48  # Austen responses up to this many words: one fits a 128-token row
CONTINUATION = 64  # tokens of the blank after each held-out prompt
PROMPT_TOKENS = 128 - CONTINUATION
VAL_SHARE = 0.02  # data.val_fraction's default: the held-out end of each novel
# the greedy decoding of task=plan (as docs/results/historical/tasks.md decoded it)
GREEDY = {
    "autoregressive": ("ar", {"temperature": 0.0, "stop_at_eos": False}),
    "masked": ("confidence", {"stop_at_eos": False}),
}
PLAN_STEPS = 64  # a Sudoku answer is at most 40 tokens: one or more decided per step


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
    """The study's data: one shuffled puzzle set as whole lines (``plan.text``) and as
    prompt→answer pairs (``plan.pairs``), and the Austen paragraph pairs."""
    folder.mkdir(parents=True, exist_ok=True)
    count = ["--count", "300"] if quick else []
    for kind in ("text", "pairs"):
        if not (folder / f"plan.{kind}").is_file():
            script = str(ROOT / "scripts" / "plan_data.py")
            cmd = [sys.executable, script, str(folder / f"plan.{kind}"), "--format", kind, *count]
            subprocess.run(cmd, check=True)
    if not (folder / "austen_held.jsonl").is_file():
        austen_pairs(folder, quick)


def name_of(row: dict) -> tuple[str, str]:
    """(set, row name) of a training job, from its overrides."""
    o = row["overrides"]
    if o.get("experiment") == "conditional_austen":
        return "austen", f"masked, prompt dropout {float(o.get('condition.prompt_dropout', 0)):g}"
    process = {"autoregressive": "ar"}.get(o["process"], o["process"])
    return "plan", f"{process}, {'prompt→answer' if o['data.format'] == 'pairs' else 'whole line'}"


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
    from cdlm.generation import named_sampler
    from cdlm.tasks import games

    puzzles = held_puzzles(args.data / "plan.text", args.puzzles, args.seed)
    kind = model.process.kind
    name, options = GREEDY[kind]
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

    lines = (args.data / "austen_held.jsonl").read_text().splitlines()
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
        print(f"{job['label']} @ scale {scale:g}: {row}", flush=True)
    return rows


def evaluate_model(job: dict, args: argparse.Namespace) -> list[dict]:
    import torch

    from cdlm.model_file import load_model

    torch.set_num_threads(1)
    model = load_model(job["ckpt"])
    if job["set"] == "plan":
        rows = plan_rows(model, args)
    else:
        from cdlm.evaluation.quality import load_scorer

        rows = austen_rows(model, job, args, load_scorer(None))
    return [{"set": job["set"], "model": job["label"]} | r for r in rows]


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
    lines = [
        f"Held-out: {report['puzzles']} puzzles per game, {report['prompts']} Austen prompts, "
        f"seed {report['seed']}; each training job's steps and CPU time as `cdlm-table` reads them."
    ]
    lines += [
        "",
        "### Training",
        "",
        "| row | steps | CPU (min) | jobs at once |",
        "|---|---|---|---|",
    ]
    for t in report["training"]:
        cost = t["cost"] or {}
        cpu = study.fmt((cost.get("cpu_seconds") or math.nan) / 60, 1)
        lines.append(f"| {t['name']} | {t['steps']} | {cpu} | {cost.get('parallel_jobs')} |")
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
            f"| {r['model']} | {scale} | {study.fmt(r['nfe'], 0)} | {study.fmt(r['gen_ppl'], 0)} "
            f"| {r['entropy']:.2f} | {r['mean_tokens']:.1f} | {r['empty']} "
            f"| {r['mauve']:.3f} ({r['mauve_min']:.3f}–{r['mauve_max']:.3f}) "
            f"| {r['dependence']:.3f} ± {r['dependence_se']:.3f} |"
        )
    lines += ["", "### Goals", "", *[f"- {g}" for g in report["goals"]]]
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("phase", choices=("data", "report"), nargs="?", default="report")
    p.add_argument("folders", type=Path, nargs="*", help="data: its folder; report: the sweeps")
    p.add_argument("--data", type=Path, default=Path("multirun/conditional_data"))
    p.add_argument("--evaluated", type=Path, default=Path("multirun/conditional_evaluated"))
    p.add_argument("--results", type=Path, default=study.RESULTS, help="where the doc goes")
    p.add_argument("--jobs", type=int, default=2, help="models evaluated at a time")
    p.add_argument("--puzzles", type=int, default=64, help="held-out puzzles per game")
    p.add_argument("--prompts", type=int, default=32, help="held-out Austen prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mauve-seeds", type=int, default=5, help="k-means seeds of each MAUVE")
    p.add_argument("--quick", action="store_true", help="data: a few puzzles and pairs")
    p.add_argument("--evaluate-one", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> None:
    args = parse()
    os.environ |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if args.evaluate_one:  # a child of study.evaluate_children
        rows = evaluate_model(json.loads(args.evaluate_one), args)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
        return
    if args.phase == "data":
        make_data(args.folders[0] if args.folders else args.data, args.quick)
        return
    found = study.table(*args.folders)
    specs = []
    for row in study.rows(found):
        kind, name = name_of(row)
        ckpt = str(Path(row["folder"]) / "model.safetensors")
        specs.append({"name": f"{kind}-{slug(name)}", "label": name, "set": kind, "ckpt": ckpt})
    options = ["--data", str(args.data), "--puzzles", str(args.puzzles), "--seed", str(args.seed)]
    options += ["--prompts", str(args.prompts), "--mauve-seeds", str(args.mauve_seeds)]
    rows = study.evaluate_children(Path(__file__), specs, args.evaluated, args.jobs, options)
    plan = [r for r in rows if r["set"] == "plan"]
    austen = [r for r in rows if r["set"] == "austen"]
    training = [
        {"name": name_of(r)[1], "steps": r["steps"], "cost": r["cost"], "job": r["folder"]}
        for r in study.rows(found)
    ]
    report = {"puzzles": args.puzzles, "prompts": args.prompts, "seed": args.seed,
              "mauve_seeds": args.mauve_seeds, "training": training, "plan": plan,
              "austen": austen, "goals": goals(plan, austen)}  # fmt: skip
    commands = [
        "python experiments/conditional.py data multirun/conditional_data",
        "cdlm-train -m experiment=conditional_plan hydra/launcher=joblib hydra.launcher.n_jobs=2",
        "cdlm-train -m experiment=conditional_austen hydra/launcher=joblib hydra.launcher.n_jobs=2",
        "python experiments/conditional.py report " + " ".join(map(str, args.folders)),
    ]
    title = "Prompt→response training (issue 41)"
    path = study.write(
        "conditional", title, markdown(report), report, commands, found, args.results
    )
    print(path.read_text())


if __name__ == "__main__":
    main()
