"""Issue 50's Austen rows: prompt guidance with prompt dropout, sampled through ``cdlm-sample``.

    python experiments/conditional.py data multirun/conditional_data
    cdlm-train -m experiment=conditional_guidance
    python experiments/conditional_guidance.py multirun/conditional_guidance

The sweep (conf/experiment/conditional_guidance.yaml) trains masked, gaussian (the prompt shown
noised, its default) and gaussian with the prompt shown clean (``process.prompt_view=clean``) on
the Austen "previous paragraph → next paragraph" pairs with prompt dropout 0.1. For each model,
every held-out prompt (``conditional.py``'s: the last 64 model tokens of the previous paragraph)
goes into one prompts file, sampled as a user would: ``cdlm-sample prompts=FILE num_samples=K
guidance.on=prompt guidance.scale=[0,1,2]`` (``--samples`` K, 1 by default as the 2 shared cores
allow; the default sampler and steps, 64 new tokens, each continuation cut at its first EOS;
prompt row r draws with seed r at every scale, so the scales differ only by guidance).

Prompt dependence (docs/results/conditional.md's): the scorer's (SmolLM2-135M) NLL per token of a
continuation after the next held-out prompt minus after its own. Per prompt, the mean over its
non-empty continuations; the row's value is the mean over prompts with its SE over prompts, and
the change between two scales is paired by prompt (the mean and SE of per-prompt differences).
The rows go into docs/results/conditional.{md,json}: the JSON's ``austen_guidance`` and a
generated section of the doc between its guidance markers; the rest of both is left as it is.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import conditional
import study

from cdlm.io import atomic_write_text

SCALES = (0.0, 1.0, 2.0)
START, STOP = "<!-- guidance -->", "<!-- end guidance -->"


def view_of(job: dict) -> tuple[str, str | None]:
    """The job's process (its recipe's first word) and, for gaussian, the prompt view its model
    file records (the default changed to clean in issue 50; a recipe name does not say it)."""
    process = job["overrides"]["recipe"].split("_")[0]
    config = json.loads((Path(job["folder"]) / "config.json").read_text())
    return process, config["process"]["prompt_view"] if process == "gaussian" else None


def prompts_file(ckpt: str, args: argparse.Namespace, path: Path) -> list[dict]:
    """The held-out rows drawn by ``--seed`` (all of them by default), their prompts cut to the
    model's last ``PROMPT_TOKENS`` tokens, written as a ``prompts=`` file; the rows back."""
    from cdlm.generation.inputs import read_layout
    from cdlm.model_file import load_model
    from cdlm.tasks.passages import word_ids

    model = load_model(ckpt)
    held = [json.loads(line) for line in (args.data / "austen_held.jsonl").read_text().split("\n")
            if line.strip()]  # fmt: skip
    picked = random.Random(args.seed).sample(held, min(args.prompts, len(held)))
    width, rows = model.config["seq_len"], []
    for r in picked:
        text = model.tokenizer.decode(
            word_ids(model.tokenizer, r["prompt"])[-conditional.PROMPT_TOKENS :]
        )
        given = len(read_layout(model, width, prompt=text, max_new_tokens=1).ids) - 1
        rows.append({"prompt": text, "max_new_tokens": min(conditional.CONTINUATION, width - given),
                     "response": r["response"]})  # fmt: skip
    lines = [json.dumps({k: r[k] for k in ("prompt", "max_new_tokens")}) for r in rows]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return rows


def sample(ckpt: str, rows_path: Path, out: Path, args: argparse.Namespace) -> list[dict]:
    """``cdlm-sample`` on the prompts file at every scale; its records."""
    exe = shutil.which("cdlm-sample", path=str(Path(sys.executable).parent)) or "cdlm-sample"
    scales = ",".join(f"{w:g}" for w in SCALES)
    cmd = [exe, f"ckpt={ckpt}", f"prompts={rows_path}", f"num_samples={args.samples}",
           "guidance.on=prompt", f"guidance.scale=[{scales}]", f"seed={args.seed}",
           f"batch_size={args.batch_size}", "progress=false", f"out={out}"]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in out.read_text().splitlines()]


def paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, float]:
    """Mean ± SE over prompts of b - a (prompts present in both)."""
    return conditional.mean_se([b[i] - a[i] for i in a if i in b])


def evaluate(job: dict, args: argparse.Namespace, scorer) -> list[dict]:
    """One model's rows: each scale's dependence over prompts, and the changes 0→1, 1→2, 0→2."""
    folder = args.evaluated / job["name"]
    folder.mkdir(parents=True, exist_ok=True)
    rows = prompts_file(job["ckpt"], args, folder / "prompts.jsonl")
    records = sample(job["ckpt"], folder / "prompts.jsonl", folder / "samples.jsonl", args)
    prompts = [r["prompt"] for r in rows]
    shuffled = prompts[1:] + prompts[:1]  # each continuation after the next row's prompt
    out, per_prompt = [], {}
    for w in SCALES:
        mine = [r for r in records if r["scale"] == w]
        lines = [r["line"] - 1 for r in mine]
        texts = [r["completion"] for r in mine]
        own = conditional.nll_after(scorer, [prompts[i] for i in lines], texts)
        other = conditional.nll_after(scorer, [shuffled[i] for i in lines], texts)
        by: dict[int, list[float]] = {}
        for i, o, s in zip(lines, own, other, strict=True):
            if o is not None:
                by.setdefault(i, []).append(s - o)
        per_prompt[w] = {i: statistics.fmean(d) for i, d in by.items()}
        dependence, se = conditional.mean_se(list(per_prompt[w].values()))
        out.append({"scale": w, "prompt_dependence": dependence, "prompt_dependence_se": se,
                    "prompts": len(per_prompt[w]), "continuations": len(mine),
                    "empty": sum(not t.strip() for t in texts), "nfe": mine[0]["nfe"],
                    "mean_words": statistics.fmean(len(t.split()) for t in texts),
                    "example": {"prompt": prompts[0][-160:], "continuation": texts[0]}})  # fmt: skip
    for a, b in ((0.0, 1.0), (1.0, 2.0), (0.0, 2.0)):
        change, se = paired(per_prompt[a], per_prompt[b])
        out.append({"scale": None, "change": f"{a:g}→{b:g}", "prompt_dependence": change,
                    "prompt_dependence_se": se, "prompts": len(per_prompt[a])})  # fmt: skip
    base = {"model": job["label"], "process": job["process"], "prompt_view": job["view"]}
    return [base | r for r in out]


def reference(args: argparse.Namespace, scorer, rows: list[dict]) -> dict:
    """The true next paragraphs scored alike: the dependence real text shows."""
    prompts = [r["prompt"] for r in rows]
    texts = [r["response"] for r in rows]
    own = conditional.nll_after(scorer, prompts, texts)
    other = conditional.nll_after(scorer, prompts[1:] + prompts[:1], texts)
    dependence, se = conditional.mean_se([s - o for o, s in zip(own, other, strict=True)])
    return {"model": "real next paragraph", "process": None, "prompt_view": None, "scale": None,
            "prompt_dependence": dependence, "prompt_dependence_se": se, "prompts": len(rows)}  # fmt: skip


def verdicts(rows: list[dict]) -> list[str]:
    """The goal for the masked and gaussian defaults, and clean against noised gaussian."""
    out = []
    for label in ("masked", "gaussian, prompt noised", "gaussian, prompt clean"):
        by = {r["scale"]: r for r in rows if r["model"] == label and r["scale"] is not None}
        if not by:  # a sweep still training
            continue
        change = next(r for r in rows if r["model"] == label and r.get("change") == "0→2")
        deps = [by[w]["prompt_dependence"] for w in SCALES]
        rising = deps[0] < deps[1] < deps[2]
        z = change["prompt_dependence"] / change["prompt_dependence_se"]  # paired, by prompt
        said = ", ".join(f"{d:.3f} ± {by[w]['prompt_dependence_se']:.3f}"
                         for w, d in zip(SCALES, deps, strict=True))  # fmt: skip
        met = rising and z >= 2
        goal = "" if label.endswith("clean") else f": goal {'met' if met else 'missed'}"
        out.append(
            f"{label}: dependence at scales 0, 1, 2 {said} nats/token, "
            f"{'monotone' if rising else 'not monotone'}; 0→2 paired "
            f"{change['prompt_dependence']:+.3f} ± {change['prompt_dependence_se']:.3f} "
            f"({z:+.2f} SE){goal}."
        )
    return out


def markdown(report: dict, header: str) -> str:
    lines = ["## Prompt guidance on Austen with prompt dropout (issue 50)", "", header,
             f"{report['prompts']} held-out prompts, {report['samples']} continuation(s) of each per "
             f"scale (seed {report['seed']}); training as `cdlm-table` read it (the final bound "
             "scores whole rows, prompt included).", "",
             "| model | steps | CPU (min) | wall (min) | final bound (bits/token) | jobs at once |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for t in report["training"]:
        cost = t["cost"] or {}
        cpu = study.fmt((cost.get("cpu_seconds") or math.nan) / 60, 1)
        wall = study.fmt((cost.get("wall_seconds") or math.nan) / 60, 1)
        lines.append(f"| {t['model']} | {t['steps']} | {cpu} | {wall} "
                     f"| {study.fmt(t['val_bits'])} | {cost.get('parallel_jobs')} |")  # fmt: skip
    lines += ["", "| model | scale | NFE | empty | words | prompt dependence ± SE (nats/token) |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for r in report["rows"]:
        scale = r.get("change") or ("real text" if r["scale"] is None else f"{r['scale']:g}")
        lines.append(
            f"| {r['model']} | {scale} | {study.fmt(r.get('nfe'), 0)} | {study.fmt(r.get('empty'))} "
            f"| {study.fmt(r.get('mean_words'), 1)} "
            f"| {r['prompt_dependence']:+.3f} ± {r['prompt_dependence_se']:.3f} |"
        )
    lines += ["", "Empty: continuations that end (EOS) at once, left out of the dependence. Rows "
              "`a→b`: the change from scale a to b, paired by prompt over the prompts non-empty "
              "at both.", ""]  # fmt: skip
    lines += [f"- {v}" for v in report["goals"]]
    return "\n".join(lines) + "\n"


def write(report: dict, commands: list[str], found: dict, folder: Path) -> Path:
    """The JSON's ``austen_guidance`` and the doc's generated guidance section, in place."""
    used, jobs = study.commits(found), study.parallel_jobs(found)
    record = {"command": " && ".join(commands), "commits": used,
              "date": datetime.date.today().isoformat(), "machine": study.machine(),
              "parallel_jobs": jobs} | report  # fmt: skip
    path = folder / "conditional.json"
    whole = json.loads(path.read_text()) if path.is_file() else {}
    atomic_write_text(path, json.dumps(whole | {"austen_guidance": record}, indent=1) + "\n")
    doc = folder / "conditional.md"
    text = doc.read_text(encoding="utf-8")
    section = f"{START}\n{markdown(report, study.header(commands, used, jobs))}{STOP}"
    if START in text:
        text = text[: text.index(START)] + section + text[text.index(STOP) + len(STOP) :]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    atomic_write_text(doc, text)
    return doc


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folders", type=Path, nargs="+", help="the conditional_guidance sweep")
    p.add_argument("--data", type=Path, default=Path("multirun/conditional_data"))
    p.add_argument("--evaluated", type=Path, default=Path("multirun/conditional_guidance_eval"))
    p.add_argument("--results", type=Path, default=study.RESULTS, help="where the doc goes")
    p.add_argument("--prompts", type=int, default=1000, help="held-out prompts (at most all)")
    p.add_argument("--samples", type=int, default=1, help="continuations per prompt and scale")
    p.add_argument("--batch-size", type=int, default=64, help="cdlm-sample rows per call")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main() -> None:
    args = parse()
    os.environ |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    from cdlm.evaluation.quality import load_scorer

    found = study.table(*args.folders)
    scorer, rows, training, held = load_scorer(None), [], [], []
    for job in study.rows(found):
        process, view = view_of(job)
        label = process if view is None else f"{process}, prompt {view}"
        spec = {"name": job["overrides"]["recipe"], "label": label, "process": process,
                "view": view, "ckpt": str(Path(job["folder"]) / "model.safetensors")}  # fmt: skip
        cached = args.evaluated / f"{spec['name']}.json"
        if not cached.is_file():
            atomic_write_text(cached, json.dumps(evaluate(spec, args, scorer), indent=1) + "\n")
        rows += json.loads(cached.read_text())
        held = held or prompts_file(spec["ckpt"], args, args.evaluated / "reference.jsonl")
        training.append({"model": label, "steps": job["steps"], "cost": job["cost"],
                         "val_bits": job["metrics"].get("final/bits_per_token"),
                         "job": job["folder"]})  # fmt: skip
    cached = args.evaluated / "reference.json"
    if not cached.is_file():
        atomic_write_text(cached, json.dumps(reference(args, scorer, held)) + "\n")
    rows.append(json.loads(cached.read_text()))
    report = {"prompts": len(held), "samples": args.samples, "seed": args.seed,
              "scales": list(SCALES), "training": training, "rows": rows,
              "goals": verdicts(rows)}  # fmt: skip
    commands = ["python experiments/conditional.py data multirun/conditional_data",
                "cdlm-train -m experiment=conditional_guidance",
                "python experiments/conditional_guidance.py " + " ".join(map(str, args.folders))]  # fmt: skip
    print(write(report, commands, found, args.results).read_text()[-4000:])


if __name__ == "__main__":
    main()
