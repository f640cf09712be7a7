"""Speed at exact quality (issue 51, item 6): docs/results/decoding.{md,json} from the learned
AR and block models of ``experiment=decoding`` and their worlds' oracles.

    cdlm-train -m experiment=decoding hydra/launcher=joblib hydra.launcher.n_jobs=1
    python experiments/decoding.py multirun/decoding --out docs/results/decoding

For each world, every decoder of the learned models draws ``--samples`` whole canvases at seed 0
(the block oracle: the decoders of ``ORACLE``, ``--oracle-samples`` canvases), scored by the
world: Tang et al.'s transition KL rate (bits per transition, ``world_score``) with its standard
error from a grouped jackknife over the sequences, and its floor (the same estimate on as many exact
samples). ``within_ar_band``: the KL rate is at most the learned AR model's plus two of its SEs
(at or below the band's top: lower is better); None for a row of another sample count.

Speed is for the learned models only (an oracle's call is the world's posterior, not a
network): every decoder at batch 1 and 16, ``--repeats`` timed runs of each after a warm-up,
interleaved (repeat r of every decoder and batch runs before repeat r + 1 of any), so the
shared cores' load hits AR and diffusion alike. Tokens/s is min / median / max over the
repeats; its ratio to AR is per repeat (paired), with min / median / max. Tokens per call is
the canvas length over the network calls, averaged over the runs (seeds 0..repeats). The
oracle's speculative tokens per call at batch 1 over the same seeds is the drafter's ceiling.
The decode-overhead rows (``loop``, ``batch``, ``loop_over_bare``) come from
docs/results/decode_overhead.json, which scripts/decode_overhead.py writes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import study
import torch

EXACT_K = "cdlm.samplers.rules.ExactK"
LN2 = math.log(2)
AR = "autoregressive"
FILL = {"stop_at_eos": False}  # whole canvases: the worlds never end a sequence


@dataclass(frozen=True)
class Decoder:
    """One way to decode a model: its label, ``conf/sampler/<sampler>.yaml`` with ``options``,
    and its steps as a share of the canvas (1.0: one step per token)."""

    label: str
    sampler: str
    options: dict = field(default_factory=dict)
    per_token: float = 1.0

    def steps(self, length: int) -> int:
        return max(1, round(length * self.per_token))

    def build(self):
        from cdlm.generation import named_sampler

        return named_sampler(self.sampler, **(FILL | self.options))


DECODERS = {
    AR: [Decoder("ar", "ar")],
    "block": [
        Decoder("block ancestral, 1 step/token", "block"),
        Decoder("exact_k k=1", "block", {"rule": {"_target_": EXACT_K, "k": 1}}),
        Decoder("exact_k k=2", "block", {"rule": {"_target_": EXACT_K, "k": 2}}, 0.5),
        Decoder("block ancestral, 1 step/block", "block", {}, 0.25),
        Decoder("speculative", "speculative"),
    ],
}
# an oracle's call is the world's exact posterior, which costs seconds at V = 2,048: its rows
# are the decoders whose error an exact denoiser still shows (parallel commits) and the drafter
ORACLE = ("exact_k k=2", "block ancestral, 1 step/block", "speculative")
BATCHES = (1, 16)


def kl_with_se(world, tokens: torch.Tensor, groups: int, seed: int = 0) -> dict:
    """The world's scores of ``tokens`` (N, L) and the KL rate's SE by a grouped jackknife over
    the sequences (leave one of ``groups`` groups out). A bootstrap reads the plug-in KL's SE
    2.5x too high here: its duplicated sequences change the estimator's bias from draw to draw.
    The jackknife reads ~1.5x the spread over independent sample sets (conservative: it widens
    AR's band; tests/test_studies.py checks it within 2x)."""
    from cdlm.evaluation.world_score import score_samples, transition_rates

    reference = world.transition_reference(tokens.shape[1])
    score = score_samples(world, tokens, generator=torch.Generator().manual_seed(seed),
                          reference=reference)  # fmt: skip
    # over the samples the world can make (a learned model's rare impossible pair makes the
    # rate over all of them infinite; violation_rate counts those apart), as worlds_learned does
    tokens = tokens[torch.isfinite(world.log_prob(tokens))]
    parts = torch.arange(tokens.shape[0]) % min(groups, tokens.shape[0])
    g = int(parts.max()) + 1
    loo = [transition_rates(tokens[parts != k], reference).kl / LN2 for k in range(g)]
    mean = statistics.mean(loo)
    se = math.sqrt((g - 1) / g * sum((x - mean) ** 2 for x in loo))
    keep = ("kl_floor", "kl_floor_se", "violation_rate", "nll_truth", "entropy_rate")
    return {k: score[k] for k in keep} | {
        "kl_rate": score["kl_rate_possible"],
        "kl_rate_all": score["kl_rate"],
        "kl_rate_se": se,
    }


def quality(model, decoder: Decoder, world, samples: int, draws: int) -> dict:
    from cdlm.generation import Plan, generate

    plan = Plan(num_samples=samples, seq_len=world.length, steps=decoder.steps(world.length),
                seed=0, cut_at_eos=False)  # fmt: skip
    gen = generate(model, decoder.build(), plan)
    return kl_with_se(world, torch.tensor([s.token_ids for s in gen.samples]), draws)


def run_once(model, decoder: Decoder, length: int, batch: int, seed: int) -> tuple[float, float]:
    """(seconds, tokens per call) of one decode of ``batch`` canvases."""
    from cdlm.generation import Plan, generate

    plan = Plan(num_samples=batch, seq_len=length, steps=decoder.steps(length), seed=seed,
                cut_at_eos=False)  # fmt: skip
    start = time.perf_counter()
    gen = generate(model, decoder.build(), plan)
    return time.perf_counter() - start, length / gen.nfe


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def timings(models: dict, length: int, repeats: int) -> dict:
    """(process, label, batch) -> seconds per repeat and tokens per call, interleaved."""
    runs = [(p, d, b) for p in models for d in DECODERS[p] for b in BATCHES]
    out = {(p, d.label, b): {"seconds": [], "per_call": []} for p, d, b in runs}
    for rep in range(repeats + 1):  # rep 0: the warm-up, its time not kept
        for p, d, b in runs:
            seconds, per_call = run_once(models[p], d, length, b, rep)
            out[(p, d.label, b)]["per_call"].append(per_call)
            if rep:
                out[(p, d.label, b)]["seconds"].append(seconds)
        print(f"  timing repeat {rep} done, load {os.getloadavg()[0]:.1f}", flush=True)
    return out


def row_base(world, who: str, process: str, d: Decoder, n: int, args, model) -> dict:
    scored = quality(model, d, world, n, args.groups) | {"samples": n}
    print(f"{world.name} {who} {process} {d.label}: {scored}", flush=True)
    return {"world": world.name, "process": process, "model": who, "sampler": d.label,
            "steps": d.steps(world.length)} | scored  # fmt: skip


def learned_rows(ckpts: dict[str, str], args) -> list[dict]:
    """One world's learned AR and block models: timings (interleaved) and scored samples."""
    from cdlm import worlds
    from cdlm.model_file import load_model

    learned = {p: load_model(ckpts[p]) for p in (AR, "block")}
    world = worlds.recorded(learned[AR].config)
    length = world.length
    timed = timings(learned, length, args.repeats)
    ar_seconds = timed[(AR, "ar", 1)]["seconds"], timed[(AR, "ar", 16)]["seconds"]
    rows = []
    for p, model in learned.items():
        for d in DECODERS[p]:
            base = row_base(world, "learned", p, d, args.samples, args, model)
            for i, b in enumerate(BATCHES):
                t = timed[(p, d.label, b)]
                rate = spread([b * length / s for s in t["seconds"]])
                ratio = [a / s for a, s in zip(ar_seconds[i], t["seconds"], strict=True)]
                rows.append(base | {"batch": b, "tokens_per_s": rate,
                                    "tokens_per_s_median": rate["median"],
                                    "tokens_per_call": statistics.mean(t["per_call"]),
                                    "speed_over_ar": spread(ratio)})  # fmt: skip
    return rows


def oracle_rows(world_name: str, args) -> list[dict]:
    """The block oracle of ``cdlm-sample ckpt=<world> process=block`` (the learned model's
    layout: the configs' defaults): the ``ORACLE`` decoders' scored samples at batch 1 and the
    drafter's ceiling, speculative tokens per call at batch 1 over seeds 0..repeats. No speed:
    an oracle's call is the world's posterior, not a network."""
    from cdlm import worlds
    from cdlm.configs import compose
    from cdlm.world_model import oracle_model

    world = worlds.load(world_name)
    process = compose("sample", ["process=block", f"ckpt={world_name}"]).process
    oracle = oracle_model(world, process)
    none = {"batch": 1, "tokens_per_s_median": None, "tokens_per_call": None}
    rows = [row_base(world, "oracle", "block", d, args.oracle_samples, args, oracle) | none
            for d in DECODERS["block"] if d.label in ORACLE]  # fmt: skip
    ceiling = [run_once(oracle, DECODERS["block"][-1], world.length, 1, s)[1]
               for s in range(args.repeats + 1)]  # fmt: skip
    rows[-1] |= {"tokens_per_call": statistics.mean(ceiling), "drafter_ceiling": True,
                 "tokens_per_call_se": statistics.stdev(ceiling) / len(ceiling) ** 0.5}  # fmt: skip
    return rows


def mark_band(rows: list[dict]) -> None:
    """``within_ar_band`` of one world's rows: KL rate <= the learned AR row's + 2 of its SEs.
    A plug-in KL grows as the sample count falls, so a row of another count gets None."""
    ar = next(r for r in rows if r["model"] == "learned" and r["process"] == AR)
    top = ar["kl_rate"] + 2 * ar["kl_rate_se"]
    for row in rows:
        near = row["samples"] == ar["samples"]
        row["within_ar_band"] = bool(row["kl_rate"] <= top) if near else None


def goals(rows: list[dict]) -> list[dict]:
    """Issue 51's goals in each world: the fastest learned diffusion row at batch 1 within AR's
    band at >= 2x AR's tokens/s, and the learned speculative tokens per call >= 0.8x the oracle
    drafter's (the goals name the low-entropy world; chars is beside it)."""
    out = []
    for w in dict.fromkeys(r["world"] for r in rows):
        mine = [r for r in rows if r["world"] == w and r["batch"] == 1]
        diffusion = [r for r in mine if r["model"] == "learned" and r["process"] != AR]
        band = [r for r in diffusion if r["within_ar_band"]]
        best = max(band, key=lambda r: r["speed_over_ar"]["median"], default=None)
        fastest = max(diffusion, key=lambda r: r["speed_over_ar"]["median"])
        spec = {r["model"]: r for r in mine if r["sampler"] == "speculative"}
        share = spec["learned"]["tokens_per_call"] / spec["oracle"]["tokens_per_call"]
        out.append({
            "world": w,
            "best_within_band": best and best["sampler"],
            "best_within_band_speed_over_ar": best and best["speed_over_ar"],
            "fastest": fastest["sampler"],
            "fastest_speed_over_ar": fastest["speed_over_ar"],
            "fastest_kl_rate": fastest["kl_rate"],
            "speed_goal_met": bool(best and best["speed_over_ar"]["median"] >= 2),
            "speculative_tokens_per_call": spec["learned"]["tokens_per_call"],
            "drafter_ceiling": spec["oracle"]["tokens_per_call"],
            "share_of_ceiling": share,
            "ceiling_goal_met": share >= 0.8,
        })  # fmt: skip
    return out


def overhead_rows(path: Path) -> list[dict]:
    """The decode-overhead rows of scripts/decode_overhead.py's runs (each with its run)."""
    runs = json.loads(path.read_text())["runs"]
    keep = ("loop", "batch", "loop_over_bare", "vocab", "seq_len")
    return [{k: r[k] for k in keep} | {"run": name} for name, run in runs.items()
            for r in run["rows"]]  # fmt: skip


def mmm(d: dict | None, digits: int = 0) -> str:
    if not d:
        return "-"
    return " / ".join(f"{d[k]:.{digits}f}" for k in ("min", "median", "max"))


def markdown(rows: list[dict], found_goals: list[dict]) -> str:
    cells = [
        [r["world"], r["model"], r["process"], r["sampler"], r["steps"], r["batch"],
         mmm(r.get("tokens_per_s")), mmm(r.get("speed_over_ar"), 2), study.fmt(r["tokens_per_call"]),
         f"{r['kl_rate']:.4f} ± {r['kl_rate_se']:.4f}", f"{r['kl_floor']:.4f}",
         f"{r['violation_rate']:.3f}", r["samples"],
         {True: "yes", False: "no", None: "-"}[r["within_ar_band"]]]
        for r in rows
    ]  # fmt: skip
    columns = ["world", "model", "process", "sampler", "steps", "batch",
               "tokens/s min / median / max", "× AR min / median / max", "tokens/call",
               "KL rate ± SE (bits)", "KL floor", "violations", "samples", "within AR band"]  # fmt: skip
    text = study.markdown_table(columns, cells) + "\n### Goals (batch 1)\n\n"
    for g in found_goals:
        best = g["best_within_band"]
        text += (
            f"- {g['world']}: fastest learned diffusion row within AR's band: "
            + (f"{best} at {mmm(g['best_within_band_speed_over_ar'], 2)}× AR" if best else "none")
            + f" (goal ≥ 2×: {'met' if g['speed_goal_met'] else 'missed'}); fastest overall: "
            f"{g['fastest']} at {mmm(g['fastest_speed_over_ar'], 2)}× AR, KL "
            f"{g['fastest_kl_rate']:.4f}. Speculative: {g['speculative_tokens_per_call']:.2f} "
            f"tokens/call against the oracle drafter's {g['drafter_ceiling']:.2f} "
            f"({g['share_of_ceiling']:.2f}×; goal ≥ 0.8×: "
            f"{'met' if g['ceiling_goal_met'] else 'missed'}).\n"
        )
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", type=Path, help="experiment=decoding sweep folders")
    parser.add_argument("--out", type=Path, default=study.RESULTS / "decoding")
    parser.add_argument("--samples", type=int, default=128, help="canvases scored per decoder")
    parser.add_argument("--oracle-samples", type=int, default=32, help="per oracle decoder")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per decoder and batch")
    parser.add_argument("--groups", type=int, default=32, help="jackknife groups of the KL's SE")
    parser.add_argument("--overhead", type=Path, default=study.RESULTS / "decode_overhead.json")
    parser.add_argument("--evaluated", type=Path, default=None,
                        help="each world's rows, kept (default: <first folder>/evaluated)")  # fmt: skip
    parser.add_argument("--evaluate-one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.evaluate_one:  # a child of study.evaluate_children: one world's learned or oracle rows
        spec = json.loads(args.evaluate_one)
        start = os.getloadavg()[0]
        if spec["kind"] == "oracle":
            rows = oracle_rows(spec["world"], args)
        else:
            rows = learned_rows(spec["ckpts"], args)
        load = {"load_average_start": start, "load_average_end": os.getloadavg()[0]}
        args.out.write_text(json.dumps([r | load for r in rows], indent=1))
        return
    found = study.table(*args.folders)
    ckpts: dict[str, dict[str, str]] = {}
    for r in study.rows(found):
        world = r["overrides"]["data.world"].replace("\\", "")
        ckpts.setdefault(world, {})[r["overrides"]["process"]] = f"{r['folder']}/model.safetensors"
    specs = [{"name": f"{w.replace(':', '_')}_{kind}", "world": w, "kind": kind, "ckpts": c}
             for w, c in ckpts.items() for kind in ("oracle", "learned")]  # fmt: skip
    options = [f"--{k}={getattr(args, k.replace('-', '_'))}"
               for k in ("samples", "oracle-samples", "repeats", "groups")]  # fmt: skip
    evaluated = args.evaluated or args.folders[0] / "evaluated"
    rows = study.evaluate_children(Path(__file__), specs, evaluated, 1, options)
    for w in dict.fromkeys(r["world"] for r in rows):
        mark_band([r for r in rows if r["world"] == w])
    found_goals = goals(rows)
    loads = {(r["world"], r["model"]): (r["load_average_start"], r["load_average_end"])
             for r in rows}  # fmt: skip
    said = ", ".join(f"{w} {m} {a:.1f} → {b:.1f}" for (w, m), (a, b) in loads.items())
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=study.ROOT,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    body = (
        f"Measured by experiments/decoding.py at `{head}`. "
        f"Load average (1 min) at the start and end of each world's learned and oracle rows: {said}, on 2 "
        "cores shared with other engineers' jobs; one thread. Tokens/s moves with that load: "
        "compare the paired × AR ratios, not absolute figures across runs.\n\n"
        + markdown(rows, found_goals)
    )
    payload = {"rows": rows, "goals": found_goals,
               "samples": args.samples, "repeats": args.repeats,
               "decode_overhead": overhead_rows(args.overhead)}  # fmt: skip
    command = f"python experiments/decoding.py {' '.join(map(str, args.folders))}"
    commands = ["cdlm-train -m experiment=decoding hydra/launcher=joblib hydra.launcher.n_jobs=1",
                command + f" --out {args.out}"]  # fmt: skip
    title = "Speed at exact quality: learned AR, block and speculative decoding"
    study.write(args.out.name, title, body, payload, commands, found, args.out.parent)
    print(markdown(rows, found_goals))


if __name__ == "__main__":
    main()
