"""Duo's measurement (issue 40): docs/results/duo.md and docs/results/duo.json from one run.

    python experiments/duo.py --runs outputs/duo --out docs/results/duo                   # ~75 min
    python experiments/duo.py --quick --runs /tmp/duo --out /tmp/duo              # ~5 min smoke

Rows: masked, uniform, uniform with Duo's Gaussian curriculum, gaussian and AR, each trained by
``cdlm-train experiment=quickstart`` (the same wall clock for every row, ``--jobs`` at a time on
one CPU thread each, recorded as ``parallel_runs``) on the bundled Austen corpus and on the
character world (``data=world:chars``). Then discrete consistency distillation (DCD) of the
curriculum-trained uniform model, rounds 32 -> 16 -> 8 -> 4 steps. Every model is sampled at
8, 16, 64 and 128 steps (whole canvases, seed 0): on Austen gen-PPL (SmolLM2-135M) beside token
entropy, with a temperature frontier at 8 and 64 steps; on the world the exact scores (KL and TV
rates against the truth with their floors, violations). Each model's bound: on Austen the val
bound, on the world the bound on exact samples minus the entropy rate (excess bits). The
curriculum's speed is read from the two uniform runs' validation curves (``metrics.csv``).

Training, distillation and evaluation are phases (``--phases``); finished runs and evaluated
models are reused, so a run can be resumed and each phase may come from a later commit (each
phase's commit is recorded).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import launch
from budget import duration, last_step, metrics
from continuous import sampler_at

from cdlm.evaluation.frontier import at_entropy

CORPORA = {"austen": [], "chars": ["data=world:chars"]}
# recipe -> (overrides, per-corpus extra overrides)
RECIPES: dict[str, tuple[list[str], dict[str, list[str]]]] = {
    "masked": (["process=masked"], {}),
    "uniform": (["process=uniform"], {}),
    # Duo's gamma range [-3.5, -1.75] spans alpha 0.97 .. 0.09 at V = 8192 but only 1.0 .. 0.62
    # at the world's V = 30: there the curriculum's Gaussian reaches logSNR -4 (alpha 0.01)
    "uniform+curriculum": (
        ["process=uniform", "process.curriculum.share=0.5"],
        {"chars": ["process.curriculum.gamma_max=4"]},
    ),
    "gaussian": (["process=gaussian"], {}),
    "autoregressive": (["process=autoregressive"], {}),
}
TEACHER = "uniform+curriculum"  # DCD distils Duo's curriculum-trained model, as the paper does
DCD_START, DCD_END = 32, 4  # students at 16, 8 and 4 steps
# DCD's budget in optimizer steps (a third per round), not wall clock: what a student learns
# does not depend on what else the machine runs (a step costs ~5 s on Austen, ~1 s on the world)
DCD_STEPS = {"austen": 60, "chars": 150}
STEPS = (8, 16, 64, 128)
# process -> [(label, conf/sampler name, options, step counts)]; the first also gets the frontier
# (a uniform step costs ~3x a masked one here: every position draws from V each step)
SAMPLERS = {
    "masked": [("ancestral", "ancestral", {}, STEPS)],
    "uniform": [
        ("duo_ancestral", "duo_ancestral", {}, (4, *STEPS)),  # 4: beside the DCD students
        ("duo_psi", "duo_psi", {}, (8, 64)),
    ],
    "gaussian": [("ddpm", "ddpm", {}, STEPS)],
    "autoregressive": [("ar", "ar", {"stop_at_eos": False}, None)],
}
FRONTIER_STEPS, FRONTIER_T = (8,), (0.8, 0.9)  # Austen only: the world's scorer is the truth
END = "<!-- end measured -->"


def commit() -> str:
    here = Path(__file__).resolve().parent
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True)
    return out.stdout.strip()


def train_one(job: tuple[str, str, Path, float]) -> dict:
    corpus, recipe, run_dir, minutes = job
    overrides, extra = RECIPES[recipe]
    args = [
        "experiment=quickstart",
        *CORPORA[corpus],
        *overrides,
        *extra.get(corpus, []),
        f"trainer.max_time={duration(minutes * 60)}",
        # a quickstart row reaches ~170 steps on one thread: validate often enough for a curve
        "trainer.val_check_interval=25",
        f"hydra.run.dir={run_dir}",
        "logger=csv",
        "seed=0",
        "+trainer.enable_progress_bar=false",
    ]
    return run_once(args, run_dir)


def run_once(args: list[str], run_dir: Path) -> dict:
    """``cdlm-train`` with ``args`` unless an earlier run finished there; its cost record."""
    record_path = run_dir / "duo_run.json"
    if not record_path.is_file():
        cost = launch.train(args, wandb=False)
        record = {"args": args, "wall_seconds": cost.wall_seconds, "cpu_seconds": cost.cpu_seconds}
        record_path.write_text(json.dumps(record, indent=2) + "\n")
    return json.loads(record_path.read_text())


def distil_one(job: tuple[str, Path, Path, int]) -> dict:
    corpus, teacher, run_dir, steps = job
    args = [
        *CORPORA[corpus],
        "process=uniform",
        "module=distill_dcd",
        f"teacher={teacher}",
        f"module.start_steps={DCD_START}",
        f"module.end_steps={DCD_END}",
        f"module.round_dir={run_dir / 'rounds'}",
        "module.round_eval.scorer=none",  # every student is scored below
        f"trainer.max_steps={steps}",
        "lr_scheduler=warmup_cosine",
        f"trainer.val_check_interval={steps // 3}",
        f"hydra.run.dir={run_dir}",
        "logger=csv",
        "seed=0",
        "+trainer.enable_progress_bar=false",
    ]
    return run_once(args, run_dir)


def students(run_dir: Path) -> dict[int, Path]:
    """The DCD round students by step count (``round<k>_<steps>steps.safetensors``)."""
    found = sorted((run_dir / "rounds").glob("round*_*steps.safetensors"))
    return {int(p.stem.split("_")[1].removesuffix("steps")): p for p in found}


def val_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, val bits/token) at every validation of a training run."""
    rows = [r for r in metrics(run_dir) if r.get("val/bits_per_token")]
    return [(int(r["step"]) + 1, float(r["val/bits_per_token"])) for r in rows]


def configs(process: str, world: bool, length: int) -> list[tuple[str, str, dict, int, float]]:
    """(label, sampler, options, steps, temperature) for one model."""
    out = []
    for i, (label, name, options, counts) in enumerate(SAMPLERS[process]):
        counts = counts or [length]
        frontier = [] if world or i > 0 else list(FRONTIER_T)
        for steps in counts:
            temps = frontier if process == "autoregressive" or steps in FRONTIER_STEPS else []
            out += [(label, name, options, steps, t) for t in (1.0, *temps)]
    return out


def evaluate_model(spec: dict, args: argparse.Namespace) -> list[dict]:
    """Every config of one model: samples scored by the world or the scorer, and its bound."""
    import torch

    from cdlm.evaluation.bound import val_bits_per_token
    from cdlm.evaluation.harness import text_quality
    from cdlm.evaluation.quality import load_scorer
    from cdlm.evaluation.world_score import canvas, world_of, world_quality, world_sections
    from cdlm.generation import Plan, generate, named_sampler
    from cdlm.likelihood.evaluate import validation_tokens
    from cdlm.model_file import load_model
    from cdlm.rng import generator

    torch.set_num_threads(1)
    model = load_model(spec["ckpt"])
    process, length = model.process.kind, model.config["seq_len"]
    world = model.config.get("world")
    judge = world_of(model, world) if world else None
    scorer = None if world else load_scorer(None)
    found = configs(process, bool(world), length)
    if spec.get("steps"):  # a DCD student: its own step count, its recorded sampler
        found = [("duo_ancestral", "duo_ancestral", {}, spec["steps"], 1.0)]
    rows, bound = [], None
    for label, name, options, steps, temperature in found:
        sampler, x0_t = sampler_at(process, named_sampler(name, **options), temperature)
        plan = Plan(
            num_samples=args.num_samples,
            seq_len=length,
            steps=steps,
            seed=0,
            denoising={"temperature": x0_t},
            cut_at_eos=False,
        )
        gen = generate(model, sampler, plan)
        ids = [s.token_ids for s in gen.samples]
        if judge is not None:
            if bound is None:
                quality, bound = world_sections(
                    model, judge, world, gen.samples, 0, args.likelihood_sequences, 1
                )
            else:
                eos = model.tokenizer.eos_token_id
                quality = world_quality(
                    judge, world, canvas(ids, length, eos), generator=generator(0)
                )
            q = quality["samples"]
            scores = {k: q[k] for k in ("kl_rate", "kl_floor", "tv_rate", "tv_floor")}
            scores |= {"violation_rate": q["violation_rate"], "nll_truth": q["nll_truth"]}
            scores |= {"entropy": q.get("token_entropy_bits")}
        else:
            if bound is None:
                val = validation_tokens(model)[: args.likelihood_sequences]
                bound = val_bits_per_token(model, val, 0)
            q = text_quality(ids, [s.text for s in gen.samples], scorer)
            scores = {"gen_ppl": q.get("gen_ppl"), "entropy": q["token_entropy_bits"]}
        rows.append(
            spec["row"]
            | {
                "sampler": label,
                "steps": steps,
                "temperature": temperature,
                "nfe": gen.nfe,
                "bits_per_token": bound["bits_per_token"],
                "excess_bits": bound.get("excess_bits"),
                "revisions": gen.stats.get("revisions"),
                "example": gen.samples[0].text[:160],
            }
            | scores
        )
        print(f"{spec['name']}: {label} @{steps} T={temperature:g}: {scores}", flush=True)
    return rows


def evaluate_all(specs: list[dict], args: argparse.Namespace) -> list[dict]:
    """Each model in its own child process (``--evaluate-one``), ``--jobs`` at a time."""
    options = ["--num-samples", str(args.num_samples)]
    options += ["--likelihood-sequences", str(args.likelihood_sequences)]
    return launch.evaluate_children(
        Path(__file__), specs, args.runs / "evaluated", args.jobs, options
    )


def find(rows: list[dict], **match) -> list[dict]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def curriculum_goal(runs: Path, corpus: str) -> dict:
    """Steps the curriculum run needs to reach the plain uniform run's final val bound."""
    plain, curr = (val_curve(runs / corpus / r) for r in ("uniform", "uniform+curriculum"))
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
        "curves": {"uniform": plain, "uniform+curriculum": curr},
    }


def eight_step_goal(rows: list[dict], corpus: str) -> list[str]:
    """Uniform at 8 steps against masked at 8: the KL rate on the world; on Austen gen-PPL read
    on each uniform frontier at masked's T = 1 entropy."""
    lines = []
    masked = find(rows, corpus=corpus, recipe="masked", steps=8, temperature=1.0)
    if not masked:
        return lines
    m = masked[0]
    for recipe in ("uniform", "uniform+curriculum"):
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
    teacher = find(rows, corpus=corpus, recipe=TEACHER, sampler="duo_ancestral", steps=128)
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


def fmt(v, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def markdown(report: dict) -> str:
    lines = [f"<!-- measured: {report['command']} -->", ""]
    lines.append(
        f"Commits: {report['commits']}. Training: {report['minutes']:g} min per row on Austen "
        f"(the quickstart budget), {report['world_minutes']:g} min on the world, DCD "
        f"{report['dcd_steps']} optimizer steps; {report['jobs']} runs at a time, one CPU thread each "
        f"(`parallel_runs`). {report['num_samples']} samples of 128 tokens per row, seed 0, "
        "whole canvases."
    )
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
            cells = [r["recipe"], r["role"], r["train_steps"], fmt(r["bits_per_token"], 3)]
            cells += [fmt(r["excess_bits"], 3)] if world else []
            cells += [r["sampler"], r["steps"], f"{r['temperature']:g}", fmt(r["nfe"], 0)]
            if world:
                cells += [fmt(r["kl_rate"], 4), fmt(r["kl_floor"], 4), fmt(r["tv_rate"], 3)]
                cells += [fmt(r["violation_rate"], 3)]
            else:
                cells += [fmt(r["gen_ppl"], 0), fmt(r["entropy"], 2)]
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
    return "\n".join(lines) + "\n" + END + "\n"


def with_prose(path: Path, generated: str, script: str = "experiments/duo.py") -> str:
    """The doc with ``script``'s measured section replaced; prose before and after the markers
    kept."""
    old = path.read_text() if path.is_file() else ""
    start = old.find(f"<!-- measured: {script}")
    if start < 0:
        return old + ("\n" if old else "") + generated
    stop = old.find(END, start)
    return old[:start] + generated + old[stop + len(END) + 1 :]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=Path, default=Path("outputs/duo"))
    p.add_argument("--out", type=Path, default=Path("docs/results/duo"))
    p.add_argument("--minutes", type=float, default=10.0, help="Austen budget per row")
    p.add_argument("--world-minutes", type=float, default=4.0)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--num-samples", type=int, default=16)
    p.add_argument("--likelihood-sequences", type=int, default=64)
    p.add_argument("--phases", default="train,distil,evaluate")
    p.add_argument("--quick", action="store_true", help="a smoke run: 0.5-minute budgets")
    p.add_argument("--evaluate-one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.minutes = args.world_minutes = 0.5
        args.num_samples, args.likelihood_sequences = 4, 4
    return args


def main() -> None:
    args = parse()
    if args.evaluate_one:  # a child of evaluate_all
        rows = evaluate_model(json.loads(args.evaluate_one), args)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
        return
    os.environ |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    phases, runs = args.phases.split(","), args.runs.resolve()
    state_path = runs / "state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {"commits": {}}
    runs.mkdir(parents=True, exist_ok=True)
    minutes = {"austen": args.minutes, "chars": args.world_minutes}
    trained = [(c, r, runs / c / r, minutes[c]) for c in CORPORA for r in RECIPES]
    trained.sort(key=lambda job: -job[3])  # the longest first: the pool ends together
    if "train" in phases:
        state["commits"]["train"] = commit()
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(train_one, trained))
    distilled = [(c, runs / c / TEACHER / "model.safetensors", runs / c / "dcd",
                  max(3, DCD_STEPS[c] // (20 if args.quick else 1))) for c in CORPORA]  # fmt: skip
    if "distil" in phases:
        state["commits"]["distil"] = commit()
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(distil_one, distilled))
    state_path.write_text(json.dumps(state, indent=2) + "\n")
    if "evaluate" not in phases:
        return
    state["commits"]["evaluate"] = commit()
    specs = []
    for corpus, recipe, run_dir, _ in trained:
        row = {"corpus": corpus, "recipe": recipe, "role": "trained"}
        row |= {"train_steps": last_step(run_dir), "parallel_runs": args.jobs}
        row |= {"process": RECIPES[recipe][0][0].split("=")[1]}
        specs.append({"name": f"{corpus}-{recipe}", "ckpt": str(run_dir / "model.safetensors"),
                      "row": row})  # fmt: skip
    for corpus, _, run_dir, _ in distilled:
        for steps, ckpt in students(run_dir).items():
            row = {"corpus": corpus, "recipe": f"dcd of {TEACHER}", "role": "student"}
            row |= {"train_steps": last_step(run_dir), "parallel_runs": args.jobs}
            row |= {"process": "uniform"}
            specs.append({"name": f"{corpus}-dcd{steps}", "ckpt": str(ckpt), "row": row,
                          "steps": steps})  # fmt: skip
    rows = evaluate_all(specs, args)
    for row in rows:
        if row["role"] == "trained" and row["recipe"] == TEACHER:
            row["role"] = "teacher"
    report = {
        "command": "experiments/duo.py " + " ".join(sys.argv[1:]),
        "commits": state["commits"],
        "minutes": args.minutes,
        "world_minutes": args.world_minutes,
        "dcd_steps": DCD_STEPS,
        "jobs": args.jobs,
        "num_samples": args.num_samples,
        "rows": rows,
        "curriculum": [curriculum_goal(runs, c) for c in CORPORA],
        "eight_steps": {c: eight_step_goal(rows, c) for c in CORPORA},
        "dcd": {c: dcd_goal(rows, c) for c in CORPORA},
    }
    from cdlm.io import atomic_write_text

    atomic_write_text(args.out.with_suffix(".json"), json.dumps(report, indent=1) + "\n")
    md = args.out.with_suffix(".md")
    atomic_write_text(md, with_prose(md, markdown(report)))
    print(markdown(report))


if __name__ == "__main__":
    main()
