"""Every sampler on the exact denoiser of known worlds: docs/results/worlds.md and docs/results/worlds.json.

    python experiments/worlds.py --out docs/results/worlds            # the table (~30 min, 2 jobs)
    python experiments/worlds.py --quick --out /tmp/worlds    # a minute: fewer rows and samples
    python experiments/worlds.py --world world:chars@128 --only Duo --jobs 1 --out /tmp/duo
                                                              # some rows only (docs/results/duo.md)
    python experiments/worlds.py --only exact-k --out docs/results/worlds   # these rows, merged in

Each world (``cdlm.worlds``: the Austen character chain at T = 128 and 256, the agreement world)
is loaded as an oracle model of every process (``cdlm.model_file.oracle_model``: the network is
the world's exact posterior), and every sampler family draws ``--samples`` sequences at steps
T/64, T/32, ..., T. The world scores them exactly (``cdlm.evaluation.world_score``): NLL under
the truth beside the entropy rate, Tang et al.'s transition-level KL and TV rates beside their
floor on as many exact samples, the share of impossible samples and of broken constraints. With
a perfect denoiser, every gap to the floor is the sampler's. Worlds run in ``--jobs`` processes
of one CPU thread each (recorded in the JSON as ``parallel_runs``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from cdlm import worlds
from cdlm.configs import compose
from cdlm.evaluation.world_score import score_samples
from cdlm.generation import Plan, named_sampler
from cdlm.generation.generate import generate
from cdlm.io import atomic_write_text
from cdlm.model_file import oracle_model

WORLDS = [("world:chars", 256), ("world:chars", 128), ("world:agreement", 128)]
END = "<!-- end measured -->"  # prose after it survives regeneration
GROUPS = ("token", "gaussian")  # each world's rows in two work units, the longest first
FLOOR_REPEATS = 8  # exact sample sets behind each floor
# label -> conf/process name and overrides; block_unshifted: BD3-LM's own layout; block_blind:
# the shifted layout before issue 51, blind to a block's last token once it is revealed
PROCESSES = {
    "masked": ["process=masked"],
    "block": ["process=block"],
    "block_unshifted": ["process=block", "process.shift=false", "process.causal_clean=false",
                        "process.ar_weight=0"],
    "block_blind": ["process=block", "process.sees_last=false"],
    "gaussian": ["process=gaussian"],
    "autoregressive": ["process=autoregressive"],
    "uniform": ["process=uniform"],
}  # fmt: skip


def families(length: int) -> list[tuple[str, str, str, dict, list[int] | None]]:
    """(label, process, conf/sampler name, options, step counts or None for every count)."""
    semi = length // 8
    duo = [length // 16, length // 4, length]  # every step revises every position: costly
    return [
        ("MDLM ancestral", "masked", "ancestral", {}, None),
        ("LLaDA low-confidence (T=1)", "masked", "confidence", {"rule": {"temperature": 1.0}}, None),
        ("threshold 0.9 (T=1)", "masked", "threshold", {"rule": {"temperature": 1.0}}, None),
        ("entropy-bounded (T=1)", "masked", "entropy_bounded", {"rule": {"temperature": 1.0}}, None),
        (f"semi-AR ancestral, blocks of {semi}", "masked", "ancestral", {"block_length": semi},
         [s for s in steps_of(length) if s >= 8]),
        ("ancestral, blocks of 1 (left to right)", "masked", "ancestral", {"block_length": 1},
         [length]),
        ("block diffusion (size 4, shifted: the default)", "block", "block", {}, None),
        ("block diffusion (size 4, unshifted)", "block_unshifted", "block", {}, None),
        ("block diffusion (size 4, shifted, blind to its last token)", "block_blind", "block", {},
         None),
        ("speculative (oracle draft and verifier)", "block", "speculative", {}, [length]),
        ("DDPM", "gaussian", "ddpm", {}, None),
        ("DDIM (probability-flow ODE)", "gaussian", "ddim", {}, None),
        ("DPM-Solver++(2M)", "gaussian", "dpmpp_2m", {}, None),
        ("Heun", "gaussian", "heun", {}, None),
        ("SDE (Euler-Maruyama)", "gaussian", "euler_maruyama", {}, None),
        ("rolling", "gaussian", "rolling", {}, None),
        ("AR", "autoregressive", "ar", {}, [length]),
        ("Duo ancestral (last step drawn)", "uniform", "duo_ancestral", {}, duo),
        ("Duo ancestral (greedy last step)", "uniform", "duo_ancestral", {"last_step": "greedy"},
         duo),
        ("Duo Psi (ReMDM 0.01, last step drawn)", "uniform", "duo_psi", {}, duo),
        ("Duo Psi (ReMDM 0.01, greedy last step)", "uniform", "duo_psi", {"last_step": "greedy"},
         duo),
        *exact_k_families(length),
    ]  # fmt: skip


EXACT_K = "cdlm.samplers.rules.ExactK"


def exact_k_families(length: int) -> list[tuple[str, str, str, dict, list[int] | None]]:
    """The exact-k rule (issue 51) at k = 1, 2, 4 on the masked oracle and both block layouts
    (size 4), at the fewest steps that let it commit exactly k per step."""
    out = []
    for k in (1, 2, 4):
        rule = {"rule": {"_target_": EXACT_K, "k": k}}
        per_block = length // 4 * math.ceil(4 / k)  # a block of 4 in ceil(4 / k) steps
        out += [
            (f"exact-k, k={k}", "masked", "exact_k", rule, [math.ceil(length / k)]),
            (f"exact-k, k={k}, block (shifted)", "block", "block", rule, [per_block]),
            (f"exact-k, k={k}, block (unshifted)", "block_unshifted", "block", rule, [per_block]),
        ]
    return out


def rule_fields(options: dict) -> dict:
    """The exact-k rows' ``rule`` and ``k``; other rows record neither."""
    rule = options.get("rule", {})
    return {"rule": "exact_k", "k": rule["k"]} if rule.get("_target_") == EXACT_K else {}


def steps_of(length: int) -> list[int]:
    """T/64, T/32, ..., T (at least 1)."""
    return sorted({max(1, length >> k) for k in range(7)})


def finite(x):
    """JSON has no infinity: non-finite figures as strings."""
    return x if not isinstance(x, float) or math.isfinite(x) else str(x)


def run_world(
    spec: str,
    length: int,
    group: str,
    samples: int,
    quick: bool,
    only: str | None = None,
    steps_only: list[int] | None = None,
) -> dict:
    """The rows of one world whose process is in ``group`` ("token" or "gaussian"), in one
    process of one thread; ``only``: the samplers whose label holds it; ``steps_only``: those
    step counts."""
    torch.set_num_threads(1)
    cpu = time.process_time()
    world = worlds.load(spec, length=length)
    models = {p: oracle_model(world, compose("train", o).process) for p, o in PROCESSES.items()}
    reference = world.transition_reference(length)
    rows = []
    for label, process, name, options, counts in families(length):
        if (process == "gaussian") != (group == "gaussian") or (only and only not in label):
            continue
        for steps in counts or steps_of(length):
            if quick and steps not in (max(1, length // 16), length):
                continue
            if steps_only and steps not in steps_only:
                continue
            plan = Plan(num_samples=samples, seq_len=length, steps=steps, seed=0, cut_at_eos=False)
            start = time.perf_counter()
            gen = generate(models[process], named_sampler(name, **options), plan)
            wall = time.perf_counter() - start
            tokens = torch.tensor([s.token_ids for s in gen.samples])
            floor_draws = torch.Generator().manual_seed(1)
            score = score_samples(
                world,
                tokens,
                floor_repeats=FLOOR_REPEATS,
                generator=floor_draws,
                reference=reference,
            )
            rows.append(
                {
                    "world": world.name,
                    "length": length,
                    "process": process,
                    "model": "oracle",
                    "sampler": label,
                    "sampler_name": name,
                    "options": options,
                    **rule_fields(options),
                    "steps": steps,
                    "nfe": gen.nfe,
                    "tokens_per_call": length / gen.nfe,
                    "positions": gen.positions,
                    "wall_seconds": wall,
                }
                | {k: finite(v) for k, v in score.items()}
            )
            print(f"{spec}@{length} {label} steps={steps}: nfe={gen.nfe} "
                  f"kl={score['kl_rate']:.4f} (floor {score['kl_floor']:.4f}) "
                  f"viol={score['violation_rate']:.3f} {wall:.1f}s", flush=True)  # fmt: skip
    facts = world.describe() | {"samples": samples}
    cpu = time.process_time() - cpu
    return {"key": f"{world.name}@{length}", "facts": facts, "rows": rows, "cpu_seconds": cpu}


def spread(row: dict) -> float:
    """One exact sample set's standard error of the KL rate: the estimator's standard
    deviation over the FLOOR_REPEATS exact sets (``kl_floor_se`` is their mean's)."""
    return row["kl_floor_se"] * math.sqrt(FLOOR_REPEATS)


def at_floor(row: dict, z: float = 2.0) -> bool:
    """KL rate within z standard errors of exact samples' (``spread``), no impossible
    sample."""
    kl = row["kl_rate"]
    if isinstance(kl, str) or row["violation_rate"] > 0:
        return False
    return kl <= row["kl_floor"] + z * max(spread(row), 1e-12)


def fmt(x, digits: int = 3) -> str:
    return x if isinstance(x, str) else f"{x:.{digits}f}"


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| sampler | steps | NFE | tokens/call | NLL (bits) | KL rate (bits) | TV rate | "
        "impossible | constraint broken | distinct-2 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = " ✓" if at_floor(r) else ""
        lines.append(
            f"| {r['sampler']} | {r['steps']} | {r['nfe']} | {r['tokens_per_call']:.2f} | "
            f"{fmt(r['nll_truth'])} | {fmt(r['kl_rate'], 4)}{mark} | {fmt(r['tv_rate'])} | "
            f"{r['violation_rate']:.3f} | {r['constraint_rate']:.4f} | {r['distinct_2']:.3f} |"
        )
    return lines


def first_at_floor(rows: list[dict]) -> dict[str, int | None]:
    """Per sampler family, the fewest steps whose row is at the floor (None: never)."""
    out: dict[str, int | None] = {}
    for r in rows:
        out.setdefault(r["sampler"], None)
        if at_floor(r) and (out[r["sampler"]] is None or r["steps"] < out[r["sampler"]]):
            out[r["sampler"]] = r["steps"]
    return out


def equal_nfe(rows: list[dict]) -> list[str]:
    """At each NFE, the best token-process row against the best gaussian one (lowest KL rate;
    rows with an impossible sample are not candidates)."""
    lines = [
        "| NFE | best masked/block sampler | its KL rate | best gaussian sampler | its KL rate |",
        "|---|---|---|---|---|",
    ]
    for nfe in sorted({r["nfe"] for r in rows}):
        best = []
        for gaussian in (False, True):
            side = [
                r
                for r in rows
                if r["nfe"] == nfe
                and (r["process"] == "gaussian") == gaussian
                and r["process"] != "autoregressive"
                and not isinstance(r["kl_rate"], str)
                and r["violation_rate"] == 0
            ]
            best.append(min(side, key=lambda r: r["kl_rate"]) if side else None)
        if None in best:
            continue
        (t, g) = best
        lines.append(
            f"| {nfe} | {t['sampler']} | {t['kl_rate']:.4f} | {g['sampler']} | {g['kl_rate']:.4f} |"
        )
    return lines


def predicted_disagreement(rows: list[dict], facts: dict) -> list[str]:
    """MDLM ancestral on the agreement world: each position is revealed at an independent
    uniform step of s, both ends of a segment at the same one with probability 1/s, and then
    they disagree with probability 1 - 1/names (the filler says nothing of the name)."""
    segments = facts["samples"] * (facts["length"] // facts["period"])
    lines = [
        "| steps | segments broken (measured ± SE) | (1 - 1/names) / steps |",
        "|---|---|---|",
    ]
    for r in rows:
        if r["sampler"] == "MDLM ancestral":
            predicted = (1 - 1 / facts["names"]) / r["steps"]
            p = r["constraint_rate"]
            se = math.sqrt(max(p * (1 - p), 1e-12) / segments)
            lines.append(f"| {r['steps']} | {p:.4f} ± {se:.4f} | {predicted:.4f} |")
    return lines


def render(result: dict) -> str:
    """docs/results/worlds.md's measured part, from the JSON."""
    lines = [
        "<!-- measured: written by experiments/worlds.py from docs/results/worlds.json -->",
        "",
        f"One run: {result['wall_minutes']:.1f} minutes of wall clock, "
        f"{result['cpu_minutes']:.1f} CPU minutes, in {result['parallel_runs']} processes of one "
        "thread each.",
        *(
            f"The rows labelled '{x['only']}' rerun alone (`--only {x['only']!r}"
            f"{' ' + x['where'] if x.get('where') else ''}`): "
            f"{x['wall_minutes']:.1f} minutes of wall clock, {x['cpu_minutes']:.1f} CPU minutes."
            for x in result.get("reruns", [])
        ),
        "",
    ]
    for key, facts in result["worlds"].items():
        rows = [r for r in result["rows"] if f"{r['world']}@{r['length']}" == key]
        if not rows:
            continue
        r0 = rows[0]
        lines += [
            f"### {key}",
            "",
            f"Entropy rate {r0['entropy_rate']:.4f} bits/token; exact samples' KL-rate floor "
            f"{r0['kl_floor']:.5f} bits (one set's SE {spread(r0):.5f}, the mean's "
            f"{r0['kl_floor_se']:.5f}), TV floor {r0['tv_floor']:.4f}; {facts['samples']} "
            f"samples a row, {facts['states']} states. ✓: KL rate within 2 SE of one exact set "
            "of the floor, and no impossible sample.",
            "",
            *table(rows),
            "",
            "Fewest steps at the floor: "
            + "; ".join(f"{k}: {v if v is not None else 'never'}" for k, v in first_at_floor(rows).items())
            + ".",
            "",
            "At equal NFE (rows with no impossible sample):",
            "",
            *equal_nfe(rows),
            "",
        ]  # fmt: skip
        if "names" in facts:
            lines += [
                "MDLM ancestral against the closed form for independent uniform reveal steps:",
                "",
                *predicted_disagreement(rows, facts),
                "",
            ]
    return "\n".join(lines)


def row_key(r: dict) -> tuple:
    return (r["world"], r["length"], r["sampler"], r["steps"])


def merged(result: dict, rows: list[dict], run: dict, only: str, where: str | None) -> dict:
    """``result`` with ``rows`` in place of its rows of the same world, label and step count
    (so ``--steps`` keeps the other counts), and the rerun recorded under ``reruns``."""
    redone = {row_key(r) for r in rows}
    kept = [r for r in result["rows"] if row_key(r) not in redone]
    rerun = {"only": only, "where": where}
    reruns = [x for x in result.get("reruns", []) if (x["only"], x.get("where")) != (only, where)]
    return result | {"rows": kept + rows, "reruns": [*reruns, rerun | run]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/results/worlds", help="writes OUT.json and OUT.md")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--jobs", type=int, default=2, help="worlds in parallel, 1 thread each")
    parser.add_argument("--quick", action="store_true", help="two step counts, for a smoke run")
    parser.add_argument("--render", action="store_true", help="redraw OUT.md from OUT.json")
    parser.add_argument("--only", help="rerun only the rows whose label contains ONLY, merged "
                        "into OUT.json (those labels' rows at the rerun step counts replaced)")  # fmt: skip
    parser.add_argument("--world", help="one world and length, e.g. world:chars@128")
    parser.add_argument("--steps", type=int, nargs="*", help="only these step counts")
    args = parser.parse_args()
    out = Path(args.out)
    if args.render:
        result = json.loads(out.with_suffix(".json").read_text())
    else:
        start = time.perf_counter()
        units = [
            (s, n, g, args.samples, args.quick, args.only, args.steps)
            for s, n in WORLDS
            for g in GROUPS
            if args.world in (None, f"{s}@{n}")
        ]
        with ProcessPoolExecutor(args.jobs) as pool:
            parts = list(pool.map(run_world, *zip(*units, strict=True)))
        run = {
            "cpu_minutes": sum(p["cpu_seconds"] for p in parts) / 60,
            "parallel_runs": args.jobs,
            "wall_minutes": (time.perf_counter() - start) / 60,
        }
        rows = [r for p in parts for r in p["rows"]]
        if args.only:
            where = " ".join(
                f"--{k} {v}"
                for k, v in (("world", args.world), ("steps", " ".join(map(str, args.steps or []))))
                if v
            )
            old = json.loads(out.with_suffix(".json").read_text())
            result = merged(old, rows, run, args.only, where or None)
        else:
            result = {"worlds": {p["key"]: p["facts"] for p in parts}, "rows": rows} | run
        atomic_write_text(out.with_suffix(".json"), json.dumps(result, indent=1) + "\n")
    md = out.with_suffix(".md")
    text = md.read_text() if md.exists() else "# Exact worlds\n\n"
    head = text.split("<!-- measured")[0].split(END)[0]
    tail = text.split(END, 1)[1] if END in text else "\n"
    atomic_write_text(md, head + render(result) + f"\n{END}{tail}")
    print(f"wrote {out.with_suffix('.json')} and {md}")


if __name__ == "__main__":
    main()
