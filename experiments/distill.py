"""Step distillation on this machine, one run: teachers at many step counts beside their
distilled students, with gen-PPL beside entropy, NFE, wall time and tokens/s.

    python experiments/distill.py --gaussian-teacher G.safetensors --masked-teacher M.safetensors \
        --minutes 8 --out docs/results/distillation

Per process: distil through the real CLI (``cdlm-train module=distill_progressive|distill_sdtt
teacher=...``, ``--minutes`` of wall clock split over the rounds, each round's student kept),
then evaluate every row through ``cdlm.evaluation.harness`` (the harness of ``cdlm-eval``): the
teacher at TEACHER_STEPS with its samplers, each student at the step count it was distilled
for (and the last one at fewer). Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import launch
import torch

from cdlm.evaluation.harness import evaluate_checkpoint
from cdlm.evaluation.quality import load_scorer
from cdlm.generation import named_sampler
from cdlm.io import atomic_write_text
from cdlm.model_file import load_model

TEACHER_STEPS = (128, 64, 16, 8, 4, 2, 1)
STUDENT_STEPS = (16, 8, 4, 2, 1)
# process -> (distillation module, start steps, teacher samplers: (label, config, options))
PLAN = {
    "gaussian": (
        "distill_progressive",
        64,
        [("ddim", "ddim", {}), ("ddpm", "ddpm", {}), ("rolling T=1", "rolling", {})],
    ),
    "masked": ("distill_sdtt", 64, [("ancestral", "ancestral", {})]),
}
STUDENT_SAMPLER = {"gaussian": ("ddim", {}), "masked": ("ancestral", {})}
# method -> (process, its overrides): each one distillation run of the process's teacher
METHODS = {
    "progressive-elf": (  # ELF (Hu et al. 2026): the original teacher, 4 sub-steps
        "gaussian",
        [
            "module.teacher_each_round=original",
            "module.method.teacher_steps_per_step=4",
            "module.per_round=true",
        ],
    ),
    "progressive-previous": (  # Salimans & Ho 2022: the previous student, 2 sub-steps
        "gaussian",
        [
            "module.teacher_each_round=previous",
            "module.method.teacher_steps_per_step=2",
            "module.per_round=true",
        ],
    ),
    "sdtt": ("masked", ["module.per_round=true"]),  # the previous student teaches (SDTT's)
}


def recipe_of(ckpt: str) -> str:
    """The recipe a checkpoint was trained with, from its run's Hydra overrides ('default'
    when the run named none, 'unknown' when the run folder keeps no Hydra record)."""
    overrides = Path(ckpt).parent / ".hydra" / "overrides.yaml"
    if not overrides.is_file():
        return "unknown"
    named = [o for o in overrides.read_text().split() if o.startswith("recipe=")]
    return named[-1].split("=", 1)[1] if named else "default"


def budget(minutes: float | None, steps: int | None) -> list[str]:
    """A step budget (work that does not depend on what else runs) or a wall-clock one."""
    if steps:
        return [f"trainer.max_steps={steps}", "lr_scheduler=warmup_cosine"]
    seconds = int(minutes * 60)
    return [
        "trainer.max_steps=-1",
        f"trainer.max_time=00:00:{seconds // 60:02d}:{seconds % 60:02d}",
        "lr_scheduler=wallclock_cosine",
    ]


def distil(
    method: str, teacher: str, out: Path, limit: list[str], extra: list[str], end: int = 1
) -> dict:
    """Runs the CLI; returns the students by step count and the CPU minutes it took."""
    process, options = METHODS[method]
    module, start, _ = PLAN[process]
    run = out / "runs" / method
    args = [
        f"module={module}",
        f"teacher={teacher}",
        f"module.start_steps={start}",
        f"module.end_steps={end}",
        f"module.round_dir={run / 'rounds'}",
        "module.round_eval.scorer=none",  # the table scores every student below
        *limit,
        "trainer.val_check_interval=50",
        "logger=csv",
        f"hydra.run.dir={run}",
        *options,
        *extra,
    ]
    if (run / "distill.json").is_file():  # --reuse: distilled by an earlier run
        return json.loads((run / "distill.json").read_text())
    cost = launch.train(args, wandb=False)  # its CPU time: what distillation cost here
    students = {
        int(p.stem.split("_")[1].removesuffix("steps")): str(p)
        for p in sorted((run / "rounds").glob("round*_*steps.safetensors"))
    }
    record = {
        "args": args,
        "wall_minutes": cost.wall_seconds / 60,
        "cpu_minutes": cost.cpu_seconds / 60,
        "students": students,
    }
    atomic_write_text(run / "distill.json", json.dumps(record, indent=2) + "\n")
    return record


def row(
    process: str,
    role: str,
    method: str,
    ckpt: str,
    label: str,
    config: str,
    options: dict,
    steps: int,
    args,
    scorer,
) -> dict:
    report = evaluate_checkpoint(
        ckpt,
        named_sampler(config, **options),
        steps=steps,
        num_samples=args.num_samples,
        seed=0,
        repeats=args.repeats,
        grid="uniform",
        scorer=scorer,
        device=torch.device("cpu"),
        likelihood_sequences=args.likelihood_sequences,
        cut_at_eos=False,
    )
    speed, quality = report["speed"]["steady"], report["quality"]["samples"]
    bound = report["likelihood"]
    out = {
        "process": process,
        "recipe": args.recipes[process],
        "role": role,
        "method": method,
        "sampler": label,
        "steps": steps,
        "temperature": options.get("temperature", 1.0),
        "bits_per_token": bound["bits_per_token"],
        "bits_std_error": bound.get("std_error"),
        "gen_ppl": quality.get("gen_ppl"),
        "entropy": quality["token_entropy_bits"],
        "distinct_2": quality["distinct_2"],
        "nfe": speed["nfe"]["median"],
        "wall_seconds": speed["wall_seconds"],
        "tokens_per_s": speed["tokens_per_sec"],
        "reference_gen_ppl": report["quality"]["reference"].get("gen_ppl"),
        "reference_entropy": report["quality"]["reference"]["token_entropy_bits"],
        "example": report["samples"][0][:200],
    }
    print(
        f"{process} {role} {label} {steps}: gen-PPL {out['gen_ppl']}, entropy {out['entropy']:.2f}",
        flush=True,
    )
    return out


GENERATED_END = "<!-- end generated: the reading below is written by hand -->"
INTRO = """Commands (`cdlm-train` on any corpus, the teacher any cdlm `model.safetensors`):

```bash
cdlm-train module=distill_progressive teacher=PATH trainer.max_time=00:00:08:00   # gaussian
cdlm-train module=distill_consistency teacher=PATH trainer.max_steps=500          # gaussian
cdlm-train module=distill_sdtt teacher=PATH trainer.max_time=00:00:08:00          # masked
cdlm-train process=uniform module=distill_dcd teacher=PATH trainer.max_steps=600   # uniform
cdlm-sample ckpt=outputs/.../model.safetensors          # the student's own steps and sampler
```

Methods (`cdlm/distillation/`): **progressive** distillation (Salimans & Ho 2022; ELF applies
it to text): each round the student's one DDIM step matches the teacher's two on the same
uniform grid (x0 target, truncated-SNR weight, plus a CE term), rounds halve the steps and the
student becomes the next teacher. **Consistency** distillation (Song et al. 2023): the student's
x0 at t_{n+1} matches its EMA copy's at the teacher's DDIM step to t_n. **SDTT** (Deschenaux &
Gulcehre 2024): at every masked position the student matches, by reverse KL (forward KL and MSE
as options), the distribution the teacher reaches in two ancestral steps; rounds halve the
steps. **DCD** (Duo's discrete consistency distillation, Sahoo et al. 2025): for uniform-state
teachers, the student at (x_t, t) matches the teacher at (x_s, s = t − 1/(2·steps)), where x_t
and x_s are the argmaxes of one Gaussian path over one-hots ([duo.md](duo.md#discrete-consistency-distillation-dcd-built-not-measured));
rounds halve the steps. Each round is an equal share of the budget; each round's student is kept
(`module.round_dir`) and evaluated below at the step count it was distilled for.

Progressive options (`conf/module/distill_progressive.yaml`; ELF's recipe, Hu et al. 2026, is
`teacher_each_round=original per_round=true method.teacher_steps_per_step=4`):

- `module.method.teacher_steps_per_step=k`: the target is k teacher DDIM sub-steps per student
  step (2 is Salimans & Ho's, ELF uses 4). `tests/test_distillation.py` checks k in {1, 2, 4}
  against a closed-form teacher on Gaussian data in float64.
- `module.teacher_each_round=previous|original`: round k's student teaches round k + 1 (Salimans
  & Ho), or the given teacher teaches every round at the student's step count (ELF).
- `module.per_round=true`: each round gets its own warmup-cosine learning rate
  (`round_warmup`, `round_min_lr`), fresh optimizer state and a restarted EMA. The round's
  student, which becomes the next round's start (and, with `previous`, its teacher), is that
  round's EMA. Off, one schedule spans all rounds and the EMA carries over.
- `module.method.ce_weight`: the CE term on the student's logits, kept in every round.

A two-round run under both teacher options is in `tests/test_distillation.py`. It checks which
weights teach round 2 and the per-round learning-rate factor. The same round options
(`teacher_each_round`, `per_round`) apply to SDTT (`conf/module/distill_sdtt.yaml`).

SDTT also takes a block-diffusion teacher (`process=block`, whose process the teacher file
brings): every block is masked at the one level t and both networks are called with the true
clean stream (`denoiser(z, t, clean=tokens)`, through `process.predict`), so the teacher's two
ancestral steps run within every block at once, each block given the clean blocks before it.
Its steps are therefore steps per block: `module.start_steps=8 module.end_steps=1` distils 4,
2 and then 1 step per block. The student records `sampler=block` with
`sampler.steps_per_block` set to its steps, which cdlm-sample, cdlm-eval and the end-of-round
check use (the round check fills whole canvases, `stop_at_eos=false`). No block row is in the
table below yet.
"""


def find(rows: list[dict], process: str, role: str, steps: int, **match) -> dict | None:
    """The lowest-gen-PPL row of ``process``/``role`` at ``steps`` whose other fields match."""
    found = [
        r
        for r in rows
        if r["process"] == process
        and r["role"] == role
        and r["steps"] == steps
        and r["gen_ppl"]
        and all(r.get(k) == v for k, v in match.items())
    ]
    return min(found, key=lambda r: r["gen_ppl"], default=None)


def goals(rows: list[dict]) -> list[str]:
    """The issue's goals, per distillation method: the 8-step student against the teacher at 64
    steps (<= 1.0x gen-PPL), the 4-step one (<= 1.10x), both with entropy >= 0.95x the
    teacher's, against the teacher's best sampler at 64 steps and against the sampler the
    student was distilled for; then every student against the undistilled teacher with that
    sampler at the student's own step count (it should beat it: what distillation bought)."""
    out = []
    students = dict.fromkeys((r["process"], r["method"]) for r in rows if r["role"] == "student")
    for process, method in students:
        out.append(f"- **{process}, {method}:**")
        for steps, bound in ((8, 1.0), (4, 1.10)):
            student = find(rows, process, "student", steps, method=method)
            if student is None:
                continue
            own = student["sampler"].split(",")[0]
            best = find(rows, process, "teacher", 64)
            same = find(rows, process, "teacher", 64, sampler=own)
            for teacher in [best] + ([same] if same is not best else []):
                if teacher is None:
                    continue
                ratio = student["gen_ppl"] / teacher["gen_ppl"]
                ent = student["entropy"] / teacher["entropy"]
                met = ratio <= bound and ent >= 0.95
                out.append(
                    f"  - {steps}-step student ({student['gen_ppl']:.0f} at "
                    f"{student['entropy']:.2f} bits) vs the teacher at 64 steps with "
                    f"{teacher['sampler']} ({teacher['gen_ppl']:.0f} at {teacher['entropy']:.2f}"
                    f"{', its best sampler' if teacher is best else ''}): gen-PPL {ratio:.2f}x "
                    f"(goal <= {bound:.2f}x), entropy {ent:.2f}x (goal >= 0.95x): "
                    f"**{'met' if met else 'not met'}**."
                )
        beaten = []
        for steps in STUDENT_STEPS:
            student = find(rows, process, "student", steps, method=method)
            plain = student and find(
                rows, process, "teacher", steps, sampler=student["sampler"].split(",")[0]
            )
            if plain:
                ent = student["entropy"] / plain["entropy"]
                lower = student["gen_ppl"] < plain["gen_ppl"]
                wins = lower and ent >= 0.95
                floor = 0.5 * student.get("reference_entropy", 0.0)  # a repeated-token canvas
                if max(student["entropy"], plain["entropy"]) < floor:
                    verdict = (
                        f"both collapsed: {student['entropy']:.2f} and {plain['entropy']:.2f} bits, "
                        "so no comparison"
                    )
                elif lower and not wins:  # lower gen-PPL bought with entropy
                    verdict = f"lower only at {ent:.2f}x its entropy: not a win"
                else:
                    verdict = "beats" if wins else "does not beat"
                beaten.append(
                    f"{steps}: {student['gen_ppl']:.0f} against {plain['gen_ppl']:.0f} ({verdict})"
                )
        if beaten:
            out.append(
                "  - Each student against the undistilled teacher with the same sampler at the "
                f"student's steps: {'; '.join(beaten)}."
            )
    return out


def markdown(report: dict) -> str:
    lines = [
        "# Step distillation on 2 CPU cores",
        "",
        INTRO,
        f"Generated by `{report['command']}` (students distilled by an earlier `--distil-only` "
        f"run with the same budget are reused; {report['num_samples']} samples of "
        f"{report['seq_len']} tokens per row, whole canvases, scored by SmolLM2-135M; wall time "
        f"over {report['repeats']} timed runs after a warm-up, min / median / max).",
        "",
        f"Teachers: {', '.join(f'{p} `{t}`' for p, t in report['teachers'].items())}. Methods "
        "(each a `cdlm-train` run with these overrides): "
        + "; ".join(
            f"`{m}` ({p}: `{' '.join(o)}`)"
            for m, (p, o) in METHODS.items()
            if m in report["distillation"]
        )
        + ".",
        "",
        "| process | role | method | sampler | steps | NFE | bits/token | gen-PPL | entropy (bits) "
        "| wall s (min/med/max) | tokens/s (median) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        w = r["wall_seconds"]
        ppl = f"{r['gen_ppl']:.0f}" if r["gen_ppl"] is not None else "n/a"
        lines.append(
            f"| {r['process']} | {r['role']} | {r['method']} | {r['sampler']} | {r['steps']} | "
            f"{r['nfe']} | {r['bits_per_token']:.2f} | {ppl} | {r['entropy']:.2f} | "
            f"{w['min']:.2f} / {w['median']:.2f} / "
            f"{w['max']:.2f} | {r['tokens_per_s']['median']:.0f} |"
        )
    for process, d in report["distillation"].items():
        lines.append("")
        lines.append(
            f"- {process}: distillation took {d['wall_minutes']:.1f} min of wall clock, "
            f"{d['cpu_minutes']:.1f} CPU minutes (`cdlm-train {' '.join(d['args'])}`)."
        )
    lines += ["", "## Goals", "", *goals(report["rows"])]
    real = next((r for r in report["rows"]), None)
    if real:
        lines.append(
            f"- Real val text at the same length: gen-PPL {real['reference_gen_ppl']:.0f}, "
            f"entropy {real['reference_entropy']:.2f} bits."
        )
    return "\n".join(lines) + f"\n{GENERATED_END}\n"


def with_prose(path: Path, generated: str) -> str:
    """The generated part replaced, the hand-written reading after ``GENERATED_END`` kept."""
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    return generated + (old.split(GENERATED_END + "\n", 1)[1] if GENERATED_END in old else "")


def teacher_rows(process: str, teacher: str, args, scorer) -> list[dict]:
    """The undistilled teacher with each of its samplers at every step count."""
    _, _, samplers = PLAN[process]
    return [
        row(process, "teacher", "none", teacher, label, config, options, steps, args, scorer)
        for steps in map(int, args.teacher_steps.split(","))
        for label, config, options in samplers
    ]


def student_rows(method: str, record: dict, args, scorer) -> list[dict]:
    """Each round's student at the step count it was distilled for, and the last one at fewer."""
    process, _ = METHODS[method]
    config, options = STUDENT_SAMPLER[process]
    students = {int(k): v for k, v in record["students"].items()}  # JSON keys are strings
    last = min(students, default=None)
    rows = []
    for steps in STUDENT_STEPS:
        if steps not in students and (last is None or steps > last):
            continue
        trained = steps if steps in students else last
        label = config if trained == steps else f"{config}, the {trained}-step student"
        rows.append(
            row(process, "student", method, students[trained], label, config, options, steps,
                args, scorer)
        )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--gaussian-teacher", default="outputs/continuous/runs40/logit_normal/model.safetensors"
    )
    parser.add_argument(
        "--masked-teacher", default="outputs/continuous/runs40/masked/model.safetensors"
    )
    parser.add_argument("--minutes", type=float, default=8.0, help="distillation per method")
    parser.add_argument("--steps", type=int, help="a step budget per method instead")
    parser.add_argument("--end-steps", type=int, default=1, help="the last round's student")
    parser.add_argument("--distil-only", action="store_true", help="distil, evaluate later")
    parser.add_argument("--num-samples", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--likelihood-sequences", type=int, default=64)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--runs", default="outputs/distill")
    parser.add_argument("--out", default="docs/results/distillation")
    parser.add_argument("--train-override", action="append", default=[])
    parser.add_argument("--teacher-steps", default=",".join(map(str, TEACHER_STEPS)))
    parser.add_argument("--render", action="store_true", help="rewrite <out>.md from <out>.json")
    args = parser.parse_args()
    out = Path(args.out)
    if args.render:  # the same rows, the reading re-rendered (e.g. after a change to goals)
        report = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
        atomic_write_text(
            out.with_suffix(".md"), with_prose(out.with_suffix(".md"), markdown(report))
        )
        return
    teachers = {"gaussian": args.gaussian_teacher, "masked": args.masked_teacher}
    args.recipes = {process: recipe_of(path) for process, path in teachers.items()}
    methods = args.methods.split(",")
    if unknown := sorted(set(methods) - set(METHODS)):
        parser.error(f"unknown --methods {unknown}; known: {sorted(METHODS)}")
    limit, runs = budget(args.minutes, args.steps), Path(args.runs)
    extra, end = args.train_override, args.end_steps
    if args.distil_only:
        for method in methods:
            distil(method, teachers[METHODS[method][0]], runs, limit, extra, end)
        return
    scorer = load_scorer()
    rows, distilled = [], {}
    for process in dict.fromkeys(METHODS[m][0] for m in methods):
        rows += teacher_rows(process, teachers[process], args, scorer)
        for method in (m for m in methods if METHODS[m][0] == process):
            distilled[method] = distil(method, teachers[process], runs, limit, extra, end)
            rows += student_rows(method, distilled[method], args, scorer)
    report = {
        "command": "python " + " ".join(sys.argv),
        "num_samples": args.num_samples,
        "repeats": args.repeats,
        "seq_len": load_model(next(iter(teachers.values()))).config["seq_len"],
        "threads": torch.get_num_threads(),
        "teachers": teachers,
        "distillation": distilled,
        "rows": rows,
    }
    atomic_write_text(out.with_suffix(".json"), json.dumps(report, indent=2) + "\n")
    md = out.with_suffix(".md")
    atomic_write_text(md, with_prose(md, markdown(report)))
    print(markdown(report))


if __name__ == "__main__":
    main()
