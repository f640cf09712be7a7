"""Duo's learned rows re-measured with the drawn last step (issue 51): docs/results/duo_last_step.

    cdlm-train -m experiment=duo_last_step hydra/launcher=joblib hydra.launcher.n_jobs=1
    python experiments/duo_last_step.py multirun/duo_last_step

World models (uniform, masked and masked without its AR phase, trained at the learning study's
scale, ``conf/experiment/duo_last_step.yaml``) are sampled at 8, 32 and 128 steps, uniform with
its last step drawn from q(x_0 | x_t, x0_hat) and greedy (the argmax of x0_hat). Each row is
``--sets`` independent sample sets (seeds 0, 1, ...) of ``--samples`` sequences, scored by the
world: the transition KL rate (mean and SE over the sets) beside its floor on as many exact
samples, over the possible samples alone, the share of adjacent pairs the world never makes,
the NLL under the truth and the token entropy (beside exact samples'). Beside them each model's
bound on exact samples, paired with the world's own NLL of those sequences (excess bits and its
SE). Each model is evaluated in a child process of one thread (``--evaluate-one``), its rows
cached in ``--evaluated``. ``--reuse FILE RECIPE...`` carries the rows of models not retrained
(and their last-step checks) over from an earlier results JSON, marked with the commits they
were measured at.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

import study

STEPS = (8, 32, 128)
LAST_STEPS = ("draw", "greedy")
SAMPLER = {"uniform": "duo_ancestral", "masked": "ancestral"}
FLOOR_REPEATS = 8


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error over sample sets; an infinite value makes the mean infinite."""
    if any(math.isinf(v) for v in values):
        return math.inf, math.nan
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return mean, se


def forbidden_pair_share(tokens, reference) -> float:
    """The share of adjacent pairs (a, b) of ``tokens`` (N, L) that the world gives probability 0."""
    prev, succ = tokens[:, :-1].reshape(-1).long(), tokens[:, 1:].reshape(-1).long()
    return float((reference.prob(prev, succ) == 0).double().mean())


def configs(process: str) -> list[tuple[str, int]]:
    """(last step, steps) of one model: uniform draws both last steps; masked has none to
    choose (its last step unmasks with the model's own draw)."""
    lasts = LAST_STEPS if process == "uniform" else ("-",)
    return [(last, s) for s in STEPS for last in lasts]


def world_bound(model, world, args) -> dict:
    """The model's bound on exact samples paired with the world's NLL of the same sequences."""
    from cdlm.evaluation.excess import group_bits, nll_group_bits, paired_bound
    from cdlm.rng import generator

    exact = world.sample(args.bound_sequences, model.config["seq_len"], generator=generator(7))
    mine = group_bits(model, exact, seed=0, draws=args.bound_draws, group_size=32)
    paired = paired_bound(mine, nll_group_bits(world, exact, group_size=32))
    return {"bound_bits": paired.bound_bits, "truth_bits": paired.oracle_bits,
            "excess_bits": paired.excess_bits, "excess_se": paired.excess_se}  # fmt: skip


def one_set(model, last: str, steps: int, seed: int, samples: int):
    """One sample set of the model's sampler at ``steps`` with its ``last`` step (uniform):
    the generation and its token ids (N, L)."""
    import torch

    from cdlm.generation import Plan, generate, named_sampler

    process = model.process.kind
    options = {"last_step": last} if process == "uniform" else {}
    plan = Plan(num_samples=samples, seq_len=model.config["seq_len"], steps=steps, seed=seed,
                cut_at_eos=False)  # fmt: skip
    gen = generate(model, named_sampler(SAMPLER[process], **options), plan)
    return gen, torch.tensor([s.token_ids for s in gen.samples])


def world_figures(world, tokens, reference, seed: int) -> dict:
    """One sample set's scores by the world, beside the token entropy of as many exact samples."""
    from cdlm.evaluation.quality import token_entropy
    from cdlm.evaluation.world_score import score_samples
    from cdlm.rng import generator

    stream = generator(100 + seed)
    s = score_samples(world, tokens, floor_repeats=FLOOR_REPEATS, generator=stream,
                      reference=reference)  # fmt: skip
    exact = world.sample(len(tokens), tokens.shape[1], generator=stream)
    keep = ("kl_rate", "kl_floor", "kl_rate_possible", "tv_rate", "violation_rate", "nll_truth")
    return {k: s[k] for k in keep} | {
        "forbidden_pairs": forbidden_pair_share(tokens, reference),
        "entropy": token_entropy(tokens.tolist()),
        "entropy_exact": token_entropy(exact.tolist()),
        "entropy_rate": s["entropy_rate"],
    }


def evaluate_one(spec: dict, args) -> list[dict]:
    """Every row of one world model: per config, ``args.sets`` sample sets and their summary."""
    import torch

    from cdlm.evaluation.world_score import world_of
    from cdlm.model_file import load_model

    torch.set_num_threads(1)
    model = load_model(spec["ckpt"])
    world = world_of(model, model.config["world"])
    reference = world.transition_reference(model.config["seq_len"])
    head = spec["row"] | {"bound": world_bound(model, world, args)}
    rows = []
    for last, steps in configs(model.process.kind):
        sets = []
        for seed in range(args.sets):
            gen, tokens = one_set(model, last, steps, seed, args.samples)
            sets.append(world_figures(world, tokens, reference, seed))
        row = head | {"sampler": SAMPLER[model.process.kind], "last_step": last, "steps": steps,
                      "nfe": gen.nfe, "sets": sets, "example": gen.samples[0].text[:120]}  # fmt: skip
        for key in sets[0]:
            row[key], row[f"{key}_se"] = mean_se([s[key] for s in sets])
        rows.append(row)
        print(f"{spec['name']} {last} @{steps}: "
              + ", ".join(f"{k}={row[k]:.4g}" for k in sets[0]), flush=True)  # fmt: skip
    return rows


def last_step_check(spec: dict, sequences: int = 128) -> list[dict]:
    """Where a uniform model's samples part from the truth, one step at a time: exact sequences
    corrupted to the level t = 1/steps at which the last interval starts, then per position
    q(x_0 | x_t, x0_hat) for the model's x0_hat and the oracle's. Per level: x0_hat's mass on
    the tokens the world never emits, the last step's cross-entropy of the truth (bits/token)
    and the chance it draws one of those tokens."""
    import torch

    from cdlm.configs import compose
    from cdlm.evaluation.world_score import world_of
    from cdlm.model_file import load_model, oracle_model
    from cdlm.rng import generator
    from cdlm.samplers.uniform import uniform_posterior

    torch.set_num_threads(1)
    model = load_model(spec["ckpt"])
    if model.process.kind != "uniform":
        return []
    world = world_of(model, model.config["world"])
    judges = {
        "model": model,
        "oracle": oracle_model(world, compose("train", ["process=uniform"]).process),
    }
    x0 = world.sample(sequences, model.config["seq_len"], generator=generator(3))
    never = torch.tensor(model.tokenizer.all_special_ids)
    support = model.process.uniform_noise.support.mask  # the sampler's (None: all V)
    out = []
    for steps in STEPS:
        t = torch.full((sequences,), 1 / steps)
        c = model.process.corrupt(x0, t, generator(4))
        alpha = model.process.keep(t.double())[:, 0]
        row = {"steps": steps, "t": 1 / steps, "alpha": float(alpha[0])}
        for name, judge in judges.items():
            with torch.no_grad():
                x0_hat = judge.process.make_denoiser(judge.network)(c.x_t, t).logits
            x0_hat = x0_hat.double().softmax(-1)
            q = uniform_posterior(x0_hat, c.x_t, torch.ones_like(alpha), alpha, support)
            truth = q.gather(-1, x0[..., None]).squeeze(-1)
            row[name] = {
                "never_mass": float(x0_hat[..., never].sum(-1).mean()),
                "last_step_ce": float(-truth.log2().mean()),
                "never_drawn": float(q[..., never].sum(-1).mean()),
            }
        out.append(row)
    return out


def restored(row: dict) -> dict:
    """A row read back from a results JSON with its non-finite figures as floats again: the
    strings of files written before ``study.write`` (``"Infinity"``, ``"NaN"``) and the nulls
    named in ``infinite`` (a standard error NaN, any other figure infinite)."""
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            value = restored(value)
        elif isinstance(value, list):
            value = [restored(v) if isinstance(v, dict) else v for v in value]
        elif isinstance(value, str) and value in ("Infinity", "-Infinity", "NaN"):
            value = float(value)
        elif value is None and key in row.get("infinite", []):
            value = math.nan if key.endswith("_se") else math.inf
        out[key] = value
    out.pop("infinite", None)
    return out


def reused_rows(path: Path, recipes: list[str]) -> list[dict]:
    """The rows of ``recipes`` in the results JSON ``path``, each with ``reused``: the commits
    it was measured at."""
    record = json.loads(path.read_text())
    return [restored(r) | {"reused": record["commits"]} for r in record["rows"]
            if r["recipe"] in recipes]  # fmt: skip


def reused_checks(path: Path, recipes: list[str]) -> dict:
    """The last-step checks of ``recipes``' models in the results JSON ``path`` (finite
    figures), so a doc that reuses the uniform rows keeps the table that explains them."""
    checks = json.loads(path.read_text()).get("last_step_check", {})
    return {name: c for name, c in checks.items() if name.removeprefix("chars-") in recipes}


def cell(mean: float, se: float, digits: int = 3) -> str:
    """mean ± SE (inf where a set was infinite)."""
    if math.isinf(mean):
        return "inf"
    return f"{mean:.{digits}f}" + ("" if math.isnan(se) else f" ± {se:.{digits}f}")


def markdown(report: dict) -> str:
    n, k = report["samples"], report["sets"]
    lines = [
        f"{k} sample sets of {n} sequences of 128 characters per row (seeds 0..{k - 1}), whole "
        "canvases; mean ± SE over the sets. The bound: on 256 exact samples, 4 draws of t each, "
        "minus the world's NLL of the same sequences (± SE over 8 groups of 32).",
        "",
        "| model | train steps | bound excess (bits/char) | sampler | last step | steps | KL rate "
        "| KL floor | KL − floor | KL, possible samples | forbidden pairs | impossible samples | "
        "NLL under truth (entropy rate) | token entropy (exact samples') |",
        "|" + "---|" * 14,
    ]
    reused = sorted({c[:7] for r in report["rows"] for c in r.get("reused", [])})
    if reused:
        lines[1:1] = ["", f"Rows marked (reused) are carried over as measured at "
                      f"{', '.join(reused)}."]  # fmt: skip
    for r in report["rows"]:
        b = r["bound"]
        gap = "inf" if math.isinf(r["kl_rate"]) else f"{r['kl_rate'] - r['kl_floor']:.4f}"
        cells = [
            r["recipe"] + (" (reused)" if r.get("reused") else ""), r["train_steps"], cell(b["excess_bits"], b["excess_se"]), r["sampler"],
            r["last_step"], r["steps"], cell(r["kl_rate"], r["kl_rate_se"], 4),
            f"{r['kl_floor']:.4f}", gap, cell(r["kl_rate_possible"], r["kl_rate_possible_se"], 4),
            f"{r['forbidden_pairs']:.5f}", f"{r['violation_rate']:.3f}",
            f"{cell(r['nll_truth'], r['nll_truth_se'])} ({r['entropy_rate']:.3f})",
            f"{cell(r['entropy'], r['entropy_se'])} ({r['entropy_exact']:.3f})",
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    for name, checks in report["last_step_check"].items():
        lines += ["", f"**The last step on exact noised sequences ({name} beside its oracle).** "
                  "128 exact sequences corrupted to t = 1/steps; per position q(x_0 | x_t, x0_hat).",
                  "", "| steps | t | α | x0_hat mass on never-emitted tokens | last-step CE of the "
                  "truth, model / oracle (bits/token) | chance of drawing a never-emitted token |",
                  "|" + "---|" * 6]  # fmt: skip
        for c in checks:
            m, o = c["model"], c["oracle"]
            lines.append(f"| {c['steps']} | {c['t']:.4f} | {c['alpha']:.4f} | "
                         f"{m['never_mass']:.2e} | {m['last_step_ce']:.4f} / "
                         f"{o['last_step_ce']:.4f} | {m['never_drawn']:.2e} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def specs_of(found: dict) -> list[dict]:
    """One evaluation spec per finished job: its checkpoint and the row fields it carries."""
    specs = []
    for row in study.rows(found):
        recipe = row["overrides"].get("recipe") or row["overrides"].get("process")
        fields = {"recipe": recipe, "train_steps": row["steps"]}
        ckpt = str(Path(row["folder"]) / "model.safetensors")
        specs.append({"name": f"chars-{recipe}", "ckpt": ckpt, "row": fields})
    return specs


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweeps", type=Path, nargs="*", help="the study's sweep folders")
    p.add_argument("--evaluated", type=Path, default=Path("multirun/duo_last_step_evaluated"))
    p.add_argument("--samples", type=int, default=64, help="sequences per sample set")
    p.add_argument("--sets", type=int, default=3, help="independent sample sets per row")
    p.add_argument("--bound-sequences", type=int, default=256)
    p.add_argument("--bound-draws", type=int, default=4)
    p.add_argument("--results", type=Path, default=study.RESULTS, help="where the doc goes")
    p.add_argument("--reuse", nargs="+", metavar=("JSON", "RECIPE"),
                   help="an earlier results JSON and the recipes whose rows to carry over")  # fmt: skip
    p.add_argument("--evaluate-one", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


OPTIONS = ("samples", "sets", "bound_sequences", "bound_draws")


def main() -> None:
    args = parse()
    if args.evaluate_one:  # a child of main
        rows = evaluate_one(json.loads(args.evaluate_one), args)
        args.out.write_text(json.dumps(rows, indent=1, default=str) + "\n")
        return
    os.environ |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    found = study.table(*args.sweeps)
    options = [x for o in OPTIONS for x in (f"--{o.replace('_', '-')}", str(getattr(args, o)))]
    specs = specs_of(found)
    rows = study.evaluate_children(Path(__file__), specs, args.evaluated, 1, options)
    checks = {s["name"]: c for s in specs if (c := last_step_check(s))}
    if args.reuse:
        rows += reused_rows(Path(args.reuse[0]), args.reuse[1:])
        checks = reused_checks(Path(args.reuse[0]), args.reuse[1:]) | checks
    report = {"samples": args.samples, "sets": args.sets, "rows": rows, "jobs": study.rows(found),
              "last_step_check": checks}  # fmt: skip
    print(publish(report, markdown(report), sys.argv[1:], found, args.results).read_text())


def publish(report: dict, body: str, argv: list[str], found: dict, folder: Path) -> Path:
    """The results doc and JSON through ``study.write``, whose one convention writes an
    infinite KL rate (a sample the world cannot make) as null and names it in ``infinite``.
    The training command sweeps the recipes this run trained (all three unless rows were
    reused); ``argv``: this script's arguments."""
    trained = sorted({r["recipe"] for r in report["rows"] if not r.get("reused")})
    sweep = "" if len(trained) == 3 else f" hydra.sweeper.params.recipe={trained[0]}"
    if len(trained) == 2:  # Hydra reads a comma list here only as one quoted string
        sweep = f""" 'hydra.sweeper.params.recipe="{",".join(trained)}"'"""
    commands = [
        f"cdlm-train -m experiment=duo_last_step{sweep} hydra/launcher=joblib "
        "hydra.launcher.n_jobs=1",
        "python experiments/duo_last_step.py " + " ".join(argv),
    ]
    title = "Duo's learned rows with the drawn last step"
    return study.write("duo_last_step", title, body, report, commands, found, folder)


if __name__ == "__main__":
    main()
