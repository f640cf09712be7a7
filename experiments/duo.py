"""Duo's measurement (issue 40): docs/results/duo.{md,json} from the study's sweep folders.

    cdlm-train -m experiment=duo hydra/launcher=joblib hydra.launcher.n_jobs=2        # Austen
    cdlm-train -m experiment=duo_chars hydra/launcher=joblib hydra.launcher.n_jobs=2  # the world
    cdlm-train -m experiment=duo_dcd teacher=multirun/duo/2/model.safetensors trainer.max_steps=60
    cdlm-train -m experiment=duo_dcd teacher=multirun/duo_chars/2/model.safetensors data=world \
      hydra.sweep.dir=multirun/duo_dcd/chars
    python experiments/duo.py multirun/duo multirun/duo_chars multirun/duo_dcd/austen \
      multirun/duo_dcd/chars

Rows (conf/experiment/duo*.yaml): masked, uniform, uniform with Duo's Gaussian curriculum,
gaussian and AR (``recipe=``), each trained at the quickstart budget on the bundled Austen corpus
and on the character world; then discrete consistency distillation (DCD) of the
curriculum-trained uniform model, rounds 32 -> 16 -> 8 -> 4 steps. Every model is sampled at 8,
16, 64 and 128 steps (whole canvases, seed 0): on Austen gen-PPL (SmolLM2-135M) beside token
entropy, with a temperature frontier at 8 steps; on the world the exact scores (KL and TV rates
against the truth with their floors, violations). Each model's bound: on Austen the val bound,
on the world the bound on exact samples minus the entropy rate (excess bits). The curriculum's
speed is read from the two uniform runs' validation curves (their CSV or W&B logs). Each model
is evaluated once, in a child process of its own (``--evaluate-one``), its rows cached.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import study

from cdlm.evaluation.frontier import at_entropy

CORPORA = ("austen", "chars")
RECIPES = {  # recipe (conf/recipe/) -> process; the world's curriculum has its own gamma range
    "masked": "masked",
    "uniform": "uniform",
    "uniform_curriculum": "uniform",
    "uniform_curriculum_world": "uniform",
    "gaussian": "gaussian",
    "autoregressive": "autoregressive",
}
TEACHERS = ("uniform_curriculum", "uniform_curriculum_world")  # DCD distils these, as Duo does


def val_curve(row: dict) -> list[tuple[int, float]]:
    """(step, val bits/token) at every validation of a training job; Lightning logs a
    validation at the step before the one it follows, hence the +1."""
    return [(step + 1, bits) for step, bits in study.job_curve(row, "val/bits_per_token")]


def evaluate_all(specs: list[dict], args: argparse.Namespace) -> list[dict]:
    """Each model in its own child process (``--evaluate-one``), ``--jobs`` at a time."""
    options = ["--num-samples", str(args.num_samples)]
    options += ["--likelihood-sequences", str(args.likelihood_sequences)]
    return study.evaluate_children(Path(__file__), specs, args.evaluated, args.jobs, options)


def find(rows: list[dict], **match) -> list[dict]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def curriculum_goal(jobs: list[dict], corpus: str) -> dict | None:
    """Steps the curriculum run needs to reach the plain uniform run's final val bound (None
    without both runs)."""
    plain = [j for j in jobs if j["corpus"] == corpus and j["recipe"] == "uniform"]
    curr = [j for j in jobs if j["corpus"] == corpus and j["recipe"] in TEACHERS]
    if not (plain and curr):
        return None
    plain, curr = val_curve(plain[0]["row"]), val_curve(curr[0]["row"])
    target, plain_steps = plain[-1][1], plain[-1][0]
    reached = next((step for step, bits in curr if bits <= target), None)
    return {
        "corpus": corpus,
        "uniform_final_bits": target,
        "uniform_steps": plain_steps,
        "curriculum_final_bits": curr[-1][1],
        "curriculum_steps": curr[-1][0],
        "curriculum_steps_to_uniform_bound": reached,
        "ratio": reached / plain_steps if reached else None,
        "curves": {"uniform": plain, "uniform_curriculum": curr},
    }


def eight_step_goal(rows: list[dict], corpus: str) -> list[str]:
    """Uniform at 8 steps against masked at 8: the KL rate on the world; on Austen gen-PPL read
    on each uniform frontier at masked's T = 1 entropy."""
    lines = []
    masked = find(rows, corpus=corpus, recipe="masked", steps=8, temperature=1.0)
    if not masked:
        return lines
    m = masked[0]
    for recipe in ("uniform", *TEACHERS):
        for sampler in ("duo_ancestral", "duo_psi"):
            mine = find(rows, corpus=corpus, recipe=recipe, sampler=sampler, steps=8)
            if not mine:
                continue
            if corpus == "chars":
                u = find(mine, temperature=1.0)[0]
                verdict = "beats" if u["kl_rate"] < m["kl_rate"] else "does not beat"
                lines.append(
                    f"{recipe} {sampler} @8: KL rate {u['kl_rate']:.4f} against masked's "
                    f"{m['kl_rate']:.4f} bits: {verdict} masked"
                )
            else:
                points = sorted((r["entropy"], r["gen_ppl"]) for r in mine)
                ppl = at_entropy(points, m["entropy"])
                said = f"{ppl:.0f}" if ppl else "outside its swept entropies"
                lines.append(
                    f"{recipe} {sampler} @8: gen-PPL at masked's entropy ({m['entropy']:.2f} "
                    f"bits) {said}, masked {m['gen_ppl']:.0f}"
                    + (
                        f": {'beats' if ppl < m['gen_ppl'] else 'does not beat'} masked"
                        if ppl
                        else ""
                    )
                )
    return lines


def dcd_goal(rows: list[dict], corpus: str) -> str:
    """The 8-step student against its teacher at 128 steps (duo_ancestral, T = 1)."""
    student = find(rows, corpus=corpus, role="student", steps=8)
    teacher = find(rows, corpus=corpus, role="teacher", sampler="duo_ancestral", steps=128)
    teacher = find(teacher, temperature=1.0)
    if not (student and teacher):
        return f"{corpus}: no 8-step student or 128-step teacher row"
    s, t = student[0], teacher[0]
    if corpus == "chars":
        return (
            f"{corpus}: 8-step student KL rate {s['kl_rate']:.4f} against the teacher's "
            f"{t['kl_rate']:.4f} at 128 steps: {s['kl_rate'] / t['kl_rate']:.2f}x (goal 1.10x)"
        )
    return (
        f"{corpus}: 8-step student gen-PPL {s['gen_ppl']:.0f} at {s['entropy']:.2f} bits against "
        f"the teacher's {t['gen_ppl']:.0f} at {t['entropy']:.2f} bits at 128 steps: "
        f"{s['gen_ppl'] / t['gen_ppl']:.2f}x, entropy {s['entropy'] - t['entropy']:+.2f} bits "
        "(goal 1.10x within 0.15 bits)"
    )


def markdown(report: dict) -> str:
    lines = [
        f"{report['num_samples']} samples of 128 tokens per row, seed 0, whole canvases; each "
        "training job's steps and cost as `cdlm-table` reads them (the JSON's `jobs`)."
    ]
    for corpus in CORPORA:
        world = corpus == "chars"
        lines += ["", f"### {'The character world (scored exactly)' if world else 'Austen'}", ""]
        lines += [
            "| recipe | role | train steps | bits/token | " + ("excess bits | " if world else "")
            + "sampler | steps | T | NFE | "
            + ("KL rate | KL floor | TV rate | violations |" if world else "gen-PPL | entropy |"),
            "|" + "---|" * (12 if world else 10),
        ]  # fmt: skip
        for r in find(report["rows"], corpus=corpus):
            cells = [r["recipe"], r["role"], r["train_steps"], study.fmt(r["bits_per_token"], 3)]
            cells += [study.fmt(r["excess_bits"], 3)] if world else []
            cells += [r["sampler"], r["steps"], f"{r['temperature']:g}", study.fmt(r["nfe"], 0)]
            if world:
                cells += [
                    study.fmt(r["kl_rate"], 4),
                    study.fmt(r["kl_floor"], 4),
                    study.fmt(r["tv_rate"], 3),
                ]
                cells += [study.fmt(r["violation_rate"], 3)]
            else:
                cells += [study.fmt(r["gen_ppl"], 0), study.fmt(r["entropy"], 2)]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "### Goals", ""]
    for g in report["curriculum"]:
        ratio = f"{g['ratio']:.2f}x" if g["ratio"] else "never within its budget"
        lines.append(
            f"- Curriculum ({g['corpus']}): the plain uniform run ends at {g['uniform_final_bits']:.3f} "
            f"bits after {g['uniform_steps']} steps; the curriculum run reaches it at "
            f"{g['curriculum_steps_to_uniform_bound']} steps ({ratio}; goal <= 0.6x) and ends at "
            f"{g['curriculum_final_bits']:.3f} bits after {g['curriculum_steps']} steps."
        )
    for corpus in CORPORA:
        lines += [f"- Uniform at 8 steps ({corpus}): " + s for s in report["eight_steps"][corpus]]
    lines += [f"- DCD: {report['dcd'][c]}" for c in CORPORA]
    return "\n".join(lines) + "\n"


def corpus_of(row: dict) -> str:
    """A job's corpus: the character world for duo_chars and a DCD job of data=world."""
    overrides = row["overrides"]
    world = overrides.get("experiment") == "duo_chars" or overrides.get("data") == "world"
    return "chars" if world else "austen"


def specs_of(found: dict) -> tuple[list[dict], list[dict]]:
    """(the trained jobs, the evaluation specs of every model: trained ones and DCD students)."""
    jobs, specs = [], []
    for row in study.rows(found):
        corpus, folder = corpus_of(row), Path(row["folder"])
        common = {"corpus": corpus, "train_steps": row["steps"]}
        common["parallel_runs"] = (row["cost"] or {}).get("parallel_jobs")
        if "teacher" in row["overrides"]:
            for steps, ckpt in study.students(folder).items():
                spec_row = common | {"recipe": "dcd", "role": "student", "process": "uniform"}
                name = f"{corpus}-dcd{steps}"
                specs.append({"name": name, "ckpt": str(ckpt), "row": spec_row, "steps": steps})
            continue
        recipe = row["overrides"]["recipe"]
        role = "teacher" if recipe in TEACHERS else "trained"
        spec_row = common | {"recipe": recipe, "role": role, "process": RECIPES[recipe]}
        specs.append({"name": f"{corpus}-{recipe}", "ckpt": str(folder / "model.safetensors"),
                      "row": spec_row})  # fmt: skip
        jobs.append({"corpus": corpus, "recipe": recipe, "row": row})
    return jobs, specs


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweeps", type=Path, nargs="*", help="the study's sweep folders")
    p.add_argument("--evaluated", type=Path, default=Path("multirun/duo_evaluated"))
    p.add_argument("--jobs", type=int, default=2, help="models evaluated at a time")
    p.add_argument("--num-samples", type=int, default=16)
    p.add_argument("--likelihood-sequences", type=int, default=64)
    p.add_argument("--results", type=Path, default=study.RESULTS, help="where the doc goes")
    p.add_argument("--evaluate-one", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> None:
    args = parse()
    if args.evaluate_one:  # a child of evaluate_all
        spec = json.loads(args.evaluate_one)
        rows = study.sample_rows(spec, args.num_samples, args.likelihood_sequences)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
        return
    os.environ |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    found = study.table(*args.sweeps)
    jobs, specs = specs_of(found)
    rows = evaluate_all(specs, args)
    report = {
        "num_samples": args.num_samples,
        "jobs": [j["row"] for j in jobs],
        "rows": rows,
        "curriculum": [g for c in CORPORA if (g := curriculum_goal(jobs, c))],
        "eight_steps": {c: eight_step_goal(rows, c) for c in CORPORA},
        "dcd": {c: dcd_goal(rows, c) for c in CORPORA},
    }
    commands = [
        "cdlm-train -m experiment=duo hydra/launcher=joblib hydra.launcher.n_jobs=2",
        "cdlm-train -m experiment=duo_chars hydra/launcher=joblib hydra.launcher.n_jobs=2",
        "cdlm-train -m experiment=duo_dcd teacher=multirun/duo/2/model.safetensors "
        "trainer.max_steps=60",
        "cdlm-train -m experiment=duo_dcd teacher=multirun/duo_chars/2/model.safetensors "
        "data=world hydra.sweep.dir=multirun/duo_dcd/chars",
        "python experiments/duo.py " + " ".join(map(str, args.sweeps)),
    ]
    path = study.write("duo", "Duo: uniform-state diffusion, measured", markdown(report), report,
                       commands, found, args.results)  # fmt: skip
    print(path.read_text())


if __name__ == "__main__":
    main()
