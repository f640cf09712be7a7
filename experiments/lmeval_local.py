"""lm-eval on a local held-out cloze (issue 41): docs/results/lmeval_local.md and .json from one run.

    python experiments/lmeval_local.py --runs /work/runs/lmeval_local --out docs/results/lmeval_local

The cloze is built as ``tests/data/lmeval/austen_cloze.jsonl`` is (tests/data/lmeval/README.md),
but bigger and from exactly the held-out split: the bundled corpus is tokenised with the models'
own tokenizer by ``TextDataModule`` (``data.val_fraction=0.02``: the last 2 % of each novel's
packed sequences), and each row is a sentence lying wholly inside a novel's validation
sequences, its last word the answer, the next rows' last words the distractors. Rows and the
task YAML go to ``RUNS/tasks``. Every (model, mc_draws, seed) is one ``lm_eval.simple_evaluate``
call with ``log_samples``, stored in ``RUNS/units/`` as it finishes: a cut run resumes where it
stopped, and ``--models`` lets processes share the work (each writes the doc from every unit
found). The baselines: chance (1 / choices) and the unigram readout of the training tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import time
from itertools import pairwise
from pathlib import Path

import lm_eval
import torch
from lm_eval.tasks import TaskManager

from cdlm.data import TextDataModule, load_documents
from cdlm.evaluation.lmeval import CdlmLM
from cdlm.evaluation.lmeval_scores import split_pair
from cdlm.model_file import Model, load_model

TASK = "cdlm_austen_cloze_heldout"
MODELS = {
    "autoregressive": "/work/runs/duo/austen/autoregressive",
    "masked": "/work/runs/duo/austen/masked",
    "block": "{runs}/block",
    "gaussian": "/work/runs/duo/austen/gaussian",
}
DRAWS = (1, 4, 16, 64)
SEEDS = (0, 1, 2)
CHOICES = 4
# a row: a whole sentence of 40..110 characters, no quotation marks, ending in a lowercase word
SENTENCE = re.compile(r"^[^\"“”]{40,110}$")
LAST_WORD = re.compile(r" ([a-z]+)[.!?]$")
YAML = """# A held-out multiple-choice cloze (experiments/lmeval_local.py), built like
# tests/data/lmeval/austen_cloze.yaml from the last 2 % of each novel's sequences.
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def held_out_sentences(data: TextDataModule) -> dict[str, list[str]]:
    """Per novel, the whole sentences inside its validation sequences (which are contiguous and
    at the document's end): paragraphs split at EOS, the first one dropped (it may begin in the
    training part) and the last (the packing may cut it)."""
    val, eos = data.val_set, data.tokenizer.eos_token_id
    out: dict[str, list[str]] = {}
    for label_id, label in enumerate(data.labels):
        ids = val.tokens[val.labels == label_id].reshape(-1).tolist()
        cuts = [i for i, t in enumerate(ids) if t == eos]
        paragraphs = [data.tokenizer.decode(ids[a + 1 : b]) for a, b in pairwise(cuts)]
        out[label] = [
            s.strip() for p in paragraphs for s in re.split(r"(?<=[.!?]) +", p) if s.strip()
        ]
    return out


def cloze_rows(sentences: dict[str, list[str]], corpus: str, n_rows: int) -> list[dict]:
    """``n_rows`` rows, taken from the novels in turn; a sentence must occur exactly once in the
    whole corpus (so no training sequence holds it) and the choices of a row must differ."""
    pools = [
        [s for s in pool if SENTENCE.match(s) and LAST_WORD.search(s) and corpus.count(s) == 1]
        for pool in sentences.values()
    ]
    picked = [pool[k] for k in range(max(map(len, pools))) for pool in pools if k < len(pool)]
    answers = [LAST_WORD.search(s).group(1) for s in picked]
    rows = []
    for i, sentence in enumerate(picked):
        others = []
        for j in range(i + 1, i + len(picked)):
            word = answers[j % len(picked)]
            if word != answers[i] and word not in others:
                others.append(word)
            if len(others) == CHOICES - 1:
                break
        label = len(rows) % CHOICES
        context = sentence[: sentence.rindex(" ")]
        rows.append({"context": context, "choices": others[:label] + [answers[i]] + others[label:]})
        rows[-1]["label"] = label
        if len(rows) == n_rows:
            return rows
    raise ValueError(f"only {len(rows)} held-out rows qualify, {n_rows} asked for")


def build_task(runs: Path, tokenizer, n_rows: int) -> tuple[Path, list[dict], TextDataModule]:
    """The rows (JSON lines) and the task YAML under ``runs/tasks``, and the data module."""
    data = TextDataModule()
    data.use_tokenizer(tokenizer)
    data.setup()
    corpus = "\n".join(d.text for d in load_documents(None))  # cleaned, as the data module reads it
    rows = cloze_rows(held_out_sentences(data), corpus, n_rows)
    folder = runs / "tasks"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "austen_cloze_heldout.jsonl"
    for file, text in (
        (path, "".join(json.dumps(r) + "\n" for r in rows)),
        (folder / "austen_cloze_heldout.yaml", YAML.format(task=TASK, data=path)),
    ):
        if not file.exists() or file.read_text() != text:  # processes running beside it read it
            file.write_text(text)
    return folder, rows, data


def evaluate(model: Model, tasks: Path, draws: int, seed: int) -> dict:
    """One simple_evaluate: acc, its standard error, every row's choice log-likelihoods."""
    lm = CdlmLM(model, mc_draws=draws, seed=seed)
    start = time.perf_counter()
    out = lm_eval.simple_evaluate(
        model=lm,
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        log_samples=True,
    )
    wall = time.perf_counter() - start
    result = out["results"][TASK]
    samples = sorted(out["samples"][TASK], key=lambda s: s["doc_id"])
    return {
        "acc": result["acc,none"],
        "acc_stderr": result["acc_stderr,none"],
        "loglikelihoods": [[r[0] for r in s["filtered_resps"]] for s in samples],
        "wall_seconds": round(wall, 1),
        "load_average": os.getloadavg()[0],
    }


def unigram(model: Model, data: TextDataModule, rows: list[dict]) -> dict:
    """The readout with no context: each choice scored by its tokens' training log-frequencies."""
    logf = data.log_unigram()
    hits = []
    for row in rows:
        scores = [
            sum(logf[t].item() for t in split_pair(model, row["context"], " " + c)[1])
            for c in row["choices"]
        ]
        hits.append(max(range(len(scores)), key=scores.__getitem__) == row["label"])
    return accuracy(hits)


def accuracy(hits: list[bool]) -> dict:
    """Mean and its standard error over rows (the sample std / sqrt(n), as lm-eval's)."""
    n, acc = len(hits), sum(hits) / len(hits)
    return {"acc": acc, "acc_stderr": math.sqrt(acc * (1 - acc) / (n - 1))}


def summarise(units: list[dict], rows: list[dict]) -> list[dict]:
    """One table row per (model, mc_draws): accuracy over seeds, per-row std over seeds."""
    table = []
    for name in MODELS:
        for draws in DRAWS:
            got = [u for u in units if u["model"] == name and u["mc_draws"] == draws]
            if not got:
                continue
            gold = [[u["loglikelihoods"][i][r["label"]] for u in got] for i, r in enumerate(rows)]
            allc = [
                [u["loglikelihoods"][i][c] for u in got]
                for i, r in enumerate(rows)
                for c in range(CHOICES)
            ]
            table.append(
                {
                    "model": name,
                    "process": got[0]["process"],
                    "mc_draws": draws,
                    "seeds": [u["seed"] for u in got],
                    "acc_per_seed": [u["acc"] for u in got],
                    "acc": sum(u["acc"] for u in got) / len(got),
                    "acc_stderr": sum(u["acc_stderr"] for u in got) / len(got),
                    "std_gold": mean_std(gold) if len(got) > 1 else None,
                    "std_all_choices": mean_std(allc) if len(got) > 1 else None,
                    "wall_seconds": [u["wall_seconds"] for u in got],
                }
            )
    return table


def mean_std(values: list[list[float]]) -> float:
    """The mean over rows of each row's sample std over seeds."""
    return sum(torch.tensor(v, dtype=torch.float64).std().item() for v in values) / len(values)


def cli_check(runs: Path, tasks: Path, unit: dict, limit: int = 5) -> dict:
    """``cdlm-lm-eval`` on the first ``limit`` rows of one unit, at lm-eval's default
    ``--batch_size`` (1) and at ``auto``: the largest difference from the unit's log-likelihoods
    in each case (0: the command line gives the Python route's numbers)."""
    out = {}
    for size in ("1", "auto"):
        folder = runs / "cli_check" / size
        args = f"pretrained={MODELS[unit['model']].format(runs=runs)},mc_draws={unit['mc_draws']}"
        command = ["cdlm-lm-eval", "--model", "cdlm", "--model_args", f"{args},seed={unit['seed']}"]
        command += ["--tasks", TASK, "--include_path", str(tasks), "--device", "cpu"]
        command += ["--batch_size", size, "--limit", str(limit), "--log_samples"]
        subprocess.run([*command, "--output_path", str(folder)], check=True, capture_output=True)
        (samples,) = folder.glob(f"**/samples_{TASK}_*.jsonl")
        for line in samples.read_text().splitlines():
            row = json.loads(line)
            got = [float(r[0]) for r in row["filtered_resps"]]
            want = unit["loglikelihoods"][row["doc_id"]]
            diff = max(abs(a - b) for a, b in zip(got, want, strict=True))
            out[size] = max(out.get(size, 0.0), diff)
    return {"unit": f"{unit['model']}-{unit['mc_draws']}-{unit['seed']}", "rows": limit} | {
        f"max_abs_diff_batch_size_{k}": v for k, v in out.items()
    }


def steps_of(path: str) -> int | None:
    """The optimizer steps on the model's card (``cdlm-train`` writes them)."""
    card = json.loads((Path(path) / "config.json").read_text()).get("card", {})
    return card.get("training", {}).get("steps")


def report(out: Path, setup: dict, table: list[dict], baselines: dict, rows: list[dict]) -> None:
    """docs/results/lmeval_local.json (everything) and .md (setup, the table, what it shows, commands)."""
    out.with_suffix(".json").write_text(
        json.dumps({"setup": setup, "baselines": baselines, "table": table}, indent=1) + "\n"
    )
    fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [
        "# lm-eval on a local held-out cloze",
        "",
        f"Measured by `experiments/lmeval_local.py` at commit `{setup['commit']}` (issue 41);",
        "the numbers are in [lmeval_local.json](lmeval_local.json).",
        "",
        "## Setup",
        "",
        f"- **Task** `{TASK}`: {len(rows)} four-way cloze rows, built as the tests' 8-row task",
        "  (`tests/data/lmeval/README.md`) from the held-out split itself: the last 2 % of each",
        "  novel's packed 128-token sequences (`data.val_fraction=0.02`, `TextDataModule` with the",
        "  models' own tokenizer), whole sentences inside them, each occurring once in the corpus;",
        "  the novels taken in turn. Rows and YAML live in the run folder, not the repo.",
        "- **Models** (model folders):",
    ]
    for name, info in setup["models"].items():
        lines.append(
            f"  - {name}: `{info['path']}`, {info['steps']} optimizer steps; {info['note']}"
        )
    lines += [
        f"- **Estimator**: `lm_eval.simple_evaluate(model=CdlmLM(model, mc_draws=K, seed=S), "
        f"tasks=[...], task_manager=TaskManager(include_path=...))` with `log_samples`, one call "
        f"per (model, K, S); seeds {list(SEEDS)}. AR is exact (one row, the draws unused).",
        f"- **Machine**: {setup['threads']} torch thread(s) per process on a 2-core CPU shared "
        f"with other jobs: {setup['concurrency']}",
        f"- **Command line**: {cli_text(setup['cli_check'])}",
        "",
        "## Results",
        "",
        "Accuracy: mean over seeds, ± the mean standard error over rows. Spread: the std over seeds",
        "of the gold continuation's log-likelihood (nats), averaged over rows (all four choices'",
        "in the JSON). Wall: seconds per seed's evaluation.",
        "",
        "| model | process | mc_draws | accuracy ± SE | acc per seed | log-lik. std over seeds | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for b, v in baselines.items():
        lines.append(f"| {b} | — | — | {v['acc']:.3f} ± {v.get('acc_stderr', 0):.3f} | — | — | — |")
    for t in table:
        per_seed = ", ".join(f"{a:.2f}" for a in t["acc_per_seed"])
        walls = ", ".join(f"{w:.0f}" for w in t["wall_seconds"])
        lines.append(
            f"| {t['model']} | {t['process']} | {draws_of(t)} | {t['acc']:.3f} ± {t['acc_stderr']:.3f} "
            f"| {per_seed} | {fmt(t['std_gold'])} | {walls} |"
        )
    lines += ["", "## What it shows", ""] + findings(table, baselines) + ["", "## Reproduce", ""]
    lines += commands(setup)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def cli_text(check: dict | None) -> str:
    """The command-line check in words."""
    if check is None:
        return "not checked (the masked unit it compares against did not finish)."
    return (
        f"`cdlm-lm-eval` on the first {check['rows']} rows of unit `{check['unit']}` gives its "
        f"log-likelihoods to within {check['max_abs_diff_batch_size_auto']:.2g} nats (0: "
        "exactly) with "
        f"`--batch_size auto`; with lm-eval's default `--batch_size 1` they differ by up to "
        f"{check['max_abs_diff_batch_size_1']:.3g} nats (each draw then its own unstratified "
        "level: another estimator, see Reproduce)."
    )


def findings(table: list[dict], baselines: dict) -> list[str]:
    """Plain statements read off the table: the best row, and each model against chance."""
    if not table:
        return ["No model row finished."]
    chance = baselines["chance"]["acc"]
    best = max(table, key=lambda t: t["acc"])
    out = [
        f"- Best row: {best['model']} at mc_draws={draws_of(best)}, accuracy {best['acc']:.3f} "
        f"± {best['acc_stderr']:.3f} (chance {chance:.3f}, unigram "
        f"{baselines['unigram']['acc']:.3f})."
    ]
    one_draw = {t["model"]: t["std_gold"] for t in table if t["mc_draws"] == 1}
    for t in table:
        z = (t["acc"] - chance) / max(t["acc_stderr"], 1e-9)
        verdict = "within 2 SE of chance" if abs(z) < 2 else f"{z:+.1f} SE from chance"
        spread = "" if t["std_gold"] is None else f"; spread {t['std_gold']:.2f} nats"
        if t["std_gold"] and one_draw.get(t["model"]) and t["mc_draws"] > 1:
            ratio = t["std_gold"] / one_draw[t["model"]]
            spread += f", {ratio:.2f}x one draw's (1/sqrt(K) = {t['mc_draws'] ** -0.5:.2f})"
        out.append(f"- {t['model']}, mc_draws={draws_of(t)}: {verdict}{spread}.")
    missing = [
        f"{t['model']} at {t['mc_draws']} draws ({len(t['seeds'])} of {len(SEEDS)} seeds)"
        for t in table
        if len(t["seeds"]) < len(SEEDS)
    ]
    missing += [
        f"{name} at {k} draws (no seed)"
        for name in MODELS
        for k in DRAWS
        if name != "autoregressive"
        and not any(t["model"] == name and t["mc_draws"] == k for t in table)
    ]
    if missing:
        out.append(f"- Not finished by the deadline: {'; '.join(missing)}.")
    return out


def draws_of(row: dict) -> int | str:
    """A table row's draws as the table shows them (AR is exact: it makes none)."""
    return "exact" if row["process"] == "autoregressive" else row["mc_draws"]


def commands(setup: dict) -> list[str]:
    """The commands that rebuild the task, rerun a row by lm-eval's own CLI, and this page."""
    return [
        "```bash",
        "cdlm-train experiment=quickstart process=block trainer.max_time=00:00:06:00 \\",
        f"    hydra.run.dir={setup['runs']}/block logger=csv seed=0 \\",
        "    init_from=/work/runs/duo/austen/autoregressive/model.safetensors",
        f"python experiments/lmeval_local.py --runs {setup['runs']} --out docs/results/lmeval_local",
        "# one (model, mc_draws, seed) through lm-eval's command line; the task folder is written",
        "# by the line above. --batch_size auto puts all draws in one call, as the Python route",
        "# does: the CLI's default of 1 gives each masked or block draw its own unstratified level,",
        "# a different estimator with other numbers (gaussian's draws are not batched).",
        "cdlm-lm-eval --model cdlm --device cpu --batch_size auto \\",
        "    --model_args pretrained=/work/runs/duo/austen/masked,mc_draws=16,seed=0 \\",
        f"    --tasks {TASK} --include_path {setup['runs']}/tasks",
        "```",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("/work/runs/lmeval_local"))
    parser.add_argument("--out", type=Path, default=Path("docs/results/lmeval_local"))
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--models", nargs="*", default=list(MODELS), help="the ones to evaluate")
    parser.add_argument("--concurrency", default="", help="what else ran, for the doc")
    args = parser.parse_args()
    paths = {name: p.format(runs=args.runs) for name, p in MODELS.items()}
    loaded = {name: load_model(paths[name], torch.device("cpu")) for name in args.models}
    first = loaded.get("autoregressive") or load_model(paths["autoregressive"])  # same tokenizer
    tasks, rows, data = build_task(args.runs, first.tokenizer, args.rows)
    units_dir = args.runs / "units"
    units_dir.mkdir(exist_ok=True)
    plan = [("autoregressive", 1, s) for s in SEEDS]
    plan += [(m, k, s) for k in DRAWS for s in SEEDS for m in MODELS if m != "autoregressive"]
    for name, draws, seed in plan:
        unit = units_dir / f"{name}-{draws}-{seed}.json"
        if name not in loaded or unit.exists():
            continue
        record = {"model": name, "process": loaded[name].process.kind, "mc_draws": draws}
        record |= {"seed": seed, **evaluate(loaded[name], tasks, draws, seed)}
        unit.write_text(json.dumps(record) + "\n")
        print(name, draws, seed, record["acc"], record["wall_seconds"], flush=True)
    units = [json.loads(p.read_text()) for p in sorted(units_dir.glob("*.json"))]
    checked, reference = args.runs / "cli_check.json", units_dir / "masked-16-0.json"
    if not checked.exists() and reference.exists():
        checked.write_text(
            json.dumps(cli_check(args.runs, tasks, json.loads(reference.read_text())))
        )
    check = json.loads(checked.read_text()) if checked.exists() else None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    setup = {
        "commit": commit.stdout.strip(),
        "runs": str(args.runs),
        "rows": len(rows),
        "threads": torch.get_num_threads(),
        "concurrency": args.concurrency,
        "cli_check": check,
        "models": {
            name: {"path": p, "steps": steps_of(p), "note": NOTES[name]}
            for name, p in paths.items()
            if (Path(p) / "config.json").exists()
        },
    }
    baselines = {"chance": {"acc": 1 / CHOICES}, "unigram": unigram(first, data, rows)}
    report(args.out, setup, summarise(units, rows), baselines, rows)


NOTES = {
    "autoregressive": "`experiment=quickstart`, 10 min wall clock (experiments/duo.py)",
    "masked": "`experiment=quickstart`, 10 min wall clock (experiments/duo.py)",
    "gaussian": "`experiment=quickstart`, 10 min wall clock (experiments/duo.py)",
    "block": "`experiment=quickstart process=block`, 6 min wall clock, initialised from the AR "
    "model above (so its budget is not the others')",
}


if __name__ == "__main__":
    main()
