"""Learned models in exact worlds (issue 39): docs/results/worlds_learned.md and .json from one run.

    python experiments/worlds_learned.py --runs outputs/worlds_learned --out docs/results/worlds_learned
    python experiments/worlds_learned.py --quick --runs /tmp/wl --out /tmp/wl      # a smoke run

AR, masked, block (``experiment=block_quickstart``: its AR phase, then block size 4, in the
same clock) and gaussian are trained on the character chain and the agreement world
(``data=world:*``), ``--minutes`` of wall clock each, ``--jobs`` at a time on one CPU thread
each (``parallel_runs``); the gaussian levers (self-conditioning with the posterior input,
CANDI's hybrid corruption, a 16-wide embedding, the importance-weighted loss) on the character
world at the same clock. Then SDTT of the masked model and progressive distillation of the
gaussian one (students at 16, 8 and 4 steps), and the data-constrained runs (AR and masked on a
fixed finite sample for many epochs: ``--phases crossover``, which runs as well on a GPU).

Evaluation scores everything exactly (``cdlm.evaluation.world_score``), each learned row beside
the world's own oracle of the same process under the same sampler, steps, samples and seed
(``cdlm.model_file.oracle_model``; a gaussian oracle reads the learned model's embedding table):
the bound against the oracle's (excess bits) and the entropy rate, the KL, TV and violation
rates, tokens per call and tokens/s, the gaussian context gain against the exact posterior's.
Phases (``--phases``) reuse finished runs and evaluated models; each phase's commit is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import launch
from budget import duration
from duo import commit, run_once

WORLDS = ("chars", "agreement")
# label -> (process, overrides); the block recipe trains its AR phase inside the same clock
MODELS: dict[str, tuple[str, list[str]]] = {
    "autoregressive": ("autoregressive", ["experiment=quickstart", "process=autoregressive"]),
    "block": ("block", ["experiment=block_quickstart"]),
    "masked": ("masked", ["experiment=quickstart", "process=masked"]),
    "gaussian": ("gaussian", ["experiment=quickstart", "process=gaussian"]),
}
# the gaussian levers, on the character world only (docs/guide/levers.md)
LEVERS: dict[str, tuple[str, list[str]]] = {
    "gaussian+self_cond": (
        "gaussian",
        [*MODELS["gaussian"][1], "process.input.self_cond_prob=0.5"],
    ),
    "gaussian+candi": ("gaussian", ["experiment=quickstart", "recipe=candi"]),
    "gaussian+embed16": ("gaussian", [*MODELS["gaussian"][1], "process.embed_dim=16"]),
    "gaussian+importance": ("gaussian", [*MODELS["gaussian"][1], "process.importance_weight=true"]),
}
# the Austen quickstart before and after the chosen lever, trained together (parallel_runs 2)
# checks on the character world: a second seed of the default and of the best-sampling lever,
# and masked diffusion without its AR phase (the data-constrained runs learn faster without it)
CHECKS: dict[str, tuple[str, list[str]]] = {
    "gaussian@seed1": ("gaussian", [*MODELS["gaussian"][1], "seed=1"]),
    "gaussian+self_cond@seed1": ("gaussian", [*LEVERS["gaussian+self_cond"][1], "seed=1"]),
    "masked+no_ar_phase": ("masked", [*MODELS["masked"][1], "phases=none"]),
}
# and the masked default beside masked without its AR phase (the worlds' finding, on real text),
# also at three times the clock (does the AR phase's lead last?): label -> (minutes, overrides)
AUSTEN: dict[str, tuple[float, list[str]]] = {
    "gaussian": (10.0, MODELS["gaussian"][1]),
    "gaussian+self_cond": (10.0, LEVERS["gaussian+self_cond"][1]),
    "masked": (10.0, MODELS["masked"][1]),
    "masked+no_ar_phase": (10.0, CHECKS["masked+no_ar_phase"][1]),
    "masked@30min": (30.0, MODELS["masked"][1]),
    "masked+no_ar_phase@30min": (30.0, CHECKS["masked+no_ar_phase"][1]),
}
# the Austen before/after pairs the report sets side by side: a recipe, then its lever
AUSTEN_PAIRS = [
    ("gaussian", "gaussian+self_cond"),
    ("masked", "masked+no_ar_phase"),
    ("masked@30min", "masked+no_ar_phase@30min"),
]
# each Austen run's bound: this many draws on up to this many val sequences, the same seeds for
# every run (a pair's difference is then read without most of the estimator's noise)
AUSTEN_DRAWS, AUSTEN_SEQUENCES = 8, 256
# distillation: teacher -> (module, students' sampler); rounds 32 -> 16 -> 8 -> 4 steps
DISTIL = {"masked": "distill_sdtt", "gaussian": "distill_progressive"}
DISTIL_START, DISTIL_END, DISTIL_STEPS = 32, 4, 150
# the data-constrained runs: a fixed sample of this many tokens, trained for CROSS_STEPS steps
# (AR is past its best within a few hundred; masked still gains at 2,500), validated every
# CROSS_EVERY steps on fresh samples
CROSS_TOKENS, CROSS_EVERY = (50_000, 200_000), 50
CROSS_STEPS = {"autoregressive": 2500, "masked": 6000}


def trained_runs(runs: Path) -> list[tuple[str, str, str, list[str], Path]]:
    """(world, label, process, overrides, run dir) of every trained model."""
    out = [(w, m, p, o, runs / w / m) for w in WORLDS for m, (p, o) in MODELS.items()]
    extra = LEVERS | CHECKS
    return out + [("chars", m, p, o, runs / "chars" / m) for m, (p, o) in extra.items()]


def train_one(job: tuple[str, list[str], Path, float]) -> dict:
    world, overrides, run_dir, minutes = job
    seeded = any(o.startswith("seed=") for o in overrides)
    args = [
        *overrides,
        f"data=world:{world}",
        f"trainer.max_time={duration(minutes * 60)}",
        "trainer.val_check_interval=25",  # a world row reaches ~100-250 steps: a curve
        f"hydra.run.dir={run_dir}",
        "logger=csv",
        *([] if seeded else ["seed=0"]),
        "+trainer.enable_progress_bar=false",
    ]
    return run_once(args, run_dir)


def distil_one(job: tuple[str, str, Path, Path, int]) -> dict:
    world, module, teacher, run_dir, steps = job
    process = "masked" if module == "distill_sdtt" else "gaussian"
    args = [
        f"data=world:{world}",
        f"process={process}",
        f"module={module}",
        f"teacher={teacher}",
        f"module.start_steps={DISTIL_START}",
        f"module.end_steps={DISTIL_END}",
        f"module.round_dir={run_dir / 'rounds'}",
        "module.round_eval.scorer=none",  # every student is scored exactly below
        f"trainer.max_steps={steps}",
        "lr_scheduler=warmup_cosine",
        f"trainer.val_check_interval={max(1, steps // 3)}",
        f"hydra.run.dir={run_dir}",
        "logger=csv",
        "seed=0",
        "+trainer.enable_progress_bar=false",
    ]
    return run_once(args, run_dir)


def cross_one(job: tuple[str, int, Path, int, list[str]]) -> dict:
    """One data-constrained run: ``tokens`` tokens of the character chain, fixed, many epochs;
    validation on the world's own fresh samples every CROSS_EVERY steps."""
    process, tokens, run_dir, steps, extra = job
    args = [
        "experiment=quickstart",
        f"process={process}",
        "data=world:chars",
        f"data.train_size={tokens // 128}",
        "trainer.max_time=null",
        f"trainer.max_steps={steps}",
        "lr_scheduler=warmup_cosine",
        f"trainer.val_check_interval={CROSS_EVERY}",
        f"hydra.run.dir={run_dir}",
        "logger=csv",
        "seed=0",
        "+trainer.enable_progress_bar=false",
        *extra,
    ]
    return run_once(args, run_dir)


def cross_runs(runs: Path, quick: bool, steps: int | None) -> list[tuple[str, int, Path, int]]:
    """(process, train tokens, run dir, optimizer steps) of each data-constrained run."""
    return [(p, n, runs / "crossover" / f"{p}-{n // 1000}k", 20 if quick else steps or default)
            for n in CROSS_TOKENS for p, default in CROSS_STEPS.items()]  # fmt: skip


def austen_one(job: tuple[str, Path]) -> dict:
    """One Austen quickstart run, then its samples scored as docs/results/duo.md scores them (gen-PPL
    under SmolLM2-135M beside entropy, a temperature frontier at 8 steps)."""
    label, run_dir = job
    minutes, overrides = AUSTEN[label]
    args = [
        *overrides,
        f"trainer.max_time={duration(minutes * 60)}",
        "trainer.val_check_interval=25",
        f"hydra.run.dir={run_dir}",
        "logger=csv",
        "seed=0",
        "+trainer.enable_progress_bar=false",
    ]
    return run_once(args, run_dir)


def austen_scores(austen: list[tuple[str, Path]], runs: Path) -> list[dict]:
    """The scored rows of every Austen run (``experiments/duo.py --evaluate-one``, two at a
    time), cached as ``austen/evaluated/austen-<label>.json``; the report counts their steps."""
    specs = [{"name": f"austen-{label}", "ckpt": str(run_dir / "model.safetensors"),
              "row": {"corpus": "austen", "recipe": label, "role": "trained", "parallel_runs": 2}}
             for label, run_dir in austen]  # fmt: skip
    options = ["--num-samples", "16", "--likelihood-sequences", "64"]
    script = Path(__file__).with_name("duo.py")
    return launch.evaluate_children(script, specs, runs / "austen" / "evaluated", 2, options)


def austen_bound(run_dir: Path) -> dict:
    """One Austen run's bound at ``AUSTEN_DRAWS`` draws (seeds 0, 1, ...), cached."""
    path = run_dir / "bound.json"
    if not path.is_file():
        from cdlm.evaluation.bound import val_bits_per_token
        from cdlm.likelihood.evaluate import validation_tokens
        from cdlm.model_file import load_model

        model = load_model(run_dir / "model.safetensors")
        val = validation_tokens(model)[:AUSTEN_SEQUENCES]
        bound = val_bits_per_token(model, val, 0, draws=AUSTEN_DRAWS)
        path.write_text(json.dumps(bound, indent=1) + "\n")
    return json.loads(path.read_text())


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=Path, default=Path("outputs/worlds_learned"))
    p.add_argument("--out", type=Path, default=Path("docs/results/worlds_learned"))
    p.add_argument("--minutes", type=float, default=5.0, help="wall clock per trained model")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--samples", type=int, default=64, help="samples per sampler row")
    p.add_argument("--likelihood-sequences", type=int, default=64)
    p.add_argument("--phases", default="train,distil,evaluate,report")
    p.add_argument("--cross-extra", default="", help="overrides for the crossover runs (GPU)")
    p.add_argument(
        "--crossover",
        nargs="*",
        help="folders of data-constrained runs to report "
        "(one folder per run, as scripts/gpu_crossover.sh returns them)",
    )
    p.add_argument("--cross-processes", default="autoregressive,masked")
    p.add_argument("--cross-tokens", help="only these sample sizes, e.g. 50000")
    p.add_argument("--cross-steps", type=int, help="every crossover run's steps (else CROSS_STEPS)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 0.3-minute budgets")
    p.add_argument("--evaluate-one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.minutes, args.samples, args.likelihood_sequences = 0.3, 4, 4
    return args


def main() -> None:
    args = parse()
    if args.evaluate_one:  # a child of evaluate_all
        from worlds_learned_eval import evaluate_model

        rows = evaluate_model(json.loads(args.evaluate_one), args)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
        return
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # one thread a run unless told otherwise
        os.environ.setdefault(key, "1")
    os.environ["WANDB_MODE"] = "disabled"
    phases, runs = args.phases.split(","), args.runs.resolve()
    runs.mkdir(parents=True, exist_ok=True)
    state_path = runs / "state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {"commits": {}}

    def record(phase: str) -> None:
        """The commit of this run of ``phase`` beside earlier ones (runs are reused)."""
        seen = state["commits"].get(phase, [])
        seen = [seen] if isinstance(seen, str) else seen
        state["commits"][phase] = seen + [c for c in [commit()] if c not in seen]
        state_path.write_text(json.dumps(state, indent=2) + "\n")

    trained = trained_runs(runs)
    if "train" in phases:
        record("train")
        jobs = [(w, o, d, args.minutes) for w, _, _, o, d in trained]
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(train_one, jobs))
    if "distil" in phases:
        record("distil")
        steps = 6 if args.quick else DISTIL_STEPS
        jobs = [("chars", module, runs / "chars" / teacher / "model.safetensors",
                 runs / "chars" / f"{teacher}-students", steps)
                for teacher, module in DISTIL.items()]  # fmt: skip
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(distil_one, jobs))
    if "crossover" in phases:
        record("crossover")
        jobs = [(*j, args.cross_extra.split()) for j in cross_runs(runs, args.quick, args.cross_steps)
                if j[0] in args.cross_processes.split(",")
                and str(j[1]) in (args.cross_tokens or str(j[1])).split(",")]  # fmt: skip
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(cross_one, jobs))
    austen = [(label, runs / "austen" / label) for label in AUSTEN]
    if "austen" in phases:
        record("austen")
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(austen_one, austen))
        austen_scores(austen, runs)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda job: austen_bound(job[1]), austen))
    if "evaluate" in phases or "report" in phases:
        from worlds_learned_report import report

        if "evaluate" in phases:
            record("evaluate")
        report(args, runs, state, trained, "evaluate" in phases, set(CHECKS), AUSTEN_PAIRS)


if __name__ == "__main__":
    sys.exit(main())
